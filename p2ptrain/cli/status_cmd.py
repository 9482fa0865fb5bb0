"""`p2ptrain status`: join as a light observer and print the swarm (table, or --json)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING

from p2ptrain.records import PeerMetrics

MIN_WATCH_S, MAX_WATCH_S = 0.2, 3600.0  # status --watch's interval
MAX_MATRIX_PEERS = 32  # past it, a matrix is more text than anyone reads (and N x N to build)

if TYPE_CHECKING:
    from p2ptrain.records import PeerStatus, SwarmStatus


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--bootstrap", required=True, help="multiaddr of the bootstrap (or any peer)"
    )
    parser.add_argument("--json", action="store_true", help="print the status as JSON")
    parser.add_argument(
        "--watch",
        type=_seconds,
        metavar="SECONDS",
        help="look again every SECONDS until interrupted, from one observer (with --json: one "
        "status per line); a failed look is said on stderr and tried again",
    )


def run(args: argparse.Namespace) -> int:
    from p2ptrain.control import observer

    if args.watch is None:
        status = observer.get_status(args.bootstrap)
        print(json.dumps(status.to_dict(), indent=2) if args.json else format_status(status))
        return 0

    def show(status: SwarmStatus | None, error: Exception | None) -> bool:
        if status is None:
            print(f"p2ptrain status: {error}", file=sys.stderr, flush=True)
        elif args.json:
            print(json.dumps(status.to_dict(), separators=(",", ":")), flush=True)
        else:
            print(format_status(status) + "\n", flush=True)
        return True

    try:
        observer.watch(args.bootstrap, args.watch, show)
    except* KeyboardInterrupt:  # Ctrl-C ends a watch: not an error (trio hands it in a group)
        pass
    except* BrokenPipeError:  # the reader went (`status --watch 5 --json | head -1`)
        # what is left in stdout's buffer goes nowhere: its flush at exit would fail again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def _seconds(text: str) -> float:
    """--watch's interval: a finite number of seconds, 0.2 at least (each look is a request to
    a node that serves everyone's)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not MIN_WATCH_S <= value <= MAX_WATCH_S:
        raise argparse.ArgumentTypeError(f"between {MIN_WATCH_S} and {MAX_WATCH_S:.0f} s")
    return value


def _short(peer_id: str | None) -> str:
    return "-" if peer_id is None else f"…{peer_id[-8:]}"


