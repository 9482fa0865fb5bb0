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
from libp2p.custom_types import TProtocol
from libp2p.kad_dht.kad_dht import DHTMode, KadDHT
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo, info_from_p2p_addr
from libp2p.records.validator import Validator
from libp2p.tools.anyio_service import background_trio_service
from multiaddr import Multiaddr

from p2ptrain import identity
from p2ptrain.control import wire
from p2ptrain.control.gossip import make_pubsub, serve_topics
from p2ptrain.control.hardware import describe_hardware
from p2ptrain.control.intake import Intake
from p2ptrain.control.ipc import IpcServer
from p2ptrain.control.measuring import LinkProber
from p2ptrain.control.planning import PlanMaker
from p2ptrain.control.publishing import (
    Publisher,
    measure_compute,
    record_message,
    run_message,
)
from p2ptrain.control.state import NodeState
from p2ptrain.control.status import swarm_status
from p2ptrain.control.sync import SYNC_PROTOCOL, PullSync
from p2ptrain.control.view import MEMBER_ROLES, SwarmView
from p2ptrain.net import probe, rpc
from p2ptrain.net.host import full_addrs, make_host, parse_multiaddr, quiet_library_logs
from p2ptrain.runspec import RunSpec

log = logging.getLogger(__name__)

STATUS_PROTOCOL = TProtocol("/p2ptrain/status/1.0.0")
RUN_PROTOCOL = TProtocol("/p2ptrain/run/1.0.0")
DHT_NAMESPACE = "p2ptrain"

DISCOVERY_INTERVAL_S = 3.0
DHT_REFRESH_INTERVAL_S = 30.0
DHT_PUT_INTERVAL_S = 60.0
DHT_RECORD_MAX_AGE_S = 3600.0
CONNECT_TIMEOUT_S = 5.0
REDIAL_BACKOFF_S = 10.0
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


