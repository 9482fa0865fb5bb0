"""Reaching a peer behind a NAT: the relay protocol's records (traversal/relay.py, control/traversal.py).

Signalling rides the control plane (`/p2ptrain/relay/1.0.0` streams, whose peer ids Noise
authenticated); the bytes of a relayed or hole-punched connection do not: they go over plain
TCP connections that start with a fixed-size RawHello and then carry a libp2p connection, whose
own Noise handshake authenticates the two ends (a relay sees ciphertext only).

- RelayRequest: a NATed peer reserves a slot on a public peer ("reserve"), or a peer asks a
  relay to reach a reserved peer ("connect"), with the endpoint a hole punch would use.
- RelayOffer / OfferAnswer: the relay asks the reserved peer to take that connection, and it
  answers with its own punch endpoint (or none: relay the bytes).
- RelayReply: the relay's answer to either request.
- RawHello: the first 17 bytes of a raw connection: a kind and a 16-byte single-use token.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Annotated

from p2ptrain.errors import WireError
from p2ptrain.records import fields as f
from p2ptrain.records.codec import Custom, Num, OneOf, PeerId, Record, Text

RELAY_OPS = ("reserve", "connect")
PLANES = ("control", "data")
TOKEN_BYTES = 16
MAX_RELAY_ERROR_CHARS = 200
# RawHello kinds: one half of a relayed circuit, a "what endpoint do you see" query, and the
# first bytes a punching peer sends on the connection it punched
RAW_CIRCUIT, RAW_OBSERVE, RAW_PUNCHED = 1, 2, 3
RAW_KINDS = (RAW_CIRCUIT, RAW_OBSERVE, RAW_PUNCHED)
RAW_HELLO_BYTES = 1 + TOKEN_BYTES
MAX_ENDPOINT_CHARS = 21  # 255.255.255.255:65535
# no end punches to a port below this (control/traversal.py): a relay names the endpoint, and
# NATs map ephemeral ports to ports >= 1024 (RFC 4787, 4.2.1); the decoders still take any port
MIN_PUNCH_PORT = 1024


def endpoint(value: object, record: str, name: str) -> str:
    """'' or an IPv4 'a.b.c.d:port' (port 1-65535), in canonical form."""
    if value == "":
        return ""
    text = f.text(value, record, name, MAX_ENDPOINT_CHARS)
    host, sep, port = text.rpartition(":")
    # ASCII digits: str.isdigit() takes "²", which int() refuses
    if not sep or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        raise f.malformed(record, f"{name} must be IPv4:port")
    try:
        ip = ipaddress.IPv4Address(host)
    except ValueError:
        raise f.malformed(record, f"{name} must be IPv4:port") from None
    return f"{ip}:{int(port)}"


def split_endpoint(text: str) -> tuple[str, int]:
    """('a.b.c.d', port) of an endpoint `endpoint()` accepted."""
    host, _, port = text.rpartition(":")
    return host, int(port)


def _target(value: object, record: str, name: str) -> str:
    """A connect's peer id, or '' (a reservation: RelayRequest.wire_problem pairs them)."""
    return "" if value == "" else f.peer_id(value, record, name)


def _token(value: object, record: str, name: str = "token") -> str:
    text = f.text(value, record, "token", 2 * TOKEN_BYTES)
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        raise f.malformed(record, "token must be hex") from None
    if len(raw) != TOKEN_BYTES:
        raise f.malformed(record, f"token must be {TOKEN_BYTES} bytes")
    return raw.hex()


def _token_or_none(value: object, record: str, name: str) -> str:
    return "" if value == "" else _token(value, record, name)


Endpoint = Annotated[str, Custom(endpoint)]


@dataclass(frozen=True)
class RelayRequest(Record, name="relay request"):
    """Reserve a slot (target ''), or reach `target` on `plane`, punching from `endpoint` if
    given."""

    op: Annotated[str, OneOf(RELAY_OPS)]
    target: Annotated[str, Custom(_target)] = ""
    plane: Annotated[str, OneOf(PLANES)] = "data"
    endpoint: Endpoint = ""

    def wire_problem(self) -> str | None:
        if (self.op == "connect") != (self.target != ""):
            return "a connect names its target, a reservation none"
        return None


@dataclass(frozen=True)
class RelayOffer(Record, name="relay offer"):
    """From a relay to a peer reserved there: `source` wants a connection to your `plane`."""

    source: Annotated[str, PeerId()]
    plane: Annotated[str, OneOf(PLANES)]
    # hex: the circuit's token, for a relayed connection or a punched one's hello
    token: Annotated[str, Custom(_token)]
    endpoint: Endpoint = ""  # the source's punch endpoint ('' : relay the bytes)


@dataclass(frozen=True)
class OfferAnswer(Record, name="offer answer"):
    """The reserved peer's answer: take it (punching from `endpoint` if given) or not."""

    accept: bool
    endpoint: Endpoint = ""


@dataclass(frozen=True)
class RelayReply(Record, name="relay reply"):
    """A relay's answer: `error` '' when granted; for a connect, the circuit's token and the
    target's punch endpoint ('' : connect to the relay's raw port with the token)."""

    error: Annotated[str, Text(MAX_RELAY_ERROR_CHARS, empty=True)] = ""
    token: Annotated[str, Custom(_token_or_none)] = ""
    endpoint: Endpoint = ""
    # a reservation: renew before this many seconds pass
    expires_s: Annotated[float, Num(0.0, 86400.0)] = 0.0


@dataclass(frozen=True)
class RawHello:
    """The first RAW_HELLO_BYTES of a raw relay-port or punched connection."""

    kind: int
    token: bytes

    def encode(self) -> bytes:
        return bytes([self.kind]) + self.token

    @classmethod
    def decode(cls, data: bytes) -> RawHello:
        if len(data) != RAW_HELLO_BYTES:
            raise WireError(f"malformed raw hello: {len(data)} bytes, not {RAW_HELLO_BYTES}")
        if data[0] not in RAW_KINDS:
            raise WireError(f"malformed raw hello: unknown kind {data[0]}")
        return cls(kind=data[0], token=bytes(data[1:]))
