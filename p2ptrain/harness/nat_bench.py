"""`p2ptrain bench nat`: a swarm whose volunteers sit behind emulated NATs trains to the end.

A bootstrap and N `join` nodes in the WAN testbed (as `local --emulate` runs them), some behind
cone NATs and some behind symmetric ones; nobody forwards a port. At the end a status from a
public node says how each link's bytes travel (direct, hole-punched, relayed: control/traversal.py)
and the relays say how much they carried. With `kill_relay_at`, the bootstrap (every NATed
peer's first relay) is killed at that step and the run must go on through the other relays.
With `baseline`, the same steps run again with every peer public, for the loss to compare.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from p2ptrain import identity, procs
from p2ptrain.flags import python_module
from p2ptrain.records import RunSpec, SwarmStatus
from p2ptrain.testbed.links import DEFAULT_BANDWIDTH_SCALE

DEFAULT_NATS = ("none",) * 3 + ("cone",) * 3 + ("symmetric",) * 2
DEFAULT_CITIES = ["Virginia", "Ohio"]
STATUS_TIMEOUT_S = 60.0
STATUS_STEPS_AFTER_KILL = 3  # the routes through the killed relay are re-made by then
KINDS = ("direct", "holepunched", "relayed")


@dataclass(frozen=True)
class NatSwarm:
    """The swarm of one run: each peer's NAT, and where the peers are (city_topology)."""

    nats: tuple[str, ...]
    cities: tuple[str, ...] = tuple(DEFAULT_CITIES)
    seed: int = 0
    bandwidth_scale: float = DEFAULT_BANDWIDTH_SCALE


def run_nat_bench(
    spec: RunSpec,
    swarm: NatSwarm,
    workdir: Path,
    kill_relay_at: int | None,
    baseline: bool,
    progress: Callable[[str], None],
) -> dict[str, Any]:
    """One NATed run (and, with `baseline`, an all-public one of the same steps)."""
    natted = _run_swarm(spec, swarm, workdir / "nat", kill_relay_at, progress)
    result: dict[str, Any] = dict(natted)
    if baseline:
        public_swarm = replace(swarm, nats=("none",) * len(swarm.nats))
        public = _run_swarm(spec, public_swarm, workdir / "public", None, progress)
        result["baseline_loss"] = public["loss"]
        result["baseline_tokens_per_s"] = public["tokens_per_s"]
    result["checks"] = _checks(result, swarm.nats, baseline)
    result["pass"] = all(result["checks"].values())
    return result


def _run_swarm(
    spec: RunSpec,
    swarm: NatSwarm,
    workdir: Path,
    kill_relay_at: int | None,
    progress: Callable[[str], None],
) -> dict[str, Any]:
    from p2ptrain.harness.local_run import train_with_control_plane
    from p2ptrain.harness.testbed_sites import TestbedSites
    from p2ptrain.schedule.synthetic import city_topology
    from p2ptrain.testbed.testbed import Testbed

    workdir.mkdir(parents=True, exist_ok=True)
    nats = swarm.nats
    num_peers = len(nats)
    topology = city_topology(num_peers, 1, num_peers, swarm.seed, list(swarm.cities))
    nat = {i: kind for i, kind in enumerate(nats) if kind != "none"}
    started: dict[str, Any] = {}
    seen: dict[str, Any] = {"relay_bytes_of_killed": 0}
    label = "NATed" if nat else "all-public"

    def on_started(address: str, nodes: list[subprocess.Popen[bytes]]) -> None:
        started.update(address=address, nodes=nodes)

    with Testbed.from_topology(topology, bandwidth_scale=swarm.bandwidth_scale, nat=nat) as bed:
        sites = TestbedSites(bed)
        peer_addr = _peer0_address(bed, workdir)

        def status(address: str) -> SwarmStatus | None:
            argv = python_module("p2ptrain", "status", "--bootstrap", address, "--json")
            try:
                done = subprocess.run(
                    sites.command(0, argv), capture_output=True, text=True, timeout=STATUS_TIMEOUT_S
                )
                return SwarmStatus.from_dict(json.loads(done.stdout))
            except Exception as exc:
                why = done.stderr.strip()[-500:] if "done" in locals() else ""
                progress(f"status from {address} failed: {exc!r} {why}")
                return None

        def on_step(step: int, loss: float, tokens_per_s: float) -> None:
            progress(f"{label} step {step}: loss {loss:.3f}, {tokens_per_s:.0f} tokens/s")
            # with the bootstrap gone peer 0 answers; a trainer stops after its last step (a
            # first stage, ahead of the others, several steps before the run ends): asked from
            # STATUS_STEPS_AFTER_KILL steps after the kill on, until it answers
            killed_at = kill_relay_at if "killed" in seen else None
            if killed_at is not None and step >= killed_at + STATUS_STEPS_AFTER_KILL:
                seen["status"] = seen.get("status") or status(peer_addr)
            if kill_relay_at is not None and step == kill_relay_at and "killed" not in seen:
                before = status(started["address"])
                seen["relay_bytes_of_killed"] = 0 if before is None else before.relay_bytes
                procs.kill_group(started["nodes"][0])
                seen["killed"] = time.monotonic()
                progress(f"killed the bootstrap (the first relay) after step {step}")

        def before_stop() -> None:
            if "killed" not in seen:  # the bootstrap outlives the run
                seen["status"] = status(started["address"])

        progress(f"{label} swarm: {num_peers} peers, NATs {list(nats)}")
        result = train_with_control_plane(
            spec,
            num_peers,
            workdir,
            lambda plan: None,
            on_step,
            sites,
            on_started=on_started,
            before_stop=before_stop,
        )
    ids = [
        identity.peer_id_of(identity.load_identity(workdir / f"peer-{i}.key"))
        for i in range(num_peers)
    ]
    final: SwarmStatus | None = seen.get("status")
    return {
        "peers": _peers(ids, nats, result.plan.peers(), final),
        "steps": result.steps,
        "loss": result.loss,
        "relay_bytes": _relay_bytes(final, seen["relay_bytes_of_killed"], ids),
        "averaging": result.averaging,
        "tokens_per_s": result.tokens_per_s,
        "wall_s": result.wall_s,
        "relay_killed_at_step": kill_relay_at if "killed" in seen else None,
        "processes_left": procs.count_matching(str(workdir)),
    }


