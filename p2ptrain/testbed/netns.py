"""Thin wrappers over `ip netns` (iproute2): create, configure, list pids, delete."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Sequence

from p2ptrain.errors import UserError

IP = "ip"


class RootRequired(UserError):
    """The testbed needs root (network namespaces, TUN devices)."""


def require_root() -> None:
    """Raise RootRequired (a UserError: the CLI exits 2) unless running as root."""
    if os.geteuid() != 0:
        raise RootRequired(
            "the testbed needs root (network namespaces and TUN devices); run as root"
        )


def ip(*args: str, netns: str | None = None) -> None:
    """Run one `ip` command (inside netns when given); raise with its stderr on failure."""
    argv = [IP, "-n", netns, *args] if netns else [IP, *args]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")


def in_netns(netns: str, argv: Sequence[str]) -> list[str]:
    """The argv that runs argv inside netns."""
    return [IP, "netns", "exec", netns, *argv]


def list_netns() -> list[str]:
    """Names of all network namespaces known to `ip netns`."""
    done = subprocess.run([IP, "netns", "list"], capture_output=True, text=True, check=False)
    return [line.split()[0] for line in done.stdout.splitlines() if line.strip()]


def netns_pids(netns: str) -> list[int]:
    """PIDs of the processes inside netns."""
    done = subprocess.run([IP, "netns", "pids", netns], capture_output=True, text=True, check=False)
    return [int(p) for p in done.stdout.split() if p.isascii() and p.isdigit()]


def delete_netns(netns: str) -> None:
    """Kill everything inside netns, then delete it (a process inside would keep it alive)."""
    for pid in netns_pids(netns):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)
    subprocess.run([IP, "netns", "del", netns], capture_output=True, check=False)
