"""Every control-plane message that crosses the wire: signed envelopes and their schemas.

An envelope is one UTF-8 JSON object:
    {"v": 1, "kind": str, "author": peer id, "seq": int, "ts": float, "body": {...}, "sig": hex}
`sig` is the author's Ed25519 signature of the canonical JSON (sorted keys, no spaces) of the
envelope without `sig`; the author's public key is read out of its peer id, so no key exchange is
needed. `seq` grows per author and kind (time-based, so it keeps growing across restarts) and
defeats replays together with the `ts` window. Bodies are checked by one schema function per kind.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeGuard

from p2ptrain import identity
from p2ptrain.errors import UserError
from p2ptrain.records.run import RunSpec

WIRE_VERSION = 1
MAX_ENVELOPE_BYTES = 64 * 1024
MAX_CLOCK_SKEW_S = 30.0
MAX_PEERS_PER_MESSAGE = 1024
MAX_ADDRS = 16
MAX_ADDR_CHARS = 256
MAX_ID_CHARS = 64


class WireError(ValueError):
    """A message that must be dropped: malformed, oversized, unsigned, forged or stale.

    The message starts with its category (malformed, oversized, unsigned, forged, replayed, or
    stale: an honest message delivered too late, which is dropped without blame).
    """

    @property
    def category(self) -> str:
        return str(self).split(":", 1)[0].split(" ", 1)[0]


@dataclass(frozen=True)
class Envelope:
    """A verified message: who wrote it, which kind, its per-author sequence number and body."""

    kind: str
    author: str
    seq: int
    ts: float
    body: dict[str, Any]


class SeqClock:
    """Strictly increasing sequence numbers that survive restarts (microseconds since the epoch)."""

    def __init__(self) -> None:
        self._last = 0

    def next(self) -> int:
        self._last = max(self._last + 1, time.time_ns() // 1000)
        return self._last


def _canonical(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def encode(
    seed: bytes, kind: str, seq: int, body: dict[str, Any], ts: float | None = None
) -> bytes:
    """Sign and serialize a message; raises WireError if the result would be oversized."""
    unsigned = {
        "v": WIRE_VERSION,
        "kind": kind,
        "author": identity.peer_id_of(seed),
        "seq": seq,
        "ts": time.time() if ts is None else ts,
        "body": body,
    }
    payload = _canonical(unsigned)
    signed = dict(unsigned, sig=identity.sign(seed, payload).hex())
    data = _canonical(signed)
    if len(data) > MAX_ENVELOPE_BYTES:
        raise WireError(f"oversized: {kind} message of {len(data)} bytes > {MAX_ENVELOPE_BYTES}")
    return data


def decode(data: bytes, now: float | None = None, max_age_s: float = MAX_CLOCK_SKEW_S) -> Envelope:
    """Parse, size-check, signature-check and schema-check a message. Raises WireError.

    max_age_s: how old `ts` may be (gossip: 30 s; DHT records, re-put every minute: longer).
    """
    if len(data) > MAX_ENVELOPE_BYTES:
        raise WireError(f"oversized: {len(data)} bytes > {MAX_ENVELOPE_BYTES}")
    try:
        obj = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WireError(f"malformed: not JSON ({exc.__class__.__name__})") from exc
    if not isinstance(obj, dict):
        raise WireError("malformed: not an object")
    if obj.get("v") != WIRE_VERSION:
        raise WireError(f"malformed: unsupported version {obj.get('v')!r}")
    sig = obj.pop("sig", None)
    if not isinstance(sig, str):
        raise WireError("unsigned: no signature")
    kind, author, seq, ts, body = (obj.get(k) for k in ("kind", "author", "seq", "ts", "body"))
    if not isinstance(kind, str) or kind not in BODY_SCHEMAS:
        raise WireError(f"malformed: unknown kind {kind!r}")
    if not isinstance(author, str) or len(author) > MAX_ID_CHARS:
        raise WireError("malformed: bad author")
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
        raise WireError("malformed: bad seq")
    if not isinstance(ts, int | float) or not _is_number(ts) or not isinstance(body, dict):
        raise WireError("malformed: bad ts/body")
    if set(obj) != {"v", "kind", "author", "seq", "ts", "body"}:
        raise WireError("malformed: unexpected envelope fields")
    key = identity.public_key_of_peer_id(author)
    if key is None:
        raise WireError(f"forged: author {author[:16]}... has no Ed25519 key")
    try:
        signature = bytes.fromhex(sig)
    except ValueError as exc:
        raise WireError("unsigned: signature is not hex") from exc
    if not identity.verify(key, _canonical(obj), signature):
        raise WireError(f"forged: bad signature for author {author}")
    now = time.time() if now is None else now
    if now - ts > max_age_s:
        # gossip can deliver honest messages late (queues, new joiners): drop, do not blame
        raise WireError(f"stale: written {now - ts:.1f} s ago")
    if ts - now > MAX_CLOCK_SKEW_S:
        raise WireError(f"replayed or skewed: timestamp {ts - now:.1f} s in the future")
    problem = BODY_SCHEMAS[kind](body)
    if problem:
        raise WireError(f"malformed {kind}: {problem}")
    return Envelope(kind=kind, author=author, seq=seq, ts=ts, body=body)


# ---------------------------------------------------------------- body schemas (None = valid)


def _is_int(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: object) -> TypeGuard[float]:
    return (isinstance(v, int | float) and not isinstance(v, bool)) and math.isfinite(v)


def _is_peer_id(v: object) -> bool:
    return isinstance(v, str) and 0 < len(v) <= MAX_ID_CHARS and v.isalnum()


def is_addr_list(v: object) -> bool:
    """A list of at most MAX_ADDRS multiaddr strings."""
    return (
        isinstance(v, list)
        and len(v) <= MAX_ADDRS
        and all(isinstance(a, str) and 0 < len(a) <= MAX_ADDR_CHARS for a in v)
    )


def _optional_number(v: object) -> bool:
    return v is None or (_is_number(v) and v >= 0)


ROLES = ("trainer", "control-only", "bootstrap", "observer")


def check_peer_record(body: dict[str, Any]) -> str | None:
    """A peer announces itself: addresses, role, software, hardware, measured compute."""
    if not is_addr_list(body.get("addrs")) or not is_addr_list(body.get("data_addrs", [])):
        return "addrs must be lists of <= 16 strings"
    if body.get("role") not in ROLES:
        return f"role must be one of {ROLES}"
    if not isinstance(body.get("planner_capable"), bool):
        return "planner_capable must be a bool"
    if not isinstance(body.get("version"), str) or len(body["version"]) > 32:
        return "version must be a short string"
    hardware = body.get("hardware")
    if not isinstance(hardware, dict) or len(json.dumps(hardware)) > 2048:
        return "hardware must be a small object"
    if not _optional_number(body.get("compute_gflops")):
        return "compute_gflops must be a number >= 0 or null"
    return None


def check_telemetry(body: dict[str, Any]) -> str | None:
    """A peer's row of the link matrix: its own latest measurements to others, with ages."""
    links = body.get("links")
    if not isinstance(links, dict) or len(links) > MAX_PEERS_PER_MESSAGE:
        return "links must be an object of <= 1024 peers"
    for peer, link in links.items():
        if not _is_peer_id(peer) or not isinstance(link, dict):
            return "links must map peer ids to objects"
        for field in ("rtt_ms", "bandwidth_mbps", "rtt_age_s", "bandwidth_age_s"):
            if not _optional_number(link.get(field)):
                return f"{field} must be a number >= 0 or null"
    metrics = body.get("metrics")
    if metrics is not None and (not isinstance(metrics, dict) or len(json.dumps(metrics)) > 1024):
        return "metrics must be a small object or null"
    return None


