"""`p2ptrain doctor`'s network checks, from a throwaway identity: does the bootstrap answer, can
peers dial us back (traversal/dialback.py), what NAT are we behind (traversal/nat_probe.py), how far off is
our clock, and a rough rate and round trip to the bootstrap (net/probe.py). Whom it asks, the
bootstrap and public peers its status lists, is control/doctor_servers.py.

Each check ends as one Check: "ok", "warn" (joining works, with a caveat), "FAIL" (joining
will not work; `fix` says what to do) or "skip" (not checked: an earlier check failed).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import trio
from libp2p.abc import IHost
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo, info_from_p2p_addr

from p2ptrain import addresses
from p2ptrain.control import wire
from p2ptrain.control.doctor_servers import (
    CONNECT_TIMEOUT_S,
    Server,
    ask_dial_backs,
    bootstrap_endpoint,
    public_peers,
)
from p2ptrain.control.reachability import Opinion, server_network, verdict_of
from p2ptrain.control.rejoin import checked_run
from p2ptrain.control.rpcs import RUN_PROTOCOL
from p2ptrain.net import probe, rpc
from p2ptrain.net.address_classes import all_loopback
from p2ptrain.net.host import full_addrs, make_host, parse_multiaddr, quiet_library_logs, run_trio
from p2ptrain.net.resolve import connect_operator_peer
from p2ptrain.records import DialBackReply
from p2ptrain.traversal import nat_probe
from p2ptrain.traversal.dialback import tcp_target

CLOCK_WARN_S = 2.0
CLOCK_FAIL_S = wire.MAX_CLOCK_SKEW_S / 2  # our messages would arrive half-stale, or worse
SLOW_MBPS = 1.0
BEHIND_NAT = 'docs/operations.md, "Behind NAT"'
NETWORK_CHECKS = {
    "reachability": "reachability",
    "nat": "NAT",
    "clock": "clock skew",
    "bandwidth": "bandwidth to bootstrap",
}


@dataclass(frozen=True)
class Check:
    """One line of the doctor's report."""

    name: str
    status: str  # "ok", "warn", "FAIL" or "skip"
    text: str
    fix: str = ""

    def line(self) -> str:
        return f"{self.status:<5}{self.text}" + (f" — fix: {self.fix}" if self.fix else "")

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "status": self.status, "text": self.text, "fix": self.fix}


@dataclass
class NetworkReport:
    """The network checks' lines and the numbers behind them (for --json)."""

    checks: list[Check] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    loss_scale: float | None = None  # the run's (None: the run spec did not arrive)


def run_network_checks(
    bootstrap: str, listen: str, announce: Sequence[str], ports: tuple[int, int]
) -> NetworkReport:
    """Blocking: the checks from a host listening on `listen` (TCP port `ports[0]`; `ports` are
    the control and data ports a volunteer must forward)."""
    report = NetworkReport()

    async def main() -> None:
        await check_network(report, bootstrap, listen, announce, ports)

    run_trio(main)
    return report


async def check_network(
    report: NetworkReport,
    bootstrap: str,
    listen: str,
    announce: Sequence[str],
    ports: tuple[int, int],
) -> None:
    # what fails is our report's to say, in one line with a fix
    quiet_library_logs(logging.CRITICAL)
    logging.getLogger("libp2p").setLevel(logging.CRITICAL)
    info = info_from_p2p_addr(parse_multiaddr(bootstrap, need_peer_id=True))
    host = make_host(os.urandom(32), announce, trusted=[bootstrap])
    async with host.run(listen_addrs=[parse_multiaddr(listen)]):
        rtt_ms = await _check_bootstrap(report, host, info, bootstrap)
        if rtt_ms is None:
            for name, title in NETWORK_CHECKS.items():
                report.checks.append(Check(name, "skip", f"{title}: not checked (no bootstrap)"))
            return
        others = await public_peers(host, info.peer_id)
        servers = [Server(info.peer_id, await bootstrap_endpoint(bootstrap)), *others]
        replies, server_ips = await ask_dial_backs(host, [s.peer for s in servers])
        ours = full_addrs(host)
        networks = [server_network(ip, ours) for ip in server_ips]
        report.checks.append(_reachability(report, replies, networks, ports, all_loopback(ours)))
        report.checks.append(await _nat(report, [s.endpoint for s in servers if s.endpoint]))
        report.checks.append(_clock(report, replies[0], rtt_ms))
        report.checks.append(await _bandwidth(report, host, info.peer_id, rtt_ms))


