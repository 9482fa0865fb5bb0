"""What the first plan waits for (control/planning/readiness.py)."""

from p2ptrain.control.links import Link
from p2ptrain.control.planning.readiness import first_plan_gaps
from p2ptrain.records import RunSpec, StageCompute

RUN = RunSpec().replace(run_id="r")
TIMED = StageCompute(1e-3, 1e-4, 2e-4, 8, "cpu", "r")
LINK = Link(rtt_ms=20.0, bandwidth_mbps=50.0, age_s=1.0)


def test_ready_when_every_trainer_has_an_address_links_and_a_timed_stage() -> None:
    members = ["a", "b", "c"]
    roles = {"a": "trainer", "b": "trainer", "c": "control-only"}
    addrs = {"a": ["/ip4/10.0.0.1/tcp/7402"], "b": ["/ip4/10.0.0.2/tcp/7402"]}
    # the control-only member needs no address, no timed stage and no measured links
    assert (
        first_plan_gaps(members, roles, addrs, {("a", "b"): LINK}, {"a": TIMED, "b": TIMED}, RUN)
        == []
    )
    gaps = first_plan_gaps(members, roles, {"a": addrs["a"]}, {}, {"a": TIMED}, RUN)
    assert gaps == ["1 data-plane address(es)", "1 of 1 links", "1 timed stage(s)"]
    # a link with a round trip but no rate yet is not measured; another run's timing does not
    # count
    half = {("a", "b"): Link(rtt_ms=20.0, bandwidth_mbps=None, age_s=1.0)}
    other_run = StageCompute(1e-3, 1e-4, 2e-4, 8, "cpu", "other")
    gaps = first_plan_gaps(members, roles, addrs, half, {"a": TIMED, "b": other_run}, RUN)
    assert gaps == ["1 of 1 links", "1 timed stage(s)"]


def test_timed_stages_matter_only_to_a_compute_aware_scheduled_run() -> None:
    roles = {"a": "trainer"}
    addrs = {"a": ["/ip4/10.0.0.1/tcp/7402"]}
    for run in (RUN.replace(compute_aware=False), RUN.replace(placement="random")):
        assert first_plan_gaps(["a"], roles, addrs, {}, {}, run) == []
    assert first_plan_gaps(["a"], roles, addrs, {}, {}, RUN) == ["1 timed stage(s)"]
