"""The wire format of an outer round (worker/averaging/outer_exchange.py): messages and codecs.

A message is `u32 header length | JSON header | payload bytes`; the receiver answers one byte
(ACCEPTED, REJECTED or BUSY, as pipeline frames: worker/pipeline/frames.py). The header names
the round (`round`: run, plan term and epoch, stage, step, attempt and a digest of the group's
members), the message kind, the sender, the shard, the payload's size and the sender's claimed
checksums (worker/averaging/checks.py), or, in a reduced shard, the claims of every member the
reducer combined and why it dropped or clipped any.

Kinds: PART (a member's slice `shard` of its encoded pseudo-gradient, to that shard's reducer),
REDUCED (a reducer's combined shard, to every member), SPARSE (a member's whole top-k
payload, to every member) and CONFIRM (32 bytes: the sha256 of every message a member's checked
result combined, `combined_digest`, or FAILED_DIGEST, zeros: its attempt failed; to every
member, in groups of three or more: worker/averaging/outer_attempt.py says why). Payloads are train/codecs.py's bytes; a receiver decodes them with
the size it computes from the plan (never the sender's), so a wrong size is a WireError.

Pure (torch only): unit-testable without a network.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from p2ptrain.errors import WireError
from p2ptrain.records import fields as f
from p2ptrain.train import codecs
from p2ptrain.worker.averaging.checks import GRAD, Checksums, RoundGather

PROTOCOL = "p2ptrain.outer-round.v1"  # one message a stream (still served: the last version's)
# the same messages one after another on a stream, each answered (worker/kept_streams.py)
STREAM_PROTOCOL = "p2ptrain.outer-round.v2"
HEADER_LEN = struct.Struct(">I")
MAX_HEADER_BYTES = 64 * 1024  # a reduced shard's header carries every member's claims
MAX_ROUND_KEY_CHARS = 256
MAX_NOTES = 16
# a round key's step may be this many outer periods (inner_steps) past our latest round: an
# honest groupmate is a round or two ahead at most; a key farther out would be held for ever
MAX_ROUNDS_AHEAD = 3
PART, REDUCED, SPARSE, CONFIRM = "part", "reduced", "sparse", "confirm"
KINDS = (PART, REDUCED, SPARSE, CONFIRM)
DIGEST_BYTES = 32  # a CONFIRM's payload: a sha256
FAILED_DIGEST = bytes(DIGEST_BYTES)  # a CONFIRM of a member whose attempt failed
ACCEPTED, REJECTED, BUSY = b"\x01", b"\x00", b"\x02"
_HEADER = "outer round header"


@dataclass(frozen=True)
class RoundHeader:
    round: str
    kind: str
    sender: str
    shard: int
    num_bytes: int
    claims: Checksums  # PART/SPARSE: the sender's; REDUCED: the reducer's own
    # REDUCED only: the claims of the members combined, and why any was dropped or clipped
    contributors: Mapping[str, Checksums] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    def body(self) -> dict[str, Any]:
        return {
            "round": self.round,
            "kind": self.kind,
            "sender": self.sender,
            "shard": self.shard,
            "num_bytes": self.num_bytes,
            "claims": self.claims.to_dict(),
            "contributors": {p: c.to_dict() for p, c in self.contributors.items()},
            "notes": list(self.notes),
        }

    def encode(self) -> bytes:
        raw = json.dumps(self.body(), separators=(",", ":")).encode()
        if len(raw) > MAX_HEADER_BYTES:
            raise ValueError(f"outer round header of {len(raw)} bytes")
        return HEADER_LEN.pack(len(raw)) + raw

    @classmethod
    def decode(cls, raw: bytes) -> RoundHeader:
        """A header as it arrived: a valid record or WireError."""
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError) as exc:  # not UTF-8, not JSON, deep nesting
            raise WireError(f"malformed {_HEADER}: not JSON") from exc
        d = f.mapping(data, _HEADER)
        f.require_keys(d, _HEADER, ("round", "kind", "sender", "shard", "num_bytes", "claims"))
        contributors = f.mapping(d.get("contributors", {}), _HEADER)
        if len(contributors) > f.MAX_PEERS:
            raise WireError(f"malformed {_HEADER}: too many contributors")
        notes = d.get("notes", [])
        if not isinstance(notes, list) or len(notes) > MAX_NOTES:
            raise WireError(f"malformed {_HEADER}: notes")
        return cls(
            round=f.text(d["round"], _HEADER, "round", MAX_ROUND_KEY_CHARS),
            kind=f.choice(d["kind"], _HEADER, "kind", KINDS),
            sender=f.peer_id(d["sender"], _HEADER, "sender"),
            shard=f.integer(d["shard"], _HEADER, "shard", 0, f.MAX_PEERS),
            num_bytes=f.integer(d["num_bytes"], _HEADER, "num_bytes"),
            claims=Checksums.from_dict(d["claims"]),
            contributors={
                f.peer_id(p, _HEADER, "contributor"): Checksums.from_dict(c)
                for p, c in contributors.items()
            },
            notes=tuple(f.text(n, _HEADER, "note", f.MAX_FREE_FORM_CHARS) for n in notes),
        )


def message_digest(header: RoundHeader, payload: bytes) -> bytes:
    """The sha256 of a message as its sender meant it: the header's fields (keys sorted, so
    the sender's own copy and a receiver's decoded one agree) and the payload's bytes."""
    body = json.dumps(header.body(), sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(HEADER_LEN.pack(len(body)) + body + payload).digest()


def combined_digest(messages: Mapping[str, bytes]) -> bytes:
    """What a CONFIRM carries: the digest of every message a result combined, by sender."""
    h = hashlib.sha256()
    for sender in sorted(messages):
        h.update(sender.encode() + b"\0" + messages[sender])
    return h.digest()


def claims_disagree(maps: Iterable[Mapping[str, Checksums]]) -> str | None:
    """A member whose claims differ between reducers' headers (each member sends every reducer
    the same claims: it said different things to different ones), else None."""
    seen: dict[str, Checksums] = {}
    for claims in maps:
        for peer, said in claims.items():
            if seen.setdefault(peer, said) != said:
                return f"{peer} sent different claims to different reducers"
    return None


# --- the codecs of a round: dense shards (fp16, int8) and whole top-k payloads ---


def round_key(prefix: str, step: int, attempt: int, members: list[str]) -> str:
    """The messages' key of one attempt at a step's round of a stage (`prefix`: its plan)."""
    group = hashlib.sha256(",".join(members).encode()).hexdigest()[:16]
    return f"{prefix}/{step}/{attempt}/{group}"


# ASCII decimal as round_key writes it, below 10**16 (> records' MAX_INT): str.isdigit() takes
# "²", which int() refuses, and a 5000-digit number is a ValueError too
_COUNT = re.compile(r"0|[1-9][0-9]{0,15}")
_GROUP = re.compile(r"[0-9a-f]{16}")


def parse_round_key(key: str) -> tuple[str, int] | None:
    """The prefix and step of a key round_key wrote; None for any other string (total)."""
    parts = key.rsplit("/", 3)
    if len(parts) != 4:
        return None
    prefix, step, attempt, group = parts
    if not (_COUNT.fullmatch(step) and _COUNT.fullmatch(attempt) and _GROUP.fullmatch(group)):
        return None
    return prefix, int(step)


def round_step(prefix: str, key: str) -> int:
    """The step of a round key of the stage's plan `prefix`, -1 for any other key."""
    parsed = parse_round_key(key)
    return parsed[1] if parsed is not None and parsed[0] == prefix else -1


def kept_after(
    prefix: str, step: int, siblings: Iterable[str], max_ahead: int
) -> Callable[[str], bool]:
    """Which round keys an inbox keeps once the round of `step` under `prefix` ends: its later
    rounds' and those of its sibling fragments (their own rounds forget them), up to
    `max_ahead` steps on; no other (a key that is not a round key is dropped)."""
    others = tuple(siblings)
    last = step + max_ahead

    def keep(key: str) -> bool:
        parsed = parse_round_key(key)
        if parsed is None or parsed[1] > last:
            return False
        return parsed[0] in others or (parsed[0] == prefix and parsed[1] > step)

    return keep


def shard_bounds(numel: int, num_members: int) -> list[tuple[int, int]]:
    """The contiguous slice of the flat vector each member reduces, in the group's order."""
    return [(j * numel // num_members, (j + 1) * numel // num_members) for j in range(num_members)]


def dense_bytes(codec: str, numel: int) -> int:
    """Payload bytes of a dense shard of `numel` values."""
    if codec == "fp16":
        return 2 * numel
    if codec == "int8":
        return -(-numel // codecs.INT8_BLOCK) * (4 + codecs.INT8_BLOCK)
    raise ValueError(f"not a dense outer codec: {codec!r}")


def encode_dense(codec: str, values: torch.Tensor) -> torch.Tensor:
    if codec == "fp16":
        return codecs.encode_fp16(values)
    if codec == "int8":
        return codecs.encode_int8_blocks(values)
    raise ValueError(f"not a dense outer codec: {codec!r}")


def decode_dense(codec: str, payload: torch.Tensor | bytes, numel: int) -> torch.Tensor:
    """The shard's fp32 values, or WireError (size from the plan, values finite)."""
    if codec == "fp16":
        return codecs.decode_fp16(payload, (numel,))
    if codec == "int8":
        return codecs.decode_int8_blocks(payload, (numel,))
    raise ValueError(f"not a dense outer codec: {codec!r}")


def roundtrip_dense(codec: str, values: torch.Tensor) -> torch.Tensor:
    """What a receiver decodes of `values` (the sender's own view of what it sent)."""
    return decode_dense(codec, encode_dense(codec, values), values.numel())


def max_message_bytes(codec: str, numel: int, fraction: float) -> int:
    """The largest payload a message of a round of this stage may carry."""
    if codec == "topk":
        return codecs.topk_payload_bytes(numel, fraction)
    return dense_bytes(codec, numel)


def as_gather_map(claims: Mapping[str, Checksums]) -> dict[str, dict[str, Any]]:
    """Claims in the shape worker/averaging/checks.py's check_round reads (an outer round
    averages pseudo-gradients: a gradient round's gather)."""
    return {peer: RoundGather(GRAD, c).to_dict() for peer, c in claims.items()}
