"""Issue 28: a diloco run is not re-planned on its own outer rounds' traffic, and a link that
really slows still is (control/round_watch.py, LinkTable.counts_probe)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import pytest
import trio

from p2ptrain.control import measuring
from p2ptrain.control.links import ROUND_HOLD_S
from p2ptrain.control.planning.drift import links_drifted
from p2ptrain.control.round_watch import MAX_ROUND_S, ROUND_GRACE_S, RoundWatch
from p2ptrain.control.state import NodeState
from p2ptrain.control.view import SwarmView
from p2ptrain.control.worker_link import WorkerLink
from p2ptrain.records import MetricsReport
from tests.control.test_view import ME, A, B, make_view

PLAN = (1, 1)


def test_the_watch_follows_the_worker_s_rounds() -> None:
    watch = RoundWatch()
    assert not watch.disturbed(0.0, 1.0)
    watch.note(PLAN, "started", 10.0)
    watch.note(PLAN, "", 11.0)  # a step between: still running
    assert watch.in_round(12.0) and watch.disturbed(11.5, 12.0)
    watch.note(PLAN, "averaged", 15.0)
    assert not watch.in_round(15.0)
    assert watch.disturbed(5.0, 15.5)  # a probe that began before the round ended
    assert not watch.disturbed(15.0 + ROUND_GRACE_S + 0.1, 30.0)
    watch.note(PLAN, "started", 40.0)
    watch.note((1, 2), "", 41.0)  # a new plan's session: its rounds start afresh
    assert not watch.in_round(41.0)
    watch.note(PLAN, "started", 50.0)  # a worker that dies in a round holds nothing for ever
    assert watch.in_round(50.0 + MAX_ROUND_S - 1)
    assert not watch.disturbed(50.0 + MAX_ROUND_S + ROUND_GRACE_S + 1, 500.0)


def cycle_rounds(view: SwarmView, t: float, period_s: float = 14.0, busy_s: float = 7.0) -> None:
    """Our worker's rounds: one starts every period_s and is applied busy_s later (bench
    scaleout's H 10: a stage's round every ~14 s, applied 5 steps on); the first at busy_s."""
    phase = (t + busy_s) % period_s
    view.links.rounds.note(
        PLAN, "started" if phase == 0 else "averaged" if phase == busy_s else "", t
    )


def run_probes(
    view: SwarmView,
    start: float,
    end: float,
    probe: Callable[[float, bool], tuple[float | None, float | None]],
    gated: bool = True,
) -> None:
    """Every second, our round's step (cycle_rounds) then an RTT probe to A; every 10 s a rate
    probe to A. probe(t, in_round) -> (rtt_ms or None: failed, Mbit/s or None: failed), as
    measuring.LinkProber records it (gated=False: as it did before, every result counted)."""
    t = start
    while t < end:
        cycle_rounds(view, t)
        rtt, rate = probe(t, view.links.rounds.in_round(t))
        since = t - 0.5
        if rtt is not None:
            view.record_rtt(A, rtt, t)
        elif not gated or view.links.counts_probe(A, "rtt", since, t):
            view.links.record_probe_failure(A, t, "rtt")
        if t % 10 == 0 and (not gated or view.links.counts_probe(A, "bandwidth", since, t)):
            if rate is None:
                view.links.record_probe_failure(A, t, "bandwidth")
            else:
                view.links.record_bandwidth(A, rate, t)
        view.record_rtt(B, 200.0, t)  # B is far, and its link stays as it is
        if t % 10 == 0:
            view.links.record_bandwidth(B, 20.0, t)
        t += 1.0


def links_at(view: SwarmView, now: float) -> Any:
    return view.links.freshest(now)


def round_traffic(t: float, in_round: bool) -> tuple[float | None, float | None]:
    """A 20 ms, 50 Mbit/s link; while our round fills it, its probes time out behind the
    round's bytes and a rate probe gets a twentieth of the rate."""
    if in_round:
        return None, 2.5
    return 20.0, 50.0


