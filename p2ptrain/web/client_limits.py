"""What one dashboard client may cost (web/server.py): slots, a share of them per address, a
request's head in bytes, and how slow it may be before it is reset. Stdlib only."""

from __future__ import annotations

import ipaddress
import threading
from dataclasses import dataclass
from typing import Any

MAX_CONNECTIONS = 32  # open at once; more are closed at once
# from one address other than loopback (an exposed dashboard: one client polling on kept-alive
# connections held every slot); local viewers all come from loopback
MAX_CONNECTIONS_PER_SOURCE = 8
SOCKET_TIMEOUT_S = 10.0  # a client that sends nothing for this long is dropped
# a request line and headers together (a browser's are ~1 kB): the standard library reads up to
# 100 lines of 64 KiB and parses them whole, ~6 MB a connection; past this it reads end of file
MAX_REQUEST_HEAD_BYTES = 16 * 1024


@dataclass(frozen=True)
class Limits:
    """How slow a client may be before it is reset."""

    # a request must arrive (and a reply start) within this: the page polls once a second
    request_deadline_s: float = 5.0
    # and a reply be read at least this fast (a large swarm's status is tens of MB)
    min_read_bytes_per_s: float = 256 * 1024


class SourceShares:
    """The connections each address other than loopback holds, MAX_CONNECTIONS_PER_SOURCE at
    most (`take` a client's address before serving it, `give` it back after)."""

    def __init__(self) -> None:
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()

    def take(self, client_address: Any) -> bool:
        source = str(client_address[0])
        if is_loopback(source):
            return True
        with self._lock:
            if self._held.get(source, 0) >= MAX_CONNECTIONS_PER_SOURCE:
                return False
            self._held[source] = self._held.get(source, 0) + 1
            return True

    def give(self, client_address: Any) -> None:
        source = str(client_address[0])
        with self._lock:
            left = self._held.get(source, 0) - 1
            if left > 0:
                self._held[source] = left
            else:
                self._held.pop(source, None)


class BoundedLines:
    """A request's reader that gives out `left` bytes of lines, then end of file: a head past
    MAX_REQUEST_HEAD_BYTES ends as a request whose headers stop there (refused, unless what
    came was whole), and the connection with it."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw
        self.left = MAX_REQUEST_HEAD_BYTES

    def readline(self, limit: int = -1) -> bytes:
        allowed = self.left if limit < 0 else min(limit, self.left)
        if allowed <= 0:
            return b""
        line: bytes = self.raw.readline(allowed)
        self.left -= len(line)
        return line

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)


def is_loopback(address: str) -> bool:
    """Is a client's address a loopback one (this machine's viewers)?"""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)  # an IPv4 viewer of a dual-stack listen
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)