def check_claim(body: dict[str, Any]) -> str | None:
    """A planner claims (and, re-broadcast, keeps) a term."""
    term = body.get("term")
    if not _is_int(term) or term < 1:
        return "term must be an integer >= 1"
    return None


def check_plan(body: dict[str, Any]) -> str | None:
    """A plan: (term, epoch), stages, pipelines and spares by peer id, data addresses, cost."""
    for field in ("term", "epoch", "stages"):
        if not _is_int(body.get(field)) or body[field] < 1:
            return f"{field} must be an integer >= 1"
    if not _is_peer_id(body.get("planner")):
        return "planner must be a peer id"
    pipelines, spares = body.get("pipelines"), body.get("spares")
    if not isinstance(pipelines, list) or not isinstance(spares, list):
        return "pipelines and spares must be lists"
    if not all(isinstance(p, list) and len(p) == body["stages"] for p in pipelines):
        return "every pipeline must list exactly `stages` peers"
    used = [peer for p in pipelines for peer in p] + spares
    if not all(_is_peer_id(p) for p in used) or len(used) > MAX_PEERS_PER_MESSAGE:
        return "pipelines/spares must hold peer ids"
    if len(set(used)) != len(used):
        return "a peer appears more than once"
    data_addrs = body.get("data_addrs")
    if not isinstance(data_addrs, dict) or not all(
        _is_peer_id(k) and is_addr_list(v) for k, v in data_addrs.items()
    ):
        return "data_addrs must map peer ids to address lists"
    if not _is_number(body.get("cost_s")) or body["cost_s"] < 0:
        return "cost_s must be a number >= 0"
    return None


def check_run(body: dict[str, Any]) -> str | None:
    """The run spec, published by the bootstrap node."""
    try:
        RunSpec.from_dict(body)
    except UserError as exc:
        return str(exc)
    return None


BODY_SCHEMAS: dict[str, Callable[[dict[str, Any]], str | None]] = {
    "run": check_run,
    "peer": check_peer_record,
    "telemetry": check_telemetry,
    "claim": check_claim,
    "plan": check_plan,
}
