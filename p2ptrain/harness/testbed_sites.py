"""Where `p2ptrain local --emulate` runs its nodes: node i (control process and worker) inside
testbed peer i's namespace, as on a machine of its own: `join` and `bootstrap` with their
default listen addresses (every interface, fixed ports), so that each announces its namespace's
address; the bootstrap beside peer 0, on its own default port. All their traffic, py-libp2p's and
p2pd's alike, crosses the emulated links, so the control plane measures the emulated network and
plans on it (and its plans carry the measured network the workers scale their timeouts for)."""

from __future__ import annotations

from p2ptrain.harness.local_run import NodeSites
from p2ptrain.testbed.testbed import Testbed


class TestbedSites(NodeSites):
    __test__ = False  # not a pytest class, whatever its name

    def __init__(self, bed: Testbed) -> None:
        self.bed = bed

    def _peer(self, index: int) -> int:
        return max(index, 0)  # the bootstrap shares peer 0's namespace

    def listen(self, index: int) -> str | None:
        return None  # the defaults, as a volunteer runs them

    def data_listen(self, index: int) -> str | None:
        return None

    def command(self, index: int, argv: list[str]) -> list[str]:
        return self.bed.command(self._peer(index), argv)
