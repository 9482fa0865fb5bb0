"""How long a hand-over may take (schedule/handover_time.py): the fixed 120 s (90 s for the
donor's fetch wait) for a small stage or a local network, more for a large state over the plan's
slowest link, an hour at most; the supervisor's twin constants agree."""

from __future__ import annotations

import subprocess
import sys

import pytest

from p2ptrain.control import settings
from p2ptrain.records import Plan, RunSpec
from p2ptrain.records.network import NetworkFacts
from p2ptrain.schedule import handover_time as ht

BIG = RunSpec().replace(n_layer=24, n_embd=2048, n_head=16)  # ~1.2B parameters


def _plan(stages: int, rate_mbps: float | None) -> Plan:
    network = None if rate_mbps is None else NetworkFacts(0.1, rate_mbps)
    peers = tuple(f"p{i}" for i in range(stages))
    return Plan(term=1, epoch=1, planner="p0", stages=stages, pipelines=(peers,), spares=(),
                data_addrs={}, cost_s=0.0, network=network)  # fmt: skip


def test_a_small_stage_keeps_the_fixed_limits() -> None:
    plan = _plan(2, 50.0)
    assert ht.handover_limit_s(RunSpec(), plan) == pytest.approx(120, abs=2)
    assert ht.fetch_wait_s(RunSpec(), plan) == pytest.approx(90, abs=2)
    assert ht.handover_limit_s(BIG, _plan(4, None)) == 120  # a local network: no transfer time
    assert ht.handover_limit_s(None, plan) == 120  # the run spec not here yet


def test_a_large_state_over_a_slow_link_gets_the_time_its_transfer_takes() -> None:
    plan = _plan(4, 50.0)
    stage_bytes = ht.stage_state_bytes(BIG, range(0, 6))  # the first stage: the embedding too
    assert 3e9 < stage_bytes < 4e9
    transfer = 2 * stage_bytes * 8 / 50e6
    assert ht.handover_limit_s(BIG, plan) == pytest.approx(120 + transfer, rel=0.01)
    assert ht.fetch_wait_s(BIG, plan) == pytest.approx(90 + transfer, rel=0.01)
    diloco = BIG.replace(sync="diloco")  # anchor and outer momentum travel too
    assert ht.stage_state_bytes(diloco, range(0, 6)) == stage_bytes * 5 // 3
    assert ht.handover_limit_s(BIG, _plan(4, 1.0)) == ht.MAX_HANDOVER_S  # an hour at most
    assert ht.fetch_wait_s(BIG, _plan(4, 1.0)) == ht.MAX_HANDOVER_S - 30


def test_a_members_crawling_links_do_not_stretch_the_transfer_time_unbounded() -> None:
    """The plan's slowest link is whatever one member's link reports made it (1 bit/s at
    least): the transfer time itself stays within the hour, not only the limits made of it."""
    crawl = _plan(4, 1e-6)
    assert ht.transfer_s(BIG, crawl) == ht.MAX_HANDOVER_S
    assert ht.handover_limit_s(BIG, crawl) == ht.MAX_HANDOVER_S
    assert ht.fetch_wait_s(BIG, crawl) == ht.MAX_HANDOVER_S - 30
    assert ht.transfer_s(BIG, _plan(4, 50.0)) < ht.MAX_HANDOVER_S  # as before


def test_the_supervisor_s_twin_constants_agree() -> None:
    assert settings.HANDOVER_LIMIT_S == ht.HANDOVER_BASE_S
    assert settings.MAX_HANDOVER_S == ht.MAX_HANDOVER_S


def test_a_control_process_works_out_the_limit_without_numpy() -> None:
    """A stopping node (control/handover.py: limit_s) and a planner keeping a donor work the
    limit out in the control process, which holds no numpy (control/planning/numbers.py)."""
    code = (
        "import sys\n"
        "from p2ptrain.control.handover import limit_s\n"
        "from p2ptrain.records import RunSpec\n"
        "assert limit_s(RunSpec(), None) == 120.0\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('numpy', 'scipy')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
