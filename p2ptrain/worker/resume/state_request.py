"""The wire form of a stage-state request: what a fetcher asks a state server for
(worker/resume/state_transfer.py, protocol `p2ptrain.stage-state.v3`).

A request is a 4-byte big-endian length, then a compact JSON body of at most MAX_REQUEST_BYTES:
`{"layers": "L<a>-<b>", "step": N, "digest": sha256 hex}`, with `"have": true` when the asker
says it holds that state now. The body comes from another peer, so the decoder returns a valid
`StateRequest` or raises WireError, never a half-checked record. The spare-copy protocol
(copy_server.py) frames its requests the same way (`encode_request`, `request_json`,
`parse_layers`).
"""

from __future__ import annotations

import asyncio
import json
import re
import struct
from dataclasses import dataclass
from typing import Any

from p2ptrain.errors import WireError
from p2ptrain.records import fields as f
from p2ptrain.train.checkpoint_folder import layers_key
from p2ptrain.worker.inbound import read_prefixed

REQUEST_LEN = struct.Struct(">I")
MAX_REQUEST_BYTES = 256
_LAYERS = re.compile(r"L([0-9]{1,6})-([0-9]{1,6})")  # not \d: "L٠-٣" is no range
_DIGEST = re.compile(r"^[0-9a-f]{64}$")
_REQUEST = "stage-state request"


def parse_layers(key: object) -> range | None:
    match = _LAYERS.fullmatch(key) if isinstance(key, str) else None
    if not match or int(match[1]) >= int(match[2]):
        return None
    return range(int(match[1]), int(match[2]))


@dataclass(frozen=True)
class StateRequest:
    """What a client asks for: the state of `layers` at `step` whose sha256 is `digest`; with
    `have`, nothing: it says it holds that state now (a donor waiting for it to fetch the
    state need not wait: worker/resume/handover.py)."""

    layers: range
    step: int
    digest: str
    have: bool = False

    def to_dict(self) -> dict[str, Any]:
        data = {"layers": layers_key(self.layers), "step": self.step, "digest": self.digest}
        return data | ({"have": True} if self.have else {})

    def encode(self) -> bytes:
        return encode_request(self.to_dict())

    @classmethod
    def from_dict(cls, data: object) -> StateRequest:
        raw = f.mapping(data, _REQUEST)
        f.require_keys(raw, _REQUEST, ("layers", "step", "digest"))
        layers = parse_layers(raw["layers"])
        if layers is None:
            raise f.malformed(_REQUEST, "layers must be L<start>-<stop>, start < stop")
        digest = raw["digest"]
        if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
            raise f.malformed(_REQUEST, "digest must be 64 lowercase hex digits")
        have = f.boolean(raw.get("have", False), _REQUEST, "have")
        return cls(layers, f.integer(raw["step"], _REQUEST, "step"), digest, have)

    @classmethod
    def decode(cls, body: bytes) -> StateRequest:
        """A request's JSON body (after its length): a valid request, or WireError."""
        return cls.from_dict(request_json(body, _REQUEST))


def encode_request(data: dict[str, Any]) -> bytes:
    """A request of these protocols on the wire: its length, then its compact JSON."""
    body = json.dumps(data, separators=(",", ":")).encode()
    return REQUEST_LEN.pack(len(body)) + body


def request_json(body: bytes, what: str) -> object:
    """A request's JSON body (after its length), parsed: WireError past MAX_REQUEST_BYTES or if
    it is not JSON."""
    if len(body) > MAX_REQUEST_BYTES:
        raise WireError(f"oversized {what}: {len(body)} bytes")
    try:
        return json.loads(body)
    except (ValueError, RecursionError):  # not UTF-8, not JSON, a 5000-digit integer
        raise f.malformed(what, "not JSON") from None


async def read_request(reader: asyncio.StreamReader) -> StateRequest:
    """A client's request; WireError if malformed (IncompleteReadError if cut short)."""
    return StateRequest.decode(
        await read_prefixed(reader, REQUEST_LEN, MAX_REQUEST_BYTES, _REQUEST)
    )
