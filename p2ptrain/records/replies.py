"""The replies of the control processes' request/response protocols (net/rpc.py), declared once:
the run reply (`/p2ptrain/run/1.0.0`), a sync page (`/p2ptrain/sync/1.0.0`), a status page
(`/p2ptrain/status/1.0.0`), the cursor a paged request names (net/paging.py) and a sync request. The JSON is
what these protocols always carried; each reply is decoded once, where it arrives.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any

from p2ptrain.records import fields as f
from p2ptrain.records.codec import Custom, Int, Nullable, Record, Seq, Text, Wire

MAX_CURSOR = 2**31 - 1
MAX_TERM = 2**62 - 1
MAX_PAGE_ITEMS = 1 << 20  # a page's items are bounded by its bytes (net/rpc.MAX_REPLY_BYTES)
MAX_ERROR_CHARS = 200
DIGEST_HEX_CHARS = 16  # a sync bucket's digest: 64 bits (control/held.py)
MAX_DIGESTS = 256
MAX_KEY_CHARS = 80  # an author (a revocation page's: "organiser/page") or a kind
_HEX_DIGEST = re.compile(f"[0-9a-f]{{{DIGEST_HEX_CHARS}}}")


def _string(value: object, record: str, name: str) -> str:
    if not isinstance(value, str):
        raise f.malformed(record, f"{name} must hold strings")
    return value


def _item(value: object, record: str, name: str) -> object:
    """A sync page's item, kept as sent: control/sync.py decodes each envelope on its own (and
    blames the sender for each bad one), so one bad item does not hide the others."""
    return value


def _object(value: object, record: str, name: str) -> dict[str, Any]:
    """A status entry (records/status.py's SwarmStatus checks it once the pages are joined)."""
    if not isinstance(value, dict):
        raise f.malformed(record, f"{name} must hold objects")
    return value


def _digest(value: object, record: str, name: str) -> str:
    """A sync bucket's digest (control/held.py): DIGEST_HEX_CHARS lowercase hex digits."""
    if not isinstance(value, str) or not _HEX_DIGEST.fullmatch(value):
        raise f.malformed(record, f"{name} must hold {DIGEST_HEX_CHARS} hex digits each")
    return value


def _key(value: object, record: str, name: str) -> tuple[str, str]:
    """An (author, kind) of a held envelope: [author, kind]."""
    if (
        not isinstance(value, list)
        or len(value) != 2
        or not all(isinstance(v, str) and 0 < len(v) <= MAX_KEY_CHARS for v in value)
    ):
        raise f.malformed(record, f"{name} must hold [author, kind] pairs")
    return (value[0], value[1])


def _entry(value: object, record: str, name: str) -> tuple[str, str, str]:
    """A held envelope's (author, kind, fingerprint): [author, kind, 16 hex digits]."""
    if not isinstance(value, list) or len(value) != 3:
        raise f.malformed(record, f"{name} must hold [author, kind, fingerprint] triples")
    author, kind = _key(value[:2], record, name)
    return (author, kind, _digest(value[2], record, name))


def _plan_key(value: object, record: str, name: str) -> tuple[int, int]:
    if not isinstance(value, list | tuple) or len(value) != 2:
        raise f.malformed(record, f"{name} must be [term, epoch]")
    return (f.integer(value[0], record, name, 1, MAX_TERM), f.integer(value[1], record, name, 0))


NextCursor = Annotated[int | None, Nullable(Int(1, MAX_CURSOR))]


@dataclass(frozen=True)
class Cursor(Record, name="cursor"):
    """A paged request: the first item it asks for (an empty request asks for 0)."""

    cursor: Annotated[int, Int(0, MAX_CURSOR)]


@dataclass(frozen=True)
class SyncRequest(Record, name="sync request"):
    """A sync page request: the cursor, whether the asker is in telemetry's audience (False:
    serve the planner candidates' telemetry only, control/gossip.py), whether it asks for
    the current term only (no envelopes: control/sync.py), and the digests of what it holds,
    by bucket, with the asker's id that they leave out (control/held.py: serve only the
    buckets that differ). `{"cursor": n}` asks for all."""

    cursor: Annotated[int, Int(0, MAX_CURSOR)]
    telemetry: Annotated[bool, Wire(omit_default=True)] = True
    term_only: Annotated[bool, Wire(omit_default=True)] = False
    digests: Annotated[
        tuple[str, ...], Seq(Custom(_digest), MAX_DIGESTS), Wire(omit_default=True)
    ] = ()
    asker: Annotated[str, Text(f.MAX_ID_CHARS, empty=True), Wire(omit_default=True)] = ""
    # the envelopes asked for by name, after a page listed a bucket's entries (control/sync.py)
    keys: Annotated[
        tuple[tuple[str, str], ...],
        Seq(Custom(_key, list), MAX_PAGE_ITEMS),
        Wire(omit_default=True),
    ] = ()


@dataclass(frozen=True)
class RunReply(Record, name="run reply"):
    """The bootstrap's signed run spec (an envelope), or why there is none."""

    envelope: Annotated[str | None, Nullable(Custom(_string)), Wire(omit_default=True)] = None
    error: Annotated[str | None, Nullable(Text(MAX_ERROR_CHARS)), Wire(omit_default=True)] = None

    def wire_problem(self) -> str | None:
        if (self.envelope is None) == (self.error is None):
            return "a reply holds an envelope or an error"
        return None


@dataclass(frozen=True)
class SyncPage(Record, name="sync page"):
    """Whole envelopes, the next cursor (None: the last page), the responder's anchored term,
    whether the run is finished (the organiser's word: control/run_end.py), and, on page 0, the
    (author, kind, fingerprint) of each entry of the large buckets that differ from the
    asker's digests: it asks for the envelopes it lacks by name (control/held.py)."""

    envelopes: Annotated[tuple[object, ...], Seq(Custom(_item), MAX_PAGE_ITEMS)]
    next: NextCursor = None
    term: Annotated[int | None, Nullable(Int(0, MAX_TERM))] = None
    finished: bool = False
    entries: Annotated[
        tuple[tuple[str, str, str], ...],
        Seq(Custom(_entry, list), MAX_PAGE_ITEMS),
        Wire(omit_default=True),
    ] = ()


@dataclass(frozen=True)
class StatusPage(Record, name="status page"):
    """Peers and links of the status document (page 0 carries its other fields beside them)."""

    peers: Annotated[tuple[dict[str, Any], ...], Seq(Custom(_object), MAX_PAGE_ITEMS)]
    links: Annotated[tuple[dict[str, Any], ...], Seq(Custom(_object), MAX_PAGE_ITEMS)]
    next: NextCursor = None

    @staticmethod
    def scalars(reply: dict[str, Any]) -> dict[str, Any]:
        """Page 0's other fields: the status document's scalars."""
        return {k: v for k, v in reply.items() if k not in ("peers", "links", "next")}


@dataclass(frozen=True)
class PlanRequest(Record, name="plan request"):
    """Ask for the current plan, if it is at least (term, epoch) (control/plan_pull.py), as its
    changes against the plan `have` the asker holds (control/plan_delta.py) if the responder
    knows that one."""

    term: Annotated[int, Int(1, MAX_TERM)]
    epoch: Annotated[int, Int(0, MAX_CURSOR)]
    have: Annotated[
        tuple[int, int] | None, Nullable(Custom(_plan_key, list)), Wire(omit_default=True)
    ] = None


@dataclass(frozen=True)
class PlanReply(RunReply, name="plan reply"):
    """The planner's signed plan (an envelope too large to gossip), its `delta` against the plan
    the asker holds, or why there is none."""

    delta: Annotated[dict[str, Any] | None, Nullable(Custom(_object)), Wire(omit_default=True)] = (
        None
    )

    def wire_problem(self) -> str | None:
        if sum(x is not None for x in (self.envelope, self.error, self.delta)) != 1:
            return "a plan reply holds an envelope, a delta or an error"
        return None