async def _check_bootstrap(
    report: NetworkReport, host: IHost, info: PeerInfo, bootstrap: str
) -> float | None:
    """Connect, ask for the run and ping: the round trip in ms, or None (a FAIL line) if the
    bootstrap does not answer."""
    short = f"{str(info.peer_id)[:8]}…{str(info.peer_id)[-4:]}"
    try:
        with trio.fail_after(CONNECT_TIMEOUT_S):
            await connect_operator_peer(host, info)
        reply = await rpc.call(host, info.peer_id, RUN_PROTOCOL)
        rtt_ms = await probe.measure_rtt_ms(host, info.peer_id)
    except Exception as exc:
        report.checks.append(
            Check(
                "bootstrap",
                "FAIL",
                f"bootstrap does not answer at {bootstrap} ({exc or type(exc).__name__})",
                "check the address (the first line `p2ptrain bootstrap` prints, ending in "
                "/p2p/<peer id>), that the bootstrap runs, and that this machine may open TCP "
                "connections to its port",
            )
        )
        return None
    if not isinstance(reply, dict) or "envelope" not in reply:
        report.checks.append(
            Check(
                "bootstrap",
                "FAIL",
                f"the peer at {bootstrap} answers but is not a bootstrap",
                "give the bootstrap's multiaddr, the one the organiser published",
            )
        )
        return None
    run_id = "?"
    try:  # signed by the bootstrap itself, as join checks it (rejoin.checked_run); any age
        run, _ = checked_run(reply, str(info.peer_id), max_age_s=float("inf"))
        run_id, report.loss_scale = run.run_id, run.optim.loss_scale
    except wire.WireError as exc:
        if not str(exc).startswith("replayed or skewed"):  # that one, the clock line says
            report.checks.append(
                Check(
                    "bootstrap",
                    "FAIL",
                    f"the peer at {bootstrap} sent a run spec it did not sign ({exc})",
                    "give the bootstrap's multiaddr, the one the organiser published; a node "
                    "would refuse this run",
                )
            )
            return None
    report.facts.update(rtt_ms=round(rtt_ms, 2), run=run_id, bootstrap_peer=str(info.peer_id))
    text = f"bootstrap answers (run {run_id}, RTT {rtt_ms:.0f} ms, peer {short})"
    report.checks.append(Check("bootstrap", "ok", text))
    return rtt_ms


