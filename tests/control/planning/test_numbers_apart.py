"""The planner's numbers run in the planning child: a control process that plans, checks for
drift and prices its plan never loads numpy or the scheduler (numbers.py; 10 MiB of the 100 MB a
volunteer's node may hold)."""

from __future__ import annotations

import json
import subprocess
import sys

from p2ptrain.control.planning import search_process
from p2ptrain.control.planning.numbers import SearchFailed

_PLAN_IN_A_CONTROL_PROCESS = """
import json, sys
import trio
from p2ptrain.control.planning.plan_maker import PLAN_DEBOUNCE_S, PlanMaker
from p2ptrain.records import RunSpec
from tests.control.test_view import A, B, C, make_view

view, feed = make_view(me=A, peers=(B, C))
view.run = RunSpec().replace(stages=3, n_layer=3, min_peers=3, compute_aware=False)
report = {"rtt_ms": 20.0, "rtt_age_s": 0.5, "bandwidth_mbps": 50.0, "bandwidth_age_s": 0.5}
maker = PlanMaker(view, A)

slower = {**report, "rtt_ms": 200.0, "bandwidth_mbps": 5.0}

async def ticks():
    from p2ptrain.control.planning import search_process
    published = []
    # the first plan, a drift check that finds none, then every link 10x slower: a drift whose
    # search (uniform links: no placement beats this one) keeps the plan and ends the child
    for now, links in ((1.0, report), (1.0 + PLAN_DEBOUNCE_S + 0.1, report), (300.0, report),
                       (400.0, slower)):
        for author, row in {B: {A: links, C: links}, C: {A: links}}.items():
            assert view.accept(feed("telemetry", author, {"links": row}), now) is None
        published.append(await maker.tick(now, []))
    released = search_process.pid() is None
    assessment = await maker_assess()
    return published, assessment, released

async def maker_assess():
    from p2ptrain.control.planning import search_process
    from p2ptrain.control.planning.numbers import PlanInputs
    inputs = PlanInputs((A, B, C), view.links.freshest(400.0), {}, {}, frozenset(), frozenset(),
                        {}, {}, view.run)
    return await search_process.assess(inputs, view.plan)

view.claim()
published, assessment, released = trio.run(ticks)
print(json.dumps({
    "published": published,
    "plan": view.plan is not None and view.plan.network is not None,
    "priced": assessment.plan_cost_s,
    "released": released,
    "heavy": sorted(m for m in sys.modules if m.split(".")[0] in ("numpy", "scipy")
                    or m.startswith("p2ptrain.schedule")),
}))
"""


def test_a_planning_control_process_never_loads_numpy() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _PLAN_IN_A_CONTROL_PROCESS],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    report = json.loads(out.stdout.splitlines()[-1])
    assert report["published"] == [False, True, False, False]  # a plan, then none worth it
    assert report["released"]  # a fruitless drift search does not leave the child idling
    assert report["plan"]  # with the network facts the child worked out
    assert report["priced"] is not None and report["priced"] >= 0.0
    assert report["heavy"] == []


def test_a_scheduler_bug_in_the_child_comes_back_as_text() -> None:
    """Its exception may hold numpy objects: it crosses as SearchFailed, which a control
    process reads without loading them."""
    import trio

    try:
        trio.run(search_process._call, "assess", None, None)
    except SearchFailed as exc:
        assert "AttributeError" in str(exc) and "Traceback" in str(exc)
    else:
        raise AssertionError("no SearchFailed")
