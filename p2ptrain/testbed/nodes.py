"""Where `p2ptrain local --emulate` runs its nodes: node i (control process and worker) inside
testbed peer i's namespace, listening on its address; the bootstrap beside peer 0. All their
traffic, py-libp2p's and p2pd's alike, crosses the emulated links, so the control plane measures
the emulated network and plans on it."""

from __future__ import annotations

from p2ptrain.node.local_run import NodeSites
from p2ptrain.testbed.swarm import LISTEN_HOST_ENV, MAX_RTT_ENV, MIN_RATE_ENV
from p2ptrain.testbed.testbed import Testbed


class TestbedSites(NodeSites):
    __test__ = False  # not a pytest class, whatever its name

    def __init__(self, bed: Testbed) -> None:
        self.bed = bed
        links = bed.links().values()
        # what the averaging timeouts are scaled for (p2ptrain/worker/averaging.py)
        self.network = {
            MAX_RTT_ENV: f"{max((2 * s.delay_ms / 1e3 for s in links), default=0.0):.4f}",
            MIN_RATE_ENV: f"{min((s.rate_mbps for s in links), default=1000.0):.3f}",
        }

    def _peer(self, index: int) -> int:
        return max(index, 0)  # the bootstrap shares peer 0's namespace

    def listen(self, index: int) -> str:
        return f"/ip4/{self.bed.address(self._peer(index))}/tcp/0"

    def command(self, index: int, argv: list[str]) -> list[str]:
        return self.bed.command(self._peer(index), argv)

    def env(self, index: int) -> dict[str, str]:
        return {LISTEN_HOST_ENV: self.bed.address(self._peer(index)), **self.network}