class _SignedRecordValidator(Validator):
    """DHT values under /p2ptrain/ are signed envelopes; the newest seq wins."""

    def validate(self, key: str, value: bytes) -> None:
        env = wire.decode(value, max_age_s=DHT_RECORD_MAX_AGE_S)  # raises WireError (ValueError)
        if not key.endswith(f"/{env.author}") and not (key.endswith("/run") and env.kind == "run"):
            raise wire.WireError(f"forged: {env.kind} by {env.author} stored under {key}")

    def select(self, key: str, values: list[bytes]) -> int:
        def seq(value: bytes) -> int:
            try:
                return wire.decode(value, max_age_s=DHT_RECORD_MAX_AGE_S).seq
            except wire.WireError:
                return -1

        return max(range(len(values)), key=lambda i: seq(values[i]))


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
        self.bootstrap_peer: ID | None = None
        if config.bootstrap_addr:
            info = info_from_p2p_addr(parse_multiaddr(config.bootstrap_addr, need_peer_id=True))
            self.bootstrap_peer = info.peer_id
            view.bootstrap_id = info.peer_id.to_base58()
        elif config.role == "bootstrap":
            view.bootstrap_id = peer_id
        self.state = NodeState(
            seed=config.seed,
            role=config.role,
            peer_id=peer_id,
            host=host,
            view=view,
            hardware=describe_hardware(),
        )
        self.ipc = IpcServer(config.ipc_path, self._on_ipc) if config.ipc_path else None
        self._last_dial: dict[str, float] = {}
        self.plan_maker = PlanMaker(view, peer_id)
        self.prober = LinkProber(host, view, self.state.joined)
        self.dht = KadDHT(host, DHTMode.SERVER, max_peers_per_subnet=0)
        self.dht.register_validator(DHT_NAMESPACE, _SignedRecordValidator())
        self.intake = Intake(self.state)
        self.pubsub, self.gossipsub = make_pubsub(host)
        self.publisher = Publisher(self.state, self.pubsub)
        self.sync = PullSync(self.state, self.intake)

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
            self.host.set_stream_handler(STATUS_PROTOCOL, rpc.make_handler(self._respond_status))
            self.host.set_stream_handler(RUN_PROTOCOL, rpc.make_handler(self._respond_run))
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
                nursery.start_soon(self._join)
                nursery.start_soon(self.publisher.serve_publishing)
                nursery.start_soon(self._serve_discovery)
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

    # ------------------------------------------------------------------ joining and discovery

    async def _join(self) -> None:
        if self.bootstrap_peer is None:
            self.state.joined.set()
            return
        info = info_from_p2p_addr(parse_multiaddr(self.config.bootstrap_addr or ""))
        delay_s = 0.5
        while True:
            try:
                with trio.fail_after(CONNECT_TIMEOUT_S):
                    await self.host.connect(info)
                await self._fetch_run()
                break
            except Exception as exc:
                log.warning("cannot reach bootstrap %s yet: %s", info.peer_id, exc or type(exc))
                await trio.sleep(delay_s)
                delay_s = min(delay_s * 2, 5.0)
        await self.dht.add_peer(info.peer_id)
        log.info(
            "joined via bootstrap %s, run %s", info.peer_id, (self.view.run or {}).get("run_id")
        )
        self.state.joined.set()
        await self._refresh_dht()

    async def _fetch_run(self) -> None:
        assert self.bootstrap_peer is not None
        reply = await rpc.call(self.host, self.bootstrap_peer, RUN_PROTOCOL)
        env = wire.decode(str(reply["envelope"]).encode())
        if env.kind != "run" or env.author != self.view.bootstrap_id:
            raise wire.WireError("forged: run spec not signed by the bootstrap")
        self.view.run = env.body

    async def _refresh_dht(self) -> None:
        with trio.move_on_after(10):
            try:
                await self.dht.refresh_routing_table()
            except Exception as exc:
                log.info("DHT refresh failed: %s", exc)

    async def _serve_discovery(self) -> None:
        """Dial members we know of (gossiped records, DHT routing table) but are not connected to."""
        await self.state.joined.wait()
        last_refresh = last_put = time.monotonic()
        await self._put_record_in_dht()
        while True:
            await trio.sleep(DISCOVERY_INTERVAL_S)
            now = time.monotonic()
            connected = {p.to_base58() for p in self.host.get_connected_peers()}
            wanted = set()
            for peer, member in list(self.view.members.items()):
                if member.record.get("role") not in MEMBER_ROLES and peer != self.view.bootstrap_id:
                    continue
                if peer in connected or now - self._last_dial.get(peer, -1e9) < REDIAL_BACKOFF_S:
                    continue
                wanted.add(peer)
            for peer_id in self.dht.routing_table.get_peer_ids():
                peer = peer_id.to_base58()
                if (
                    peer not in connected
                    and now - self._last_dial.get(peer, -1e9) >= REDIAL_BACKOFF_S
                ):
                    wanted.add(peer)
            wanted.discard(self.peer_id)
            if wanted:
                async with trio.open_nursery() as nursery:
                    for peer in wanted:
                        self._last_dial[peer] = now
                        nursery.start_soon(self._dial, peer)
            if now - last_refresh > DHT_REFRESH_INTERVAL_S:
                last_refresh = now
                await self._refresh_dht()
            if now - last_put > DHT_PUT_INTERVAL_S:
                last_put = now
                await self._put_record_in_dht()

    async def _dial(self, peer: str) -> None:
        peer_id = ID.from_base58(peer)
        member = self.view.members.get(peer)
        if member is not None:
            addrs = [Multiaddr(a) for a in member.record.get("addrs", [])]
            self.host.get_peerstore().add_addrs(peer_id, addrs, 3600)
        if not self.host.get_peerstore().addrs(peer_id):
            return
        with trio.move_on_after(CONNECT_TIMEOUT_S):
            try:
                await self.host.connect(PeerInfo(peer_id, self.host.get_peerstore().addrs(peer_id)))
            except Exception as exc:
                log.debug("dial %s failed: %s", peer, exc)

    async def _put_record_in_dht(self) -> None:
        """Our signed record under /p2ptrain/peer/<id>; the bootstrap also puts /p2ptrain/run."""
        puts = [(f"/{DHT_NAMESPACE}/peer/{self.peer_id}", record_message(self.state))]
        if self.state.role == "bootstrap" and self.view.run is not None:
            puts.append((f"/{DHT_NAMESPACE}/run", run_message(self.state)))
        for key, value in puts:
            with trio.move_on_after(10):
                try:
                    await self.dht.put_value(key, value)
                except Exception as exc:
                    log.info("DHT put of %s failed: %s", key, exc)

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

    async def _respond_status(self, request: bytes) -> dict[str, Any]:
        return swarm_status(self.view, time.monotonic())

    async def _respond_run(self, request: bytes) -> dict[str, Any]:
        if self.state.role != "bootstrap" or self.view.run is None:
            return {"error": "not a bootstrap"}
        return {"envelope": run_message(self.state).decode()}

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