def test_a_round_s_own_traffic_does_not_look_like_drift() -> None:
    view, _ = make_view(peers=(A, B))
    run_probes(view, 0.0, 1.0, round_traffic)  # measured before the first round
    planned = links_at(view, 1.0)
    end = 292.0  # in a round
    run_probes(view, 1.0, end, round_traffic)
    assert view.links.rounds.in_round(end)
    link = view.links.freshest(end)[(A, ME)]
    assert (link.rtt_ms, link.bandwidth_mbps, link.rtt_failed) == (20.0, 50.0, False)
    assert not links_drifted(planned, links_at(view, end))
    # counted as before, the same probes priced the link as the swarm's worst: a re-plan
    before, _ = make_view(peers=(A, B))
    run_probes(before, 0.0, 1.0, round_traffic, gated=False)
    run_probes(before, 1.0, end, round_traffic, gated=False)
    assert before.links.freshest(end)[(A, ME)].rtt_failed
    assert links_drifted(planned, links_at(before, end))


@pytest.mark.parametrize("kind", ["cut", "slow"])
def test_a_link_that_really_changes_still_drifts(kind: str) -> None:
    """Rounds run all along; at t = 100 the link to A is cut (every probe fails) or slows to
    a tenth of its rate and ten times its round trip for good."""

    def changed(t: float, in_round: bool) -> tuple[float | None, float | None]:
        if t < 100:
            return round_traffic(t, in_round)
        return (None, None) if kind == "cut" else (200.0, 5.0)

    view, _ = make_view(peers=(A, B))
    run_probes(view, 0.0, 1.0, changed)
    planned = links_at(view, 1.0)
    run_probes(view, 1.0, 100.0, changed)
    assert not links_drifted(planned, links_at(view, 100.0))
    # a cut shows once the last round trip is older than the hold; a slower link once its
    # better probes leave the window (control/links.py: RECENT_WINDOW_S)
    end = 100.0 + (ROUND_HOLD_S["rtt"] + 5 if kind == "cut" else 310.0)
    run_probes(view, 100.0, end, changed)
    link = view.links.freshest(end)[(A, ME)]
    if kind == "cut":
        assert link.rtt_failed
    else:
        assert (link.rtt_ms, link.bandwidth_mbps) == (200.0, 5.0)
    assert links_drifted(planned, links_at(view, end))


def test_the_prober_sets_aside_a_failure_during_our_round(monkeypatch: Any) -> None:
    async def timed_out(host: object, peer: object) -> float:
        raise TimeoutError("queued behind the round")

    monkeypatch.setattr(measuring.probe, "measure_rtt_ms", timed_out)
    monkeypatch.setattr(measuring.ID, "from_base58", staticmethod(lambda peer: peer))
    view, _ = make_view(peers=(A, B))
    now = measuring.time.monotonic

    async def probe_twice() -> None:
        prober = measuring.LinkProber(cast(Any, None), view, trio.Event())
        for _ in range(2):
            limiter = trio.CapacityLimiter(1)
            token = object()
            await limiter.acquire_on_behalf_of(token)
            await prober._probe_rtt(A, limiter, token)

    view.record_rtt(A, 20.0, measuring.time.monotonic())
    view.links.rounds.note(PLAN, "started", measuring.time.monotonic())
    trio.run(probe_twice)
    assert (
        view.links.samples[A].num_failures == 0
        and not view.links.freshest(now())[(A, ME)].rtt_failed
    )
    view.links.rounds.note(PLAN, "averaged", measuring.time.monotonic() - ROUND_GRACE_S - 1)
    trio.run(probe_twice)  # no round: the failures count
    assert view.links.samples[A].num_failures == 2


def test_the_worker_s_metrics_tell_the_view_of_its_rounds() -> None:
    view, _ = make_view(peers=(A, B))
    clock = [100.0]
    state = NodeState(
        seed=bytes(range(1, 33)),
        role="control-only",
        peer_id=ME,
        host=cast(Any, None),
        view=view,
        hardware={},
        clock=lambda: clock[0],
    )
    link = WorkerLink(state, "/nonexistent/ipc.sock", print_progress=False)

    def metrics(step: int, outer_round: str) -> MetricsReport:
        return MetricsReport(
            step=step,
            loss=None,
            tokens_per_s=1.0,
            stage=0,
            replica=0,
            samples=1,
            averaging="none",
            step_s=1.0,
            epoch=1,
            term=1,
            num_replicas=2,
            outer_steps=0,
            inner_steps=10,
            outer_round=outer_round,
        )

    link._on_message(metrics(9, "started"))
    assert view.links.rounds.in_round(101.0)
    clock[0] = 105.0
    link._on_message(metrics(14, "averaged"))
    assert not view.links.rounds.in_round(105.0)