def _cell(value: float | int | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _bytes(value: int | None) -> str:
    from p2ptrain.control.progress import size_text  # pure; control's package is lazy here

    return "-" if value is None else size_text(value)


def format_status(status: SwarmStatus) -> str:
    """A readable report: peers with their training progress, data-plane bytes and reachability
    (public, private or unknown: can others dial it?), where their sessions started, planner, link matrices (RTT, measured
    rate, and how links go when some are hole-punched or relayed), plan, and what the observing
    node waits for (`finished` on the first line once the run's last step is trained)."""
    peers = status.peers
    lines = [
        f"run {status.run or '?'}   planner {_short(status.planner)}   "
        f"term {status.term}   {sum(p.alive for p in peers)}/{len(peers)} peers alive"
        + ("   finished" if status.finished else ""),
        "",
        f"{'peer':<12}{'alive':<7}{'role':<16}{'GFLOP/s':>9}  {'seen':>6}  {'step':>6}"
        f"{'loss':>8}{'tok/s':>8}{'sent':>10}{'recv':>10}  {'reach':<9}address",
    ]
    spares = set(status.plan.spares) if status.plan is not None else set()
    for peer in peers:
        star = "*" if peer.planner else " "
        role = f"{peer.role} (spare)" if peer.id in spares else peer.role  # the plan's word
        gflops = peer.compute_gflops
        m = peer.metrics or PeerMetrics()  # every field None: nothing known
        lines.append(
            f"{star}{_short(peer.id):<11}{'yes' if peer.alive else 'NO':<7}{role:<16}"
            f"{_cell(gflops, '.1f'):>9}  {peer.last_seen_s:>5.1f}s  "
            f"{_cell(m.step, 'd'):>6}{_cell(m.loss, '.3f'):>8}"
            f"{_cell(m.tokens_per_s, '.0f'):>8}"
            f"{_bytes(m.bytes_sent):>10}{_bytes(m.bytes_received):>10}  "
            f"{peer.reachability:<9}{(peer.addrs or ('-',))[0]}"
        )
    lines += _started_lines(peers)
    if status.peers_left_out or status.links_left_out:  # the node's document is capped
        lines.append(
            f"left out by {_short(status.observed_by)}: {status.peers_left_out} peers, "
            f"{status.links_left_out} links (the plan's are all in)"
        )
    lines += _link_lines(status)
    plan = status.plan
    lines.append("")
    if plan is None:
        lines.append("no plan yet")
    else:
        lines.append(
            f"plan term {plan.term} epoch {plan.epoch} by {_short(plan.planner)}: "
            f"{len(plan.pipelines)} pipelines x {plan.stages} stages, "
            f"predicted {plan.cost_s:.3f} s/step"
        )
        if plan.stage_layers:
            lines.append("  blocks per stage: " + ", ".join(str(n) for n in plan.stage_layers))
        for i, pipeline in enumerate(plan.pipelines):
            lines.append(f"  pipeline {i}: " + " -> ".join(_short(p) for p in pipeline))
        if plan.spares:
            donor = {p: " (handing its stage over)" for p in plan.donors}
            listed = ", ".join(_short(p) + donor.get(p, "") for p in plan.spares)
            lines.append("  spares: " + listed)
        lines += _copy_lines(peers, set(plan.spares), (plan.term, plan.epoch))
    if status.waiting_for:  # last: the lines above keep their places for readers
        lines += ["", f"waiting for {status.waiting_for}"]
    return "\n".join(lines)


def _link_lines(status: SwarmStatus) -> list[str]:
    """The link matrices (RTT, rate, connection kinds), each N x N: for at most
    MAX_MATRIX_PEERS peers (the plan's, if the swarm is larger but the plan is not), else one
    line; the status comes from a node we do not trust, which may list 10,000 peers."""
    ids = [p.id for p in status.peers]
    if len(ids) > MAX_MATRIX_PEERS and status.plan is not None:
        planned = {p for pipeline in status.plan.pipelines for p in pipeline}
        planned |= set(status.plan.spares)
        if len(planned) <= MAX_MATRIX_PEERS:
            ids = [p for p in ids if p in planned]
    if not ids:
        return []
    if len(ids) > MAX_MATRIX_PEERS:
        return ["", f"{len(ids)} peers: link matrices left out (see --json)"]
    shown = set(ids)
    links = [link for link in status.links if link.a in shown and link.b in shown]
    rtt = {(link.a, link.b): link.rtt_ms for link in links}
    rate = {(link.a, link.b): link.bandwidth_mbps for link in links}
    guessed = {(link.a, link.b) for link in links if link.estimated}
    lines = _matrix("RTT ms", ids, rtt, ".2f", guessed)
    lines += _matrix("Mbit/s", ids, rate, ".1f", guessed)
    if guessed:
        lines.append("~ estimated from coordinates and capacities, not measured")
    kinds = {(link.a, link.b): link.connection for link in links}
    if any(kind != "direct" for kind in kinds.values()):  # someone is behind a NAT
        lines += _kind_matrix(ids, kinds)
    return lines


def _copy_lines(
    peers: tuple[PeerStatus, ...], spares: set[str], plan: tuple[int, int]
) -> list[str]:
    """The plan's spares' copies of the stages one peer alone holds (worker/resume/copies.py):
    what a crash of that peer would cost. Only those made under this plan."""
    lines = []
    for peer in peers:
        if peer.id in spares and peer.metrics is not None:
            for c in peer.metrics.copies_under(plan):
                at = "no copy yet" if c.step is None else f"copied at step {c.step}"
                lines.append(
                    f"  copy of {c.layers} ({_short(c.holder)}): {at} on {_short(peer.id)}"
                )
    return lines


def _started_lines(peers: tuple[PeerStatus, ...]) -> list[str]:
    """Where each trainer's session started: "resumed from step N (lineage ...)" (issue 30)."""
    said = [(p.id, p.metrics.started) for p in peers if p.metrics and p.metrics.started]
    if not said:
        return []
    return ["", "started", *(f"  {_short(peer):<11}{text}" for peer, text in said)]


def _matrix(
    title: str,
    ids: list[str],
    values: dict[tuple[str, str], float | None],
    spec: str,
    estimated: set[tuple[str, str]] | None = None,
) -> list[str]:
    """A symmetric link matrix (keys are (smaller id, larger id)) as lines of a table; an
    `estimated` link's value is marked with a ~."""
    lines = ["", title.ljust(12) + "".join(_short(p).rjust(11) for p in ids)]
    for a in ids:
        cells = []
        for b in ids:
            pair = (min(a, b), max(a, b))
            mark = "~" if estimated and pair in estimated and values.get(pair) is not None else ""
            cells.append(("·" if a == b else mark + _cell(values.get(pair), spec)).rjust(11))
        lines.append(_short(a).ljust(12) + "".join(cells))
    return lines


def _kind_matrix(ids: list[str], kinds: dict[tuple[str, str], str]) -> list[str]:
    """How each link's bytes travel: direct, holepunched, relayed (- unmeasured)."""
    lines = ["", "connection".ljust(12) + "".join(_short(p).rjust(13) for p in ids)]
    for a in ids:
        cells = [("·" if a == b else kinds.get((min(a, b), max(a, b)), "-")).rjust(13) for b in ids]
        lines.append(_short(a).ljust(12) + "".join(cells))
    return lines
