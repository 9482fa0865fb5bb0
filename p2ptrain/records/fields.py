"""Field readers for records: each returns a value of its type within bounds, or raises WireError.

Written for anything `json.loads` can produce (bools that pass as ints, integers with hundreds of
digits, NaN, deep nesting), so a `from_dict` built from them is total: a valid record or the one
wire error, never another exception.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from p2ptrain.errors import WireError
from p2ptrain.records import multiaddrs

MAX_INT = 2**53  # what a JSON number can carry exactly into any reader
MAX_ID_CHARS = 64
MAX_ADDRS = 16
MAX_ADDR_CHARS = 256
MAX_PEERS = 1024  # peers named in one record
MAX_FREE_FORM_CHARS = 2048  # small free-form objects (hardware descriptions)
MAX_FREE_FORM_DEPTH = 4


def json_value(data: bytes | str, record: str) -> Any:
    """The JSON value of bytes off the wire; WireError if they are not UTF-8 JSON (nesting past
    Python's stack included)."""
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError and JSONDecodeError too
        raise malformed(record, f"not JSON: {str(exc)[:80]}") from None


def malformed(record: str, problem: str) -> WireError:
    return WireError(f"malformed {record}: {problem}")


def mapping(value: object, record: str) -> Mapping[str, Any]:
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise malformed(record, "not an object with string keys")
    return value


def require_keys(data: Mapping[str, Any], record: str, required: tuple[str, ...]) -> None:
    """Refuse a record that lacks a field. Unknown fields are ignored, so that a newer peer can
    add some; their size is bounded by the message's."""
    missing = [name for name in required if name not in data]
    if missing:
        raise malformed(record, f"missing field(s) {', '.join(missing)}")


def integer(value: object, record: str, name: str, low: int = 0, high: int = MAX_INT) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise malformed(record, f"{name} must be an integer in [{low}, {high}]")
    return value


def number(
    value: object, record: str, name: str, low: float = 0.0, high: float = math.inf
) -> float:
    """A finite number (int or float, not bool) in [low, high], as a float."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise malformed(record, f"{name} must be a number")
    if isinstance(value, int) and abs(value) > MAX_INT:
        raise malformed(record, f"{name} is out of range")
    result = float(value)
    if not math.isfinite(result) or not low <= result <= high:
        raise malformed(record, f"{name} must be a finite number in [{low}, {high}]")
    return result


def optional_number(value: object, record: str, name: str) -> float | None:
    return None if value is None else number(value, record, name)


def optional_integer(value: object, record: str, name: str) -> int | None:
    return None if value is None else integer(value, record, name)


def text(value: object, record: str, name: str, max_chars: int = MAX_ID_CHARS) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= max_chars or not value.isprintable():
        raise malformed(record, f"{name} must be 1..{max_chars} printable characters")
    return value


def boolean(value: object, record: str, name: str) -> bool:
    if not isinstance(value, bool):
        raise malformed(record, f"{name} must be true or false")
    return value


def peer_id(value: object, record: str, name: str = "peer id") -> str:
    """A peer id, or a worker's name in a static plan: 1..64 letters, digits, '_' or '-'."""
    if (
        not isinstance(value, str)
        or not 0 < len(value) <= MAX_ID_CHARS
        or not value.replace("_", "").replace("-", "").isalnum()
        or not value.isascii()
    ):
        raise malformed(record, f"{name} must be 1..{MAX_ID_CHARS} letters or digits")
    return value


def peer_ids(value: object, record: str, name: str, max_items: int = MAX_PEERS) -> tuple[str, ...]:
    if not isinstance(value, list) or len(value) > max_items:
        raise malformed(record, f"{name} must be a list of at most {max_items} peer ids")
    return tuple(peer_id(v, record, name) for v in value)


def addrs(value: object, record: str, name: str) -> tuple[str, ...]:
    """At most MAX_ADDRS multiaddrs, each checked (see multiaddr below)."""
    if not isinstance(value, list) or len(value) > MAX_ADDRS:
        raise malformed(record, f"{name} must be a list of at most {MAX_ADDRS} addresses")
    return tuple(multiaddr(a, record, name) for a in value)


def choice(value: object, record: str, name: str, allowed: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise malformed(record, f"{name} must be one of {', '.join(allowed)}")
    return value


def free_form(value: object, record: str, name: str) -> dict[str, Any]:
    """A small object of plain JSON values (descriptive only: nothing acts on its contents)."""
    if not _plain(value, MAX_FREE_FORM_DEPTH) or not isinstance(value, dict):
        raise malformed(record, f"{name} must be a small object of plain values")
    if len(repr(value)) > MAX_FREE_FORM_CHARS:
        raise malformed(record, f"{name} is larger than {MAX_FREE_FORM_CHARS} characters")
    return value


def _plain(value: object, depth: int) -> bool:
    if isinstance(value, str | bool) or value is None:
        return True
    if isinstance(value, int):
        return abs(value) <= MAX_INT
    if isinstance(value, float):
        return math.isfinite(value)
    if depth <= 0:
        return False
    if isinstance(value, list):
        return len(value) <= 64 and all(_plain(v, depth - 1) for v in value)
    if isinstance(value, dict):
        return len(value) <= 64 and all(
            isinstance(k, str) and _plain(v, depth - 1) for k, v in value.items()
        )
    return False


def multiaddr(value: object, record: str, name: str) -> str:
    """A multiaddr in its text form that both our dialers parse (multiaddrs.py): checked here,
    so that a garbage address never reaches (and crashes) a dialler."""
    text_value = text(value, record, name, MAX_ADDR_CHARS)
    problem = multiaddrs.problem(text_value)
    if problem is not None:
        raise malformed(record, f"{name}: {problem}")
    return text_value
