"""Is a peer reachable from the internet? The dial-back protocol's request and reply, and the
datagrams of the UDP "what address do you see" responder (net/dialback.py, net/nat_probe.py).

A peer asks another to dial it back at its addresses on a fresh connection (AutoNAT-style); the
answer says which dials completed a Noise handshake with the asker's peer id. The UDP datagrams
are fixed-size byte strings, not JSON: a query and its answer are the same length, so the
responder never sends more than it was sent (no amplification for a spoofed source).
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass
from typing import Any

from p2ptrain.errors import WireError
from p2ptrain.records import fields as f

# "unknown" until a dial-back round gave a verdict (and from peers that predate the field)
REACHABILITY = ("unknown", "public", "private")
MAX_DIAL_RESULTS = 8
MAX_ERROR_CHARS = 120


@dataclass(frozen=True)
class DialBackRequest:
    """Dial me back at these control-plane addresses (the server dials only those on the IP
    it sees the request come from)."""

    addrs: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"addrs": list(self.addrs)}

    @classmethod
    def from_dict(cls, data: object) -> DialBackRequest:
        d = f.mapping(data, "dial-back request")
        f.require_keys(d, "dial-back request", ("addrs",))
        return cls(addrs=f.addrs(d["addrs"], "dial-back request", "addrs"))


@dataclass(frozen=True)
class DialResult:
    """One address the server dialled, and how it went ("" when the handshake completed)."""

    addr: str
    ok: bool
    error: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"addr": self.addr, "ok": self.ok, "error": self.error}

    @classmethod
    def from_dict(cls, data: object) -> DialResult:
        r = "dial result"
        d = f.mapping(data, r)
        f.require_keys(d, r, ("addr", "ok"))
        error = d.get("error", "")
        return cls(
            addr=f.multiaddr(d["addr"], r, "addr"),
            ok=f.boolean(d["ok"], r, "ok"),
            error="" if error == "" else f.text(error, r, "error", MAX_ERROR_CHARS),
        )


@dataclass(frozen=True)
class DialBackReply:
    """What the server saw and did: the requester's address as seen on the request's
    connection (`observed`, a /ip4|ip6/…/tcp/… multiaddr), one result per address it dialled,
    its wall clock when it answered (`time_s`, Unix seconds: the asker's clock-skew check), and
    why it dialled nothing (`error`: rate limited, busy; "" otherwise)."""

    observed: str
    results: tuple[DialResult, ...]
    time_s: float
    error: str = ""

    @property
    def reached(self) -> bool:
        """Did at least one dial-back complete?"""
        return any(result.ok for result in self.results)

    def to_dict(self) -> dict[str, Any]:
        return {
            "observed": self.observed,
            "results": [result.to_dict() for result in self.results],
            "time_s": self.time_s,
            "error": self.error,
        }

    @classmethod
    def from_dict(cls, data: object) -> DialBackReply:
        r = "dial-back reply"
        d = f.mapping(data, r)
        f.require_keys(d, r, ("observed", "results", "time_s"))
        results, error = d["results"], d.get("error", "")
        if not isinstance(results, list) or len(results) > MAX_DIAL_RESULTS:
            raise f.malformed(r, f"results must be a list of at most {MAX_DIAL_RESULTS}")
        return cls(
            observed=f.multiaddr(d["observed"], r, "observed"),
            results=tuple(DialResult.from_dict(result) for result in results),
            time_s=f.number(d["time_s"], r, "time_s", 0.0, 1e11),
            error="" if error == "" else f.text(error, r, "error", MAX_ERROR_CHARS),
        )


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
