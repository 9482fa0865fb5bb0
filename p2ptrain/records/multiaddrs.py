"""Multiaddr text that both of our dialers parse: py-multiaddr (py-libp2p, the control process)
and hivemind's copy of it (the worker's p2pd client). Neither may be imported here (the records
serve both processes), so the rules are restated strictly, stdlib only, and
tests/records/test_multiaddrs.py checks them against both parsers: whatever passes here parses
there, and so a peer's address can never raise in a dialer.
"""

from __future__ import annotations

import ipaddress
import re

from p2ptrain.key_file import base58_decode, base58_encode

# protocol -> the kind of its value (None: the protocol takes none). Left out: `ipfs` (an old
# name of p2p that py-multiaddr refuses), `webtransport` (hivemind's copy refuses it), and every
# protocol no transport of ours dials.
PROTOCOL_VALUES: dict[str, str | None] = {
    "ip4": "ip4",
    "ip6": "ip6",
    "dns": "host",
    "dns4": "host",
    "dns6": "host",
    "dnsaddr": "host",
    "tcp": "port",
    "udp": "port",
    "p2p": "peer",
    "quic": None,
    "quic-v1": None,
    "ws": None,
    "wss": None,
    "p2p-circuit": None,
}
MAX_PORT = 65535
MAX_HOST_CHARS = 253
MAX_IP6_CHARS = 45  # the longest text form, an IPv4 tail included
MAX_PEER_ID_CHARS = 60  # a base58 multihash of at most 44 bytes
MAX_IDENTITY_DIGEST_BYTES = 42  # the longest key the libp2p spec inlines in a peer id
SHA256_CODE, SHA256_BYTES = 0x12, 32
IDENTITY_CODE = 0x00

# py-multiaddr refuses a value spelled like one of its protocols' names ("/dns4/ws/tcp/1")
RESERVED_HOSTS = frozenset(
    {
        *PROTOCOL_VALUES,
        *("certhash", "dccp", "garlic32", "garlic64", "http", "http-path", "https", "ip6zone"),
        *("ipcidr", "memory", "noise", "onion", "onion3", "p2p-webrtc-direct", "p2p-webrtc-star"),
        *("p2p-websocket-star", "sctp", "sni", "tls", "udt", "unix", "utp", "webrtc"),
        *("webrtc-direct", "webtransport", "ipfs"),
    }
)

_PORT = re.compile(r"[0-9]{1,5}")
# ASCII letters, digits and inner hyphens; a hyphen at both places 3 and 4 ("xn--") names an IDN
# label, which the parsers' IDNA check may refuse
_HOST_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
_BASE58 = re.compile(r"[1-9A-HJ-NP-Za-km-z]+")


def problem(text: str) -> str | None:
    """What keeps `text` from being a multiaddr both dialers parse (None: nothing)."""
    parts = text.split("/")
    if parts[0] != "" or len(parts) < 3:
        return "not a multiaddr"
    index = 1
    while index < len(parts):
        protocol = parts[index]
        if protocol not in PROTOCOL_VALUES:
            return f"unsupported protocol {protocol[:16]!r}"
        kind = PROTOCOL_VALUES[protocol]
        if kind is not None:
            if index + 1 >= len(parts) or not _valid_value(kind, parts[index + 1]):
                return f"bad {protocol} value"
            index += 1
        index += 1
    return None


def _valid_value(kind: str, value: str) -> bool:
    if kind == "port":
        return _PORT.fullmatch(value) is not None and int(value) <= MAX_PORT
    if kind == "ip4":
        return value.isascii() and _parses(ipaddress.IPv4Address, value)
    if kind == "ip6":
        # a scope ("%eth0") is no part of a multiaddr
        return (
            value.isascii()
            and len(value) <= MAX_IP6_CHARS
            and "%" not in value
            and _parses(ipaddress.IPv6Address, value)
        )
    if kind == "host":
        return (
            len(value) <= MAX_HOST_CHARS
            and value.lower() not in RESERVED_HOSTS
            and all(
                _HOST_LABEL.fullmatch(label) and label[2:4] != "--" for label in value.split(".")
            )
        )
    return valid_peer_id(value)


def _parses(kind: type[ipaddress.IPv4Address | ipaddress.IPv6Address], value: str) -> bool:
    try:
        kind(value)
    except ValueError:
        return False
    return True


def valid_peer_id(text: str) -> bool:
    """A peer id in its base58 text form: a sha2-256 multihash ("Qm…", a hashed key) or an
    identity one ("12D3KooW…", an inlined Ed25519 key), canonically encoded."""
    if not 0 < len(text) <= MAX_PEER_ID_CHARS or _BASE58.fullmatch(text) is None:
        return False
    digest = base58_decode(text)
    if len(digest) < 2 or base58_encode(digest) != text:
        return False
    code, length, rest = digest[0], digest[1], digest[2:]
    if code == SHA256_CODE:
        return length == SHA256_BYTES == len(rest)
    return code == IDENTITY_CODE and 0 < length == len(rest) <= MAX_IDENTITY_DIGEST_BYTES
