"""The control process: one py-libp2p host whose pieces join, measure, gossip, sync, elect and plan.

This module only wires them: it builds the host, the SwarmView, the DHT and GossipSub, gives each
piece the shared NodeState, and runs them all in one trio nursery. The pieces, one concept each:
discovery (joining, the DHT, dialling members), gossip (topics and the validator that feeds the
view through intake), sync (pull anti-entropy), publishing (what we author, paced and periodically
re-broadcast), rpcs (status and run), measuring (link probes), election (claims and plans),
reachability (dial-back rounds; with the UDP address observer, what `p2ptrain doctor` asks) and
worker_link (the IPC socket to the worker).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import trio
from libp2p.abc import IHost
from libp2p.peer.id import ID
from libp2p.tools.anyio_service import background_trio_service

from p2ptrain import addresses, identity, procs
from p2ptrain.control import rejoin
from p2ptrain.control.authored import plan_message
from p2ptrain.control.dashboard import DashboardFeed
from p2ptrain.control.dht_store import make_dht
from p2ptrain.control.discovery import Discovery
from p2ptrain.control.election import serve_election
from p2ptrain.control.gossip import make_pubsub, serve_topics
from p2ptrain.control.handover import hand_over
from p2ptrain.control.hardware import describe_hardware
from p2ptrain.control.health import serve_health
from p2ptrain.control.intake import Intake
from p2ptrain.control.loop_stall import LOGGED_STALL_S, TICK_S
from p2ptrain.control.measuring import LinkProber
from p2ptrain.control.plan_pull import PLAN_PROTOCOL, PlanPull
from p2ptrain.control.publishing import Publisher, measure_compute
from p2ptrain.control.reachability import ReachabilityMonitor
from p2ptrain.control.relay_service import OFFER_PROTOCOL, RELAY_PROTOCOL, RelayService
from p2ptrain.control.rpcs import RUN_PROTOCOL, STATUS_PROTOCOL, RpcResponder
from p2ptrain.control.run_watch import RunWatch
from p2ptrain.control.settings import HANDOVER_LIMIT_FILE
from p2ptrain.control.state import NodeState
from p2ptrain.control.sync import SYNC_PROTOCOL, PullSync
from p2ptrain.control.traversal import Traversal
from p2ptrain.control.view import MEMBER_ROLES, SwarmView
from p2ptrain.control.worker_link import WorkerLink
from p2ptrain.errors import UserError, first_leaf
from p2ptrain.net import probe, rpc
from p2ptrain.net.host import (
    connection_ips,
    full_addrs,
    listen_endpoint,
    make_host,
    parse_multiaddr,
    quiet_library_logs,
    run_trio,
)
from p2ptrain.records import RunSpec, Token
from p2ptrain.sampled_log import SampledLog
from p2ptrain.traversal import dialback, nat_probe

log = logging.getLogger(__name__)
_stalls = SampledLog(log, logging.WARNING)  # our loop's long stalls (serve_heartbeat)

# at most this long to tell the others we stop (the 1 s floor, then one publish), well within
# the supervisor's grace (node/supervisor.py: STOP_GRACE_S)
LEAVE_NOTICE_S = 3.0


@dataclass
class NodeConfig:
    """How to run one control process."""

    seed: bytes
    role: str  # "bootstrap", "control-only" or "trainer"
    listen_addr: str = "/ip4/127.0.0.1/tcp/0"
    announce: tuple[str, ...] = ()  # what others dial (default: derived from listen_addr)
    bootstrap_addr: str | None = None  # None only for the bootstrap itself
    via: tuple[str, ...] = ()  # members' full multiaddrs, to join through while it is down
    run: RunSpec | None = None  # the bootstrap publishes it; others learn it when joining
    ipc_path: str | None = None
    print_addr: bool = True
    print_progress: bool = True  # a line per step of our worker on stdout (control/progress.py)
    token: Token | None = None  # the organiser's word that we may join, and maybe plan
    revocations_path: str | None = None  # the bootstrap's --revoked file
    http: str | None = None  # --http [HOST:]PORT: serve the dashboard (control/dashboard.py)


class ControlNode:
    """One peer's control plane: its pieces, built around one NodeState."""

    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        # fail early, as a UserError (Discovery checks the bootstrap_addr)
        parse_multiaddr(config.listen_addr)
        addresses.check_announce(config.announce, "--announce")
        peer_id = identity.peer_id_of(config.seed)
        view = SwarmView(
            self_id=peer_id,
            role=config.role,
            planner_capable=config.role in MEMBER_ROLES,
            started_at=time.monotonic(),
            run=config.run,
            own_token=config.token,
        )
        # telemetry's audience (control/gossip.py): the organiser and the planner candidates
        planner_token = config.token is not None and config.token.planner
        view.hears_telemetry = config.role == "bootstrap" or planner_token

        # the run's members (admitted records, the organiser): they keep room strangers cannot
        # take, in the inbound stream limits, in a full peerstore and in dial-back budgets
        def is_member(peer: str) -> bool:
            return peer in view.members or peer == view.bootstrap_id

        self.state = NodeState(
            seed=config.seed,
            role=config.role,
            peer_id=peer_id,
            host=make_host(config.seed, config.announce, keeps=is_member),
            view=view,
            hardware=describe_hardware(),
            revocations_path=config.revocations_path,
        )
        self.dht = make_dht(self.host)
        # relays serve admitted members only (their records passed the organiser's token)
        self.relay_service = RelayService(self.state, lambda peer: peer in view.members)
        self.traversal = Traversal(self.state)
        view.members.when_forgotten(self.traversal.forget)  # a member's routes go with it
        self.discovery = Discovery(
            self.state,
            self.dht,
            config.bootstrap_addr,
            self.traversal.pin_if_routed,
            rejoin.path_beside(config.ipc_path),  # a restart rejoins without the bootstrap
            config.via,
        )
        self.pubsub, self.gossipsub = make_pubsub(self.host)
        self.intake = Intake(self.state, self._score_penalty)
        self.sync = PullSync(self.state, self.intake)
        self.plan_pull = PlanPull(self.state, partial(plan_message, self.state), self.intake.apply)
        self.intake.wants_plan = self.plan_pull.want
        self.publisher = Publisher(self.state, self.pubsub)
        self.rpcs = RpcResponder(self.state)
        self.inbound_limits = rpc.InboundLimits(is_member=is_member)
        self.prober = LinkProber(self.host, view, self.state.joined)
        self.dial_back_server = dialback.DialBackServer(lambda: self.state.addrs, is_member)
        self.reachability = ReachabilityMonitor(self.state)
        self.dashboard = None if config.http is None else DashboardFeed(config.http)
        self.run_watch = RunWatch(self.state, config.print_progress)
        self.worker_link = (
            WorkerLink(
                self.state, config.ipc_path, config.print_progress, self.traversal.data_routes
            )
            if config.ipc_path
            else None
        )

    @property
    def peer_id(self) -> str:
        return self.state.peer_id

    @property
    def host(self) -> IHost:
        return self.state.host

    @property
    def view(self) -> SwarmView:
        return self.state.view

    def _score_penalty(self, peer: str, amount: float) -> None:
        """Our penalty, as a GossipSub behaviour penalty (control/gossip.py: SCORE_PARAMS), for a
        peer GossipSub talks to only: py-libp2p drops a peer's entry only when that peer leaves
        (GossipSub.remove_peer) and walks them all every heartbeat, so an author that never
        connected (a throwaway key) would stay there for good, and it scores only its peers."""
        scorer, peer_id = self.gossipsub.scorer, ID.from_base58(peer)
        if scorer is not None and peer_id in self.pubsub.peers:
            scorer.penalize_behavior(peer_id, amount)

    @property
    def addrs(self) -> list[str]:
        """Our full listen multiaddrs (empty until `run` has started)."""
        return self.state.addrs

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Run until cancelled. Prints the full multiaddr as the first stdout line if asked."""
        quiet_library_logs()
        state, host = self.state, self.host
        listen = parse_multiaddr(self.config.listen_addr)
        async with host.run(listen_addrs=[listen]):
            state.addrs = full_addrs(host)
            guard = self.inbound_limits.guard  # one set of caps over all our protocols
            ping = partial(probe.handle_ping, trailer=self.prober.coordinate_trailer)
            host.set_stream_handler(probe.PING_PROTOCOL, guard(ping))
            host.set_stream_handler(probe.BANDWIDTH_PROTOCOL, guard(probe.handle_bandwidth))
            host.set_stream_handler(dialback.DIALBACK_PROTOCOL, guard(self.dial_back_server.handle))
            host.set_stream_handler(RELAY_PROTOCOL, guard(self.relay_service.handle_request))
            host.set_stream_handler(OFFER_PROTOCOL, guard(self.traversal.handle_offer))
            for protocol, respond in (
                (STATUS_PROTOCOL, self.rpcs.respond_status),
                (RUN_PROTOCOL, self.rpcs.respond_run),
                (SYNC_PROTOCOL, self.sync.respond_sync),
                (PLAN_PROTOCOL, self.plan_pull.respond),
            ):
                host.set_stream_handler(protocol, guard(rpc.make_handler(respond)))
            async with (
                background_trio_service(self.dht),
                background_trio_service(self.pubsub),
                background_trio_service(self.gossipsub),
                trio.open_nursery() as nursery,
            ):
                await self.pubsub.wait_until_ready()
                await nursery.start(serve_topics, self.pubsub, state, self.intake)
                endpoint = listen_endpoint(host)
                if endpoint is not None:  # UDP on our TCP port number: no new port to open
                    # connected peers (a doctor) keep answers spoofed floods cannot spend
                    connected = partial(connection_ips, host)
                    await nursery.start(nat_probe.serve_udp_observer, *endpoint, connected)
                # the relay port: on our control host's interfaces, its own port
                # the relay port: beside the configured control port (none beside port 0)
                configured = addresses.tcp_endpoint(self.config.listen_addr)
                await nursery.start(
                    self.relay_service.serve,
                    endpoint[0] if endpoint else "0.0.0.0",
                    configured[1] if configured else 0,
                )
                await nursery.start(self.traversal.serve)
                if self.config.print_addr:
                    print(state.addrs[0], flush=True)
                log.info("control %s (%s) listening on %s", state.peer_id, state.role, state.addrs)
                if self.worker_link is not None:
                    await nursery.start(self.worker_link.serve_worker)
                nursery.start_soon(self.discovery.join)
                nursery.start_soon(self.publisher.serve_publishing)
                nursery.start_soon(self.discovery.serve_discovery)
                nursery.start_soon(self.sync.serve_sync)
                nursery.start_soon(self.plan_pull.serve)
                nursery.start_soon(self.reachability.serve_reachability)
                nursery.start_soon(self.run_watch.serve)
                nursery.start_soon(serve_heartbeat, state)
                if self.dashboard is not None:
                    nursery.start_soon(self.dashboard.serve, state.view)
                if state.is_member:
                    nursery.start_soon(measure_compute, state)
                    nursery.start_soon(self.prober.serve_rtt_probes)
                    nursery.start_soon(self.prober.serve_bandwidth_probes)
                    nursery.start_soon(serve_election, state)
                    nursery.start_soon(
                        serve_health, state.view, state.worker, state.publish_soon, state.clock
                    )
                task_status.started()

    async def stop_worker(self) -> None:
        """Ask a connected worker to checkpoint and exit."""
        if self.worker_link is not None:
            await self.worker_link.stop_worker()


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
    """Run the node until SIGTERM/SIGINT or until it has nothing left to do (NodeState.stopping:
    the run is finished), then stop cleanly."""
    import signal

    stopping, hurry = node.state.stopping, trio.Event()

    async def stop_on_signal(signals: AsyncIterator[int]) -> None:
        async for signum in signals:  # the first stops the node; another cuts a hand-over short
            log.info("received signal %d: stopping", signum)
            if stopping.is_set():
                hurry.set()
            stopping.set()

    async with trio.open_nursery() as nursery:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            nursery.start_soon(node.run)
            nursery.start_soon(stop_on_signal, signals)
            await stopping.wait()
            with trio.move_on_after(LEAVE_NOTICE_S) as notice:
                await node.publisher.announce_leaving()
            if notice.cancelled_caught:
                log.info("could not tell the others we stop within %.0f s", LEAVE_NOTICE_S)
            ipc = node.config.ipc_path  # the supervisor reads the hand-over's limit beside it
            limit_file = None if ipc is None else Path(ipc).parent / HANDOVER_LIMIT_FILE
            handed_over_under = await hand_over(node.state, hurry, limit_file)
            with trio.move_on_after(LEAVE_NOTICE_S):
                await node.publisher.announce_exit(handed_over_under)
            if on_stop is not None:
                with trio.move_on_after(2):
                    await on_stop()
            nursery.cancel_scope.cancel()


def run_node(node: ControlNode) -> int:
    """Run a node in this process until SIGTERM/SIGINT (blocking); the exit code: 2 if the run
    refused us (its one-line reason logged)."""
    procs.raise_open_file_limit()  # every connection and stream costs a descriptor
    refused: list[BaseException] = []
    try:
        run_trio(run_until_signalled, node, node.stop_worker)
    except* UserError as group:
        refused.append(first_leaf(group))
    if refused:
        print(f"p2ptrain: error: {refused[0]}", file=sys.stderr, flush=True)
        return 2
    if not node.state.stopping.is_set():
        # ended unasked (run_trio passed py-libp2p's teardown race mid-run): 0 would read as
        # "finished" and the supervisor would stop the node, its worker too; 1 restarts us
        log.warning("the control process ended without being asked to: exiting 1")
        return 1
    return 0


async def serve_heartbeat(state: NodeState) -> None:
    """Note how late the loop wakes from each short sleep: our own stalls widen the members'
    allowed silence (control/loop_stall.py), and a long one is logged (sampled): a node the
    others called dead says why."""
    stall = state.view.members.loop_stall
    while True:
        if (stalled_s := stall.beat(state.clock())) >= LOGGED_STALL_S:
            _stalls.event("stall", "this node's event loop stood still for %.1f s", stalled_s)
        await trio.sleep(TICK_S)
