"""Is a peer reachable from the internet? The dial-back protocol's request and reply, and the
datagrams of the UDP "what address do you see" responder (traversal/dialback.py, traversal/nat_probe.py).

A peer asks another to dial it back at its addresses on a fresh connection (AutoNAT-style); the
answer says which dials completed a Noise handshake with the asker's peer id. The UDP datagrams
are fixed-size byte strings, not JSON: a query and its answer are the same length, so the
responder never sends more than it was sent (no amplification for a spoofed source).
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass
from typing import Annotated

from p2ptrain.errors import WireError
from p2ptrain.records.codec import Addr, Addrs, Nested, Num, Record, Seq, Text

# "unknown" until a dial-back round gave a verdict (and from peers that predate the field)
REACHABILITY = ("unknown", "public", "private")
MAX_DIAL_RESULTS = 8
MAX_ERROR_CHARS = 120


@dataclass(frozen=True)
class DialBackRequest(Record, name="dial-back request"):
    """Dial me back at these control-plane addresses (the server dials only those on the IP
    it sees the request come from)."""

    addrs: Annotated[tuple[str, ...], Addrs()]


@dataclass(frozen=True)
class DialResult(Record, name="dial result"):
    """One address the server dialled, and how it went ("" when the handshake completed)."""

    addr: Annotated[str, Addr()]
    ok: bool
    error: Annotated[str, Text(MAX_ERROR_CHARS, empty=True)] = ""


@dataclass(frozen=True)
class DialBackReply(Record, name="dial-back reply"):
    """What the server saw and did: the requester's address as seen on the request's
    connection (`observed`, a /ip4|ip6/…/tcp/… multiaddr), one result per address it dialled,
    its wall clock when it answered (`time_s`, Unix seconds: the asker's clock-skew check), and
    why it dialled nothing (`error`: rate limited, busy; "" otherwise)."""

    observed: Annotated[str, Addr()]
    results: Annotated[tuple[DialResult, ...], Seq(Nested(DialResult), MAX_DIAL_RESULTS)]
    time_s: Annotated[float, Num(0.0, 1e11)]
    error: Annotated[str, Text(MAX_ERROR_CHARS, empty=True)] = ""

    @property
    def reached(self) -> bool:
        """Did at least one dial-back complete?"""
        return any(result.ok for result in self.results)


# -- UDP datagrams -------------------------------------------------------------------------------
# query:  magic "p2pt?v1\0" | 8-byte nonce | 16 zero bytes                      (32 bytes)
# answer: magic "p2pt!v1\0" | the query's nonce | IPv4 (4) | port (2, big-endian) | 10 zero bytes
UDP_DATAGRAM_BYTES = 32
NONCE_BYTES = 8
_QUERY_MAGIC = b"p2pt?v1\x00"
_ANSWER_MAGIC = b"p2pt!v1\x00"
_ANSWER_BODY = struct.Struct(">4sH")
_QUERY_PADDING = bytes(UDP_DATAGRAM_BYTES - len(_QUERY_MAGIC) - NONCE_BYTES)
_ANSWER_PADDING = bytes(UDP_DATAGRAM_BYTES - len(_ANSWER_MAGIC) - NONCE_BYTES - _ANSWER_BODY.size)
_NONCE_AT = slice(8, 8 + NONCE_BYTES)  # both magics are 8 bytes
_BODY_AT = slice(_NONCE_AT.stop, _NONCE_AT.stop + _ANSWER_BODY.size)


def udp_query(nonce: bytes) -> bytes:
    """A query datagram carrying `nonce` (8 bytes)."""
    if len(nonce) != NONCE_BYTES:
        raise ValueError(f"a nonce is {NONCE_BYTES} bytes")
    return _QUERY_MAGIC + nonce + _QUERY_PADDING


def parse_udp_query(data: bytes) -> bytes:
    """The nonce of a well-formed query; WireError for anything else (the responder then stays
    silent)."""
    if len(data) != UDP_DATAGRAM_BYTES or not data.startswith(_QUERY_MAGIC):
        raise WireError("malformed udp query: wrong size or magic")
    if data[_NONCE_AT.stop :] != _QUERY_PADDING:
        raise WireError("malformed udp query: non-zero padding")
    return data[_NONCE_AT]


def udp_answer(nonce: bytes, ip: str, port: int) -> bytes:
    """The answer to the query `nonce` that came from (ip, port): IPv4 only."""
    packed = ipaddress.IPv4Address(ip).packed
    return _ANSWER_MAGIC + nonce + _ANSWER_BODY.pack(packed, port) + _ANSWER_PADDING


def parse_udp_answer(data: bytes, nonce: bytes) -> tuple[str, int]:
    """The (ip, port) a server saw our query `nonce` come from; WireError if `data` is not the
    answer to that query."""
    if len(data) != UDP_DATAGRAM_BYTES or not data.startswith(_ANSWER_MAGIC):
        raise WireError("malformed udp answer: wrong size or magic")
    if data[_NONCE_AT] != nonce:
        raise WireError("stale udp answer: another query's nonce")
    packed, port = _ANSWER_BODY.unpack(data[_BODY_AT])
    if data[_BODY_AT.stop :] != _ANSWER_PADDING or port == 0:
        raise WireError("malformed udp answer: bad port or padding")
    return str(ipaddress.IPv4Address(packed)), port
