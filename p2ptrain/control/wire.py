"""Every control-plane message that crosses the wire: signed envelopes and their schemas.

An envelope is one UTF-8 JSON object:
    {"v": 1, "kind": str, "author": peer id, "seq": int, "ts": float, "run": str, "body": {...},
     "sig": hex}
`sig` is the author's Ed25519 signature of the canonical JSON (sorted keys, no spaces) of the
envelope without `sig`; the author's public key is read out of its peer id, so no key exchange is
needed. `seq` grows per author and kind (time-based, so it keeps growing across restarts) and
defeats replays together with the `ts` window. `run` is the run id the author signs for (absent
in envelopes of older peers and of a node that does not know its run yet): receivers drop an
envelope of another run, so one run's messages cannot be replayed into another run of the same
organiser. Bodies are checked by one schema function per kind.

Decoding is two steps, so that a receiver can refuse a message by its author and kind before
it parses the body: `verified_header` (size, JSON, header fields, signature, age) and `open_body`
(the kind's schema); `decode` does both. The last VERIFIED_HEADERS envelopes whose header and
signature passed are remembered by their exact bytes: a byte-identical copy (sync serves again
what gossip brought) is not parsed and checked again, only its age is; any other bytes are.
"""

from __future__ import annotations

import json
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeGuard

from p2ptrain import identity
from p2ptrain.errors import WireError
from p2ptrain.records import Claim, PeerRecord, Plan, Revocations, RunSpec, Telemetry
from p2ptrain.records.codec import UNREADABLE
from p2ptrain.records.fields import MAX_ID_CHARS
from p2ptrain.records.run import MAX_RUN_ID_CHARS

WIRE_VERSION = 1
MAX_ENVELOPE_BYTES = 64 * 1024
# a plan too large to gossip whole is pulled (control/plan_pull.py): 1,024 peers' is ~200 kB
MAX_PLAN_ENVELOPE_BYTES = 1024 * 1024
MAX_CLOCK_SKEW_S = 30.0
# a gossip message's copies come within seconds, and a sync re-delivers a 32-peer swarm's ~70
# held envelopes every 5 s; each entry keeps the bytes and the parsed body: at 1,024 a planner
# candidate (every member's telemetry, 7 a second) held 2.7 MiB of them after 5 minutes
VERIFIED_HEADERS = 256

__all__ = ["WireError"]  # re-exported: the control plane's code catches it from here


@dataclass(frozen=True)
class Envelope:
    """A verified message: who wrote it, which kind, its per-author sequence number and body."""

    kind: str
    author: str
    seq: int
    ts: float
    body: Body
    run_id: str = ""  # the run the author signed it for ("": an older peer's, or unknown)


@dataclass(frozen=True)
class Header:
    """A signed envelope whose signature and age were checked, its body not parsed yet."""

    kind: str
    author: str
    seq: int
    ts: float
    run_id: str
    raw_body: dict[str, Any]


