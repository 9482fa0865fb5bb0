"""The control process: one py-libp2p host that joins, measures, gossips, elects and plans.

Tasks (all in one trio nursery): join the bootstrap and the Kademlia DHT, connect to discovered
members, probe links, publish telemetry/records/claims/plans on GossipSub with paced periodic
re-broadcast (anti-entropy: every message carries the author's full current state), run the
election and, on the planner, the scheduler; serve status to observers and the IPC socket to the
worker. Gossip validators decode and verify each message and feed it to the SwarmView.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import trio
from libp2p.abc import IHost
from libp2p.tools.anyio_service import background_trio_service

from p2ptrain import identity
from p2ptrain.control import wire
from p2ptrain.control.discovery import Discovery, make_dht
from p2ptrain.control.gossip import make_pubsub, serve_topics
from p2ptrain.control.hardware import describe_hardware
from p2ptrain.control.intake import Intake
from p2ptrain.control.ipc import IpcServer
from p2ptrain.control.measuring import LinkProber
from p2ptrain.control.planning import PlanMaker
from p2ptrain.control.publishing import (
    Publisher,
    measure_compute,
)
from p2ptrain.control.rpcs import RUN_PROTOCOL, STATUS_PROTOCOL, RpcResponder
from p2ptrain.control.state import NodeState
from p2ptrain.control.sync import SYNC_PROTOCOL, PullSync
from p2ptrain.control.view import MEMBER_ROLES, SwarmView
from p2ptrain.net import probe, rpc
from p2ptrain.net.host import full_addrs, make_host, parse_multiaddr, quiet_library_logs
from p2ptrain.runspec import RunSpec

log = logging.getLogger(__name__)

ELECTION_TICK_S = 0.5


@dataclass
class NodeConfig:
    """How to run one control process."""

    seed: bytes
    role: str  # "bootstrap", "control-only" or "trainer"
    listen_addr: str = "/ip4/127.0.0.1/tcp/0"
    bootstrap_addr: str | None = None  # None only for the bootstrap itself
    run: RunSpec | None = None  # the bootstrap publishes it; others learn it when joining
    ipc_path: str | None = None
    print_addr: bool = True


class ControlNode:
    """One peer's control plane."""

    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        peer_id = identity.peer_id_of(config.seed)
        host = make_host(config.seed)
        view = SwarmView(
            self_id=peer_id,
            role=config.role,
            planner_capable=config.role in MEMBER_ROLES,
            started_at=time.monotonic(),
            run=config.run.to_dict() if config.run else None,
        )
        parse_multiaddr(config.listen_addr)  # fail early, as a UserError
        self.state = NodeState(
            seed=config.seed,
            role=config.role,
            peer_id=peer_id,
            host=host,
            view=view,
            hardware=describe_hardware(),
        )
        self.ipc = IpcServer(config.ipc_path, self._on_ipc) if config.ipc_path else None
        self.plan_maker = PlanMaker(view, peer_id)
        self.prober = LinkProber(host, view, self.state.joined)
        self.dht = make_dht(host)
        self.discovery = Discovery(self.state, self.dht, config.bootstrap_addr)
        self.intake = Intake(self.state)
        self.pubsub, self.gossipsub = make_pubsub(host)
        self.publisher = Publisher(self.state, self.pubsub)
        self.sync = PullSync(self.state, self.intake)
        self.rpcs = RpcResponder(self.state)

    @property
    def peer_id(self) -> str:
        return self.state.peer_id

    @property
    def host(self) -> IHost:
        return self.state.host

    @property
    def view(self) -> SwarmView:
        return self.state.view

    @property
    def addrs(self) -> list[str]:
        """Our full listen multiaddrs (empty until `run` has started)."""
        return self.state.addrs

    # ------------------------------------------------------------------ lifecycle

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Run until cancelled. Prints the full multiaddr as the first stdout line if asked."""
        quiet_library_logs()
        listen = parse_multiaddr(self.config.listen_addr)
        async with self.host.run(listen_addrs=[listen]):
            self.state.addrs = full_addrs(self.host)
            self.host.set_stream_handler(probe.PING_PROTOCOL, probe.handle_ping)
            self.host.set_stream_handler(probe.BANDWIDTH_PROTOCOL, probe.handle_bandwidth)
            self.host.set_stream_handler(
                STATUS_PROTOCOL, rpc.make_handler(self.rpcs.respond_status)
            )
            self.host.set_stream_handler(RUN_PROTOCOL, rpc.make_handler(self.rpcs.respond_run))
            self.host.set_stream_handler(SYNC_PROTOCOL, rpc.make_handler(self.sync.respond_sync))
            async with (
                background_trio_service(self.dht),
                background_trio_service(self.pubsub),
                background_trio_service(self.gossipsub),
                trio.open_nursery() as nursery,
            ):
                await self.pubsub.wait_until_ready()
                await nursery.start(serve_topics, self.pubsub, self.state, self.intake)
                if self.config.print_addr:
                    print(self.addrs[0], flush=True)
                log.info(
                    "control %s (%s) listening on %s", self.peer_id, self.state.role, self.addrs
                )
                if self.ipc is not None:
                    await nursery.start(self.ipc.serve)
                    nursery.start_soon(self._serve_plans_to_worker)
                nursery.start_soon(self.discovery.join)
                nursery.start_soon(self.publisher.serve_publishing)
                nursery.start_soon(self.discovery.serve_discovery)
                nursery.start_soon(self.sync.serve_sync)
                if self.state.role in MEMBER_ROLES:
                    nursery.start_soon(measure_compute, self.state)
                    nursery.start_soon(self.prober.serve_rtt_probes)
                    nursery.start_soon(self.prober.serve_bandwidth_probes)
                    nursery.start_soon(self._serve_election)
                task_status.started()

    async def stop_worker(self) -> None:
        """Ask a connected worker to checkpoint and exit."""
        if self.ipc is not None:
            await self.ipc.send({"type": "stop"})

    async def _serve_election(self) -> None:
        await self.state.joined.wait()
        while True:
            now = time.monotonic()
            if self.view.run is not None and self.view.should_claim(now):
                term = self.view.claim()
                log.info("claiming the planner role, term %d", term)
                self.state.publish_soon("claim")
            if self.view.planner == self.peer_id and await self.plan_maker.tick(
                now, self.state.data_addrs
            ):
                self.state.publish_soon("plan")
            await trio.sleep(ELECTION_TICK_S)

    # ------------------------------------------------------------------ status, run, worker

    def _on_ipc(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        now = time.monotonic()
        if kind == "hello":
            addrs = message["data_addrs"]
            if not wire.is_addr_list(addrs):
                raise ValueError("data_addrs must be a list of <= 16 address strings")
            if message.get("peer_id") != self.peer_id:
                log.warning(
                    "worker reports peer id %s, control is %s", message.get("peer_id"), self.peer_id
                )
            self.state.data_addrs = list(addrs)
            self.state.publish_soon("record")
            log.info("worker is up with data addresses %s", self.state.data_addrs)
        elif kind == "metrics":
            self.view.own_metrics = {
                k: message.get(k) for k in ("step", "loss", "tokens_per_s", "stage", "replica")
            }
        elif kind == "throughput":
            self.view.record_bandwidth(str(message["peer"]), float(message["mbps"]), now)
        else:
            raise ValueError(f"unknown message type {kind!r}")

    async def _serve_plans_to_worker(self) -> None:
        assert self.ipc is not None
        sent_version = 0
        while True:
            if self.view.plan_version != sent_version and self.view.plan is not None:
                sent_version = self.view.plan_version
                await self.ipc.send({"type": "plan", "plan": self.view.plan, "run": self.view.run})
            await trio.sleep(0.5)


def configure_logging(level: int = logging.INFO) -> None:
    """Log lines to stderr (stdout carries only the multiaddr line)."""
    logging.basicConfig(
        level=level,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


async def run_until_signalled(
    node: ControlNode, on_stop: Callable[[], Awaitable[None]] | None = None
) -> None:
    """Run the node until SIGTERM/SIGINT, then stop cleanly."""
    import signal

    async with trio.open_nursery() as nursery:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            nursery.start_soon(node.run)
            async for signum in signals:
                log.info("received signal %d: stopping", signum)
                if on_stop is not None:
                    with trio.move_on_after(2):
                        await on_stop()
                nursery.cancel_scope.cancel()
                break


def run_node(node: ControlNode) -> None:
    """Run a node in this process until SIGTERM/SIGINT (blocking)."""
    try:
        trio.run(run_until_signalled, node, node.stop_worker)
    except* RuntimeError as group:  # py-libp2p can raise "Nursery is closed" while tearing down
        if not all("Nursery is closed" in str(e) for e in group.exceptions):
            raise
