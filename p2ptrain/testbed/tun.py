"""Open a Linux TUN device (layer 3: every read is one IP packet, every write injects one)."""

from __future__ import annotations

import fcntl
import os
import struct

TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000  # no 4-byte packet-info header: reads/writes are bare IP packets
MAX_IFNAME_BYTES = 15


def open_tun(name: str) -> int:
    """Create the TUN device `name` and return its non-blocking fd.

    The device is not persistent: it disappears when the fd is closed (or its owner dies),
    which makes teardown automatic even after a crash.
    """
    encoded = name.encode()
    if not encoded or len(encoded) > MAX_IFNAME_BYTES:
        raise ValueError(f"interface name must be 1..{MAX_IFNAME_BYTES} bytes: {name!r}")
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        ifreq = struct.pack("16sH22x", encoded, IFF_TUN | IFF_NO_PI)
        fcntl.ioctl(fd, TUNSETIFF, ifreq)
    except OSError:
        os.close(fd)
        raise
    return fd
