"""Per-peer settings a topology file may carry beside its links ("cpu", "nat"): an object
{peer name or index: value}. Stdlib only."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from p2ptrain.errors import UserError

T = TypeVar("T")


def per_peer(
    path: str | Path, names: Sequence[str], field: str, shape: str, check: Callable[[Any], T]
) -> dict[int, T]:
    """The topology file's optional `field` object as {peer index: check(value)}; `shape` says
    what the object should look like in the error of one that is not an object."""
    try:
        doc: Any = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # not UTF-8 JSON, or nested past the stack
        return {}  # load_topology reports what is wrong with the file
    raw = doc.get(field) if isinstance(doc, dict) else None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise UserError(f"{path}: {field} must be an object {shape}")
    values: dict[int, T] = {}
    for key, value in raw.items():
        if key in names:
            index = list(names).index(key)
        elif key.isascii() and key.isdigit() and int(key) < len(names):
            index = int(key)
        else:
            raise UserError(f"{path}: {field} names no peer {key!r}")
        try:
            values[index] = check(value)
        except UserError as exc:
            raise UserError(f"{path}: {field} of {key!r}: {exc}") from None
    return values
