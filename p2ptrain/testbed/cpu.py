"""Slow peers: a CPU quota per testbed peer, through a cgroup its processes are started in.

A peer with `cores` = 0.25 gets a quarter of one core's time (every process of the peer
together), so a CPU-bound step takes about 4x longer than on an idle core: a slow volunteer,
measured, not assumed. cgroup v2 (`cpu.max`) where the cpu controller is there, else v1's cpu
hierarchy (`cpu.cfs_quota_us`). A process joins its peer's cgroup before it execs into the
peer's namespace (`wrap`), so everything it starts inherits the quota.

A slow GPU is not a slow network stack: `compute` quotas hold back only a peer's processes whose
command line names its compute (the training worker): a `Mover` moves each into a cgroup of its
own as it appears, and what it starts from then on inherits that quota, while the peer's control
node keeps answering probes and gossip at full speed.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Sequence
from pathlib import Path

from p2ptrain.errors import UserError
from p2ptrain.testbed.topology_file import per_peer

CGROUP_ROOT = Path("/sys/fs/cgroup")
# CFS hands a cgroup its quota as a slice of every period: work runs at full speed until the
# slice is spent, then waits for the next period. A slow machine runs every instruction slower,
# so the period is the shortest that gives a slice of at least the kernel's smallest quota (1
# ms), and no shorter than MIN_PERIOD_US: with 40 ms periods a 0.19-core worker ran each short
# burst of a step (a micro-batch's pass, a frame) at full speed and stalled for the rest of the
# period, neither a slow machine nor something the step model can price as one; a throttled
# peer's answers also wait for at most a period.
MIN_QUOTA_US = 1_000
MIN_PERIOD_US = 5_000
NO_QUOTA_PERIOD_US = 100_000  # the kernel's default
MIN_CORES = 0.025  # a 40 ms period for the smallest quota


def period_us(cores: float) -> int:
    """The CFS period of a quota of `cores` (see MIN_PERIOD_US)."""
    return max(MIN_PERIOD_US, math.ceil(MIN_QUOTA_US / check_cores(cores)))


def cpu_root() -> tuple[Path, str]:
    """Where per-peer cgroups go and the cgroup version ('v2' or 'v1')."""
    controllers = CGROUP_ROOT / "cgroup.controllers"
    if controllers.exists() and "cpu" in controllers.read_text().split():
        return CGROUP_ROOT, "v2"
    if (CGROUP_ROOT / "cpu" / "cpu.cfs_quota_us").exists():
        return CGROUP_ROOT / "cpu", "v1"
    raise UserError("no cgroup cpu controller under /sys/fs/cgroup: CPU quotas are unavailable")


def check_cores(cores: float) -> float:
    """A quota in cores (fractions of one core's time), validated."""
    if not isinstance(cores, int | float) or isinstance(cores, bool) or not math.isfinite(cores):
        raise UserError(f"a CPU quota must be a number of cores, got {cores!r}")
    if cores < MIN_CORES:
        raise UserError(f"a CPU quota must be at least {MIN_CORES} cores, got {cores!r}")
    return float(cores)


def create(name: str) -> str:
    """A fresh cgroup for one peer (no quota yet); its path."""
    root, version = cpu_root()
    path = root / name
    path.mkdir(exist_ok=True)
    if version == "v2":
        with contextlib.suppress(OSError):  # the parent must hand the cpu controller down
            (root / "cgroup.subtree_control").write_text("+cpu")
    return str(path)


def set_quota(path: str, cores: float | None) -> None:
    """Limit the cgroup to `cores` of CPU time (None: no limit)."""
    group = Path(path)
    period = NO_QUOTA_PERIOD_US if cores is None else period_us(cores)
    quota = -1 if cores is None else max(MIN_QUOTA_US, round(cores * period))
    if (group / "cpu.max").exists():
        (group / "cpu.max").write_text(f"{'max' if quota < 0 else quota} {period}")
    else:
        # v1 checks the quota against the period it has: lift the quota before a shorter period
        (group / "cpu.cfs_quota_us").write_text("-1")
        (group / "cpu.cfs_period_us").write_text(str(period))
        (group / "cpu.cfs_quota_us").write_text(str(quota))


def remove(path: str) -> None:
    """Delete the cgroup (its processes must be gone; a leftover one keeps it, harmlessly)."""
    with contextlib.suppress(OSError):
        Path(path).rmdir()


def wrap(path: str, argv: Sequence[str]) -> list[str]:
    """argv run as a member of the cgroup: the shell joins it, then execs (same pid)."""
    procs = str(Path(path) / "cgroup.procs")
    return ["sh", "-c", 'echo $$ > "$0" && exec "$@"', procs, *argv]


def quotas_from_topology_file(path: str | Path, names: Sequence[str]) -> dict[int, float]:
    """The optional "cpu" object of a topology file: {peer name or index: cores}."""
    return per_peer(path, names, "cpu", "{peer name: cores}", check_cores)


class Mover:
    """Moves every process whose command line contains one of `matches` from each source cgroup
    into its target, polling (a moved process's later children are born in the target)."""

    def __init__(
        self, pairs: Sequence[tuple[str, str]], matches: Sequence[str], interval_s: float = 0.05
    ) -> None:
        self.pairs = list(pairs)
        self.matches = [m.encode() for m in matches]
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cgroup-mover", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def move_once(self) -> int:
        """One pass; how many processes it moved."""
        moved = 0
        for source, target in self.pairs:
            try:
                pids = (Path(source) / "cgroup.procs").read_text().split()
            except OSError:
                continue
            for pid in pids:
                try:
                    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                    if any(m in cmdline for m in self.matches):
                        (Path(target) / "cgroup.procs").write_text(pid)
                        moved += 1
                except OSError:  # it exited meanwhile
                    continue
        return moved

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.move_once()