class SeqClock:
    """Strictly increasing sequence numbers that survive restarts (microseconds since the epoch)."""

    def __init__(self) -> None:
        self._last = 0

    def next(self) -> int:
        self._last = max(self._last + 1, time.time_ns() // 1000)
        return self._last


def _canonical(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def encode(seed: bytes, seq: int, body: Body, ts: float | None = None, run_id: str = "") -> bytes:
    """Sign and serialize a record as the message of its kind, for run `run_id` ("": none);
    raises WireError if the result would be oversized."""
    return sign(seed, KIND_OF[type(body)], seq, body.to_dict(), ts, run_id)


def sign(
    seed: bytes,
    kind: str,
    seq: int,
    body: dict[str, Any],
    ts: float | None = None,
    run_id: str = "",
) -> bytes:
    """Sign and serialize any body as a message of `kind`: what encode does for records, and
    what a hostile peer can do with anything (tests use it to play one)."""
    unsigned = {
        "v": WIRE_VERSION,
        "kind": kind,
        "author": identity.peer_id_of(seed),
        "seq": seq,
        "ts": time.time() if ts is None else ts,
        "body": body,
    }
    if run_id:
        unsigned["run"] = run_id
    payload = _canonical(unsigned)
    signed = dict(unsigned, sig=identity.sign(seed, payload).hex())
    data = _canonical(signed)
    if len(data) > max_bytes(kind):
        raise WireError(f"oversized: {kind} message of {len(data)} bytes > {max_bytes(kind)}")
    return data


def max_bytes(kind: str) -> int:
    """The largest envelope of `kind`: a plan may be pulled larger than gossip carries."""
    return MAX_PLAN_ENVELOPE_BYTES if kind == "plan" else MAX_ENVELOPE_BYTES


def decode(data: bytes, now: float | None = None, max_age_s: float = MAX_CLOCK_SKEW_S) -> Envelope:
    """Parse, size-check, signature-check and schema-check a message. Raises WireError.

    max_age_s: how old `ts` may be (gossip: 30 s; DHT records, re-put every minute: longer).
    """
    return open_body(verified_header(data, now, max_age_s))


class VerifiedHeaders:
    """The headers of the last `size` envelopes that passed the checks, by their exact bytes."""

    def __init__(self, size: int = VERIFIED_HEADERS) -> None:
        self._size = size
        self._by_bytes: OrderedDict[bytes, Header] = OrderedDict()
        self.hits = 0  # copies not checked again (tests read it)

    def header(self, data: bytes) -> Header:
        """`data`'s header, checked unless these exact bytes passed before (age aside)."""
        header = self._by_bytes.get(data)
        if header is not None:
            self.hits += 1
            self._by_bytes.move_to_end(data)
            return header
        header = _checked_header(data)
        if len(data) > MAX_ENVELOPE_BYTES:  # a pulled plan: not kept (256 of 1 MiB each)
            return header
        self._by_bytes[data] = header
        if len(self._by_bytes) > self._size:
            self._by_bytes.popitem(last=False)
        return header


_VERIFIED = VerifiedHeaders()


def verified_header(
    data: bytes, now: float | None = None, max_age_s: float = MAX_CLOCK_SKEW_S
) -> Header:
    """Size, JSON, header fields, signature and age of a message; its body is left unparsed.
    Raises WireError."""
    header = _VERIFIED.header(data)
    now = time.time() if now is None else now
    if now - header.ts > max_age_s:
        # gossip can deliver honest messages late (queues, new joiners): drop, do not blame
        raise WireError(f"stale: written {now - header.ts:.1f} s ago")
    if header.ts - now > MAX_CLOCK_SKEW_S:
        raise WireError(f"replayed or skewed: timestamp {header.ts - now:.1f} s in the future")
    return header


def _checked_header(data: bytes) -> Header:
    """Size, JSON, header fields and signature of a message (not its age). Raises WireError."""
    # past gossip's size only a plan (pulled: control/plan_pull.py), checked before parsing
    if len(data) > MAX_ENVELOPE_BYTES and (
        len(data) > MAX_PLAN_ENVELOPE_BYTES or b'"kind":"plan"' not in data
    ):
        raise WireError(f"oversized: {len(data)} bytes > {MAX_ENVELOPE_BYTES}")
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError) as exc:  # bad JSON or UTF-8, > 4300-digit integers
        raise WireError(f"malformed: not JSON ({exc.__class__.__name__})") from None
    if not isinstance(obj, dict):
        raise WireError("malformed: not an object")
    if obj.get("v") != WIRE_VERSION:
        raise WireError(f"malformed: unsupported version {obj.get('v')!r}")
    sig = obj.pop("sig", None)
    if not isinstance(sig, str):
        raise WireError("unsigned: no signature")
    kind, author, seq, ts, body = (obj.get(k) for k in ("kind", "author", "seq", "ts", "body"))
    if not isinstance(kind, str) or kind not in BODY_RECORDS:
        raise WireError(f"malformed: unknown kind {kind!r}")
    if len(data) > max_bytes(kind):  # only a plan may be larger than gossip carries
        raise WireError(f"oversized: {kind} message of {len(data)} bytes > {max_bytes(kind)}")
    if not isinstance(author, str) or len(author) > MAX_ID_CHARS:
        raise WireError("malformed: bad author")
    if not isinstance(seq, int) or isinstance(seq, bool) or not 0 <= seq < 2**63:
        raise WireError("malformed: bad seq")
    if not _is_timestamp(ts) or not isinstance(body, dict):
        raise WireError("malformed: bad ts/body")
    run_id = obj.get("run", "")
    if not isinstance(run_id, str) or len(run_id) > MAX_RUN_ID_CHARS:
        raise WireError("malformed: bad run")
    if set(obj) - {"run"} != {"v", "kind", "author", "seq", "ts", "body"}:
        raise WireError("malformed: unexpected envelope fields")
    key = identity.public_key_of_peer_id(author)
    if key is None:
        raise WireError(f"forged: author {author[:16]}... has no Ed25519 key")
    try:
        signature = bytes.fromhex(sig)
    except ValueError as exc:
        raise WireError("unsigned: signature is not hex") from exc
    try:
        signed_bytes = _canonical(obj)
    except (ValueError, RecursionError) as exc:  # NaN or Infinity somewhere, or deep nesting
        raise WireError(f"malformed: not canonical JSON ({exc.__class__.__name__})") from None
    if not identity.verify(key, signed_bytes, signature):
        raise WireError(f"forged: bad signature for author {author}")
    return Header(kind, author, seq, float(ts), run_id, body)


def open_body(header: Header) -> Envelope:
    """The envelope of a verified header, its body checked by its kind's schema."""
    try:
        record = BODY_RECORDS[header.kind](header.raw_body)
    except WireError as exc:
        raise WireError(f"malformed {header.kind}: {exc}") from None
    except Exception as exc:  # a decoder's slip must not escape: gossip and sync catch WireError
        raise WireError(f"malformed {header.kind}: {UNREADABLE} ({type(exc).__name__})") from None
    return Envelope(header.kind, header.author, header.seq, header.ts, record, header.run_id)


def _is_timestamp(v: object) -> TypeGuard[float]:
    """Seconds since the epoch: a finite number that a float holds (no 400-digit integers)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return False
    return abs(v) < 1e12 and math.isfinite(v)


# ---------------------------------------------------------------- bodies: one record per kind

Body = RunSpec | PeerRecord | Telemetry | Claim | Plan | Revocations
BODY_RECORDS: dict[str, Callable[[object], Body]] = {
    "run": RunSpec.from_dict,
    "peer": PeerRecord.from_dict,
    "telemetry": Telemetry.from_dict,
    "claim": Claim.from_dict,
    "plan": Plan.from_dict,
    "revoked": Revocations.from_dict,
}
KIND_OF: dict[type, str] = {
    RunSpec: "run",
    PeerRecord: "peer",
    Telemetry: "telemetry",
    Claim: "claim",
    Plan: "plan",
    Revocations: "revoked",
}