def _reachability(
    report: NetworkReport,
    replies: Sequence[DialBackReply | None],
    networks: Sequence[str | None],
    ports: tuple[int, int],
    one_machine: bool = False,
) -> Check:
    """The verdict a joined node would reach on these answers (control/reachability.py: the
    bootstrap, replies[0], and a second server on another network; `networks`, each server's
    independence key), so that doctor never says "public" where the node would not act on it."""
    outcomes = [None if r is None or r.error else r.reached for r in replies]
    opinions = [
        Opinion(str(i), networks[i], outcome, is_bootstrap=i == 0)
        for i, outcome in enumerate(outcomes)
    ]
    verdict = verdict_of(opinions, am_bootstrap=False, one_machine=one_machine)
    observed = next((r.observed for r in replies if r is not None), None)
    report.facts.update(reachability=verdict, observed=observed)
    tried = [res.addr for r in replies if r is not None for res in r.results]
    reached = sorted({res.addr for r in replies if r for res in r.results if res.ok})
    num = sum(outcome is True for outcome in outcomes)
    if verdict == "public":
        text = f"reachability: public (dialled back at {', '.join(reached)} by {num} peer(s))"
        return Check("reachability", "ok", text)
    if verdict == "unknown" and num:
        return Check(
            "reachability",
            "warn",
            f"reachability: not confirmed (dialled back at {', '.join(reached)} by {num} "
            "peer(s), but a node counts as public only when the bootstrap and a peer on "
            "another network both reach it)",
            "run doctor again once the swarm has another public peer",
        )
    if verdict == "private" and num:
        return Check(
            "reachability",
            "warn",
            f"reachability: private (the bootstrap cannot dial us back; {num} other peer(s) "
            "could, from our own network or by their word only)",
            f"let TCP {ports[0]} and {ports[1]} in from the internet ({BEHIND_NAT})",
        )
    if verdict == "private":
        where = ", ".join(sorted(set(tried))) or "any of our addresses"
        public_ip = (tcp_target(observed) or ("PUBLIC_IP", 0))[0] if observed else "PUBLIC_IP"
        control, data = ports
        # a private node trains: it dials public peers itself, and other NATed peers reach
        # it through a hole punch or a public peer's relay (control/traversal.py)
        return Check(
            "reachability",
            "warn",
            f"reachability: private (no dial-back reached {where}; {len(replies)} peer(s) "
            "tried): this node trains; other NATed peers reach it through a hole punch or a "
            "public peer's relay",
            f"for direct links to everyone (no relay in the path), let TCP {control} and "
            f"{data} in: open them in the firewall, and behind a router forward them to this "
            f"machine and join with --announce /ip4/{public_ip}/tcp/{control} ({BEHIND_NAT})",
        )
    reasons = ", ".join(sorted({r.error for r in replies if r and r.error})) or "no answer"
    return Check(
        "reachability",
        "warn",
        f"reachability: unknown (no peer gave a verdict: {reasons})",
        "run doctor again in a minute",
    )


async def _nat(report: NetworkReport, servers: list[tuple[str, int]]) -> Check:
    local_port, seen = await nat_probe.observe_from(servers)
    local_ips = [*addresses.interface_ip4s(), addresses.LOOPBACK_IP4]
    nat_type, why = nat_probe.classify_nat(local_port, local_ips, seen)
    report.facts["nat"] = nat_type
    if nat_type in ("none", "cone"):
        hint = "hole punching works" if nat_type == "cone" else "no translation"
        return Check("nat", "ok", f"NAT: {nat_type} ({why}: {hint})")
    if nat_type == "symmetric":
        return Check(
            "nat",
            "warn",
            f"NAT: symmetric ({why}: hole punching cannot work; links to other NATed peers go "
            "through a relay; forward the ports for direct ones)",
        )
    return Check("nat", "warn", f"NAT: unknown ({why})")


def _clock(report: NetworkReport, reply: DialBackReply | None, rtt_ms: float) -> Check:
    if reply is None:
        return Check("clock", "warn", "clock skew: unknown (the bootstrap gave no time)")
    # the reply left the bootstrap about half a round trip ago
    skew_s = reply.time_s - (time.time() - rtt_ms / 2000)
    report.facts["clock_skew_s"] = round(skew_s, 3)
    text = (
        f"clock skew {abs(skew_s):.2f} s ({'behind' if skew_s > 0 else 'ahead of'} the bootstrap)"
    )
    if abs(skew_s) < CLOCK_WARN_S:
        return Check("clock", "ok", text)
    fix = "synchronise this machine's clock (NTP: `timedatectl set-ntp true`)"
    status = "FAIL" if abs(skew_s) >= CLOCK_FAIL_S else "warn"
    return Check("clock", status, f"{text}: signed messages expire after 30 s", fix)


async def _bandwidth(report: NetworkReport, host: IHost, peer: ID, rtt_ms: float) -> Check:
    try:
        mbps = await probe.measure_bandwidth_mbps(host, peer, rtt_s=rtt_ms / 1000)
    except Exception as exc:
        return Check("bandwidth", "warn", f"bandwidth to bootstrap: not measured ({exc})")
    report.facts["bandwidth_mbps"] = round(mbps, 1)
    text = f"bandwidth to bootstrap ~{mbps:.0f} Mbit/s, RTT {rtt_ms:.0f} ms"
    if mbps < SLOW_MBPS:
        return Check("bandwidth", "warn", f"{text}: slow (the planner may keep this peer spare)")
    return Check("bandwidth", "ok", text)