def _peer0_address(bed: Any, workdir: Path) -> str:
    """Peer 0's control address (public, `join`'s default port): asked once the bootstrap is
    gone."""
    peer_id = identity.peer_id_of(identity.load_or_create_identity(workdir / "peer-0.key"))
    return f"/ip4/{bed.address(0)}/tcp/7401/p2p/{peer_id}"


def _peers(
    ids: list[str], nats: tuple[str, ...], planned: frozenset[str] | set[str], status: Any
) -> list[dict[str, Any]]:
    by_id = {} if status is None else {p.id: p for p in status.peers}
    links = [] if status is None else list(status.links)
    rows = []
    for peer, nat in zip(ids, nats, strict=True):
        counts = dict.fromkeys(KINDS, 0)
        for link in links:
            if peer in (link.a, link.b) and {link.a, link.b} <= set(ids):
                counts[link.connection] += 1
        known = by_id.get(peer)
        rows.append(
            {
                "id": peer,
                "nat": nat,
                "reachability": "unknown" if known is None else known.reachability,
                "links": counts,
                "in_plan": peer in planned,
                "steps": None if known is None or known.metrics is None else known.metrics.step,
            }
        )
    return rows


def _relay_bytes(status: Any, killed_relay_bytes: int, ids: list[str]) -> int:
    """Everything the relays carried: the observer's own count, every member's (gossiped with
    its metrics), and a killed relay's last count."""
    if status is None:
        return killed_relay_bytes
    members = sum(
        p.metrics.relay_bytes or 0
        for p in status.peers
        if p.metrics is not None and p.id in ids and p.id != status.observed_by
    )
    return status.relay_bytes + members + killed_relay_bytes


def _checks(result: dict[str, Any], nats: tuple[str, ...], baseline: bool) -> dict[str, bool]:
    """The acceptance of issue 13, as booleans."""
    peers = result["peers"]
    loss = result["loss"]
    checks = {
        "every_peer_planned": all(p["in_plan"] for p in peers),
        "loss_falls": len(loss) >= 2 and loss[-1] < loss[0],
        "no_process_left": result["processes_left"] == 0,
        "natted_peers_reachability_private": all(
            p["reachability"] == "private" for p in peers if p["nat"] != "none"
        ),
        "symmetric_peers_relayed": all(
            p["links"]["relayed"] > 0 for p in peers if p["nat"] == "symmetric"
        )
        if "symmetric" in nats
        else True,
        "cone_pairs_holepunched": all(
            p["links"]["holepunched"] >= sum(1 for k in nats if k == "cone") - 1
            for p in peers
            if p["nat"] == "cone"
        ),
    }
    if baseline:
        base = result["baseline_loss"]
        checks["loss_as_all_public"] = (
            abs(loss[-1] - base[-1]) <= 0.1 * abs(base[0] - base[-1]) + 0.05
        )
    return checks


def render(result: dict[str, Any]) -> str:
    lines = [f"{'peer':>10}  {'nat':<9} {'reach':<8} {'direct':>6} {'punched':>7} {'relayed':>7}"]
    for p in result["peers"]:
        links = p["links"]
        lines.append(
            f"{p['id'][-8:]:>10}  {p['nat']:<9} {p['reachability']:<8} "
            f"{links['direct']:>6} {links['holepunched']:>7} {links['relayed']:>7}"
        )
    lines.append(
        f"steps {result['steps']}, loss {result['loss'][0]:.3f} -> {result['loss'][-1]:.3f}"
        + (f" (all public: {result['baseline_loss'][-1]:.3f})" if "baseline_loss" in result else "")
        + f", relayed {result['relay_bytes'] / 1e6:.1f} MB"
    )
    lines.append(
        "checks: " + ", ".join(f"{k} {'ok' if v else 'FAIL'}" for k, v in result["checks"].items())
    )
    return "\n".join(lines)
