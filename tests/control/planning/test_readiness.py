"""What the first plan waits for (control/planning/readiness.py)."""

from p2ptrain.control.links import Link
from p2ptrain.control.planning.first_wait import FIRST_PLAN_WAIT_S, FirstPlanWait
from p2ptrain.control.planning.readiness import first_plan_gaps, holder_gaps
from p2ptrain.records import RunSpec, SavedStage, StageCompute

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


def _saved(first: int, end: int, step: int, lineage: str = "0123456789abcdef") -> SavedStage:
    return SavedStage(first, end, step, lineage)


def test_a_restart_waits_for_the_holder_of_blocks_no_member_saved() -> None:
    run = RUN.replace(n_layer=8, stages=2, checkpoint_interval=20, compute_aware=False)
    roles = {"a": "trainer", "b": "trainer", "c": "control-only"}
    addrs = {"a": ["/ip4/10.0.0.1/tcp/7402"], "b": ["/ip4/10.0.0.2/tcp/7402"]}
    links = {("a", "b"): LINK}

    def gaps(saved: dict[str, tuple[SavedStage, ...] | None]) -> list[str]:
        """The measurements' gaps (a trainer's word) and then the holders' (holder_gaps)."""
        measured = first_plan_gaps(["a", "b", "c"], roles, addrs, links, {}, run, saved=saved)
        return measured + holder_gaps(["a", "b"], saved, run)

    # a trainer whose worker has not said what it holds is waited for (the control-only not)
    assert gaps({"a": (), "b": None}) == ["1 trainer(s)' saved states"]
    assert gaps({"a": (), "b": ()}) == []  # a fresh run: nothing saved, nothing to wait for
    # a holds L0-4 at step 100; nobody names blocks 4-7: their holder has not joined
    assert gaps({"a": (_saved(0, 4, 100),), "b": ()}) == [
        "the holder of blocks 4-7 (the run's states reach step 100)"
    ]
    # b saved its stage an interval earlier (killed mid-interval): the run is covered
    assert gaps({"a": (_saved(0, 4, 100),), "b": (_saved(4, 8, 80),)}) == []
    # a state of an earlier cut, not trained for many intervals, is no cover of the newest
    assert gaps({"a": (_saved(0, 4, 100),), "b": (_saved(0, 8, 20),)}) == [
        "the holder of blocks 4-7 (the run's states reach step 100)"
    ]
    # another lineage complete in its recent states will do (a new term is a new lineage id:
    # a stage killed before its first save under it holds only the one before), not a mix of
    # two (a restarted swarm adopts one lineage), nor an old one
    before = "fedcba9876543210"
    ancestor = (_saved(0, 4, 80, before), _saved(4, 8, 85, before))
    assert gaps({"a": (_saved(0, 4, 100), ancestor[0]), "b": (ancestor[1],)}) == []
    mixed = {"a": (_saved(0, 4, 100),), "b": (_saved(4, 8, 85, before),)}
    assert gaps(mixed) == ["the holder of blocks 4-7 (the run's states reach step 100)"]
    old = {"a": (_saved(0, 4, 100), _saved(0, 4, 50, before)), "b": (_saved(4, 8, 50, before),)}
    assert gaps(old) == ["the holder of blocks 4-7 (the run's states reach step 100)"]
    # resume = "never" starts from initial weights: nothing to wait for
    never = run.replace(resume="never")
    saved: dict[str, tuple[SavedStage, ...] | None] = {"a": (_saved(0, 4, 100),), "b": None}
    assert first_plan_gaps(["a", "b"], roles, addrs, links, {}, never, saved=saved) == []
    assert holder_gaps(["a", "b"], {"a": (_saved(0, 4, 100),), "b": ()}, never) == []


def test_the_holders_are_waited_for_within_the_runs_resume_wait() -> None:
    """The measurements within FIRST_PLAN_WAIT_S of their first gap, the saved states' holders
    within the run's resume_wait_s of theirs: volunteers come back at their own pace."""
    run = RUN.replace(resume_wait_s=600.0)
    holder = ["the holder of blocks 4-7 (the run's states reach step 100)"]
    wait = FirstPlanWait()
    assert wait.awaits(0.0, ["1 of 1 links"], holder, run)
    assert wait.awaits(FIRST_PLAN_WAIT_S + 1, ["1 of 1 links"], holder, run)  # holders: 600 s
    assert wait.awaits(599.0, [], holder, run)
    assert not wait.awaits(600.0, [], holder, run)  # planned without the holder
    fresh = FirstPlanWait()  # a fresh run: the measurements alone, within FIRST_PLAN_WAIT_S
    assert fresh.awaits(0.0, ["1 of 1 links"], [], run)
    assert not fresh.awaits(FIRST_PLAN_WAIT_S, ["1 of 1 links"], [], run)
    assert not FirstPlanWait().awaits(0.0, [], holder, run.replace(resume_wait_s=0.0))
    assert not FirstPlanWait().awaits(0.0, [], [], run)


def test_holder_gaps_name_the_missing_blocks_as_spans() -> None:
    run = RUN.replace(n_layer=8, stages=2, checkpoint_interval=0)  # only on exit: no window
    saved: dict[str, tuple[SavedStage, ...] | None] = {
        "a": (_saved(1, 3, 50), _saved(5, 6, 7)),
    }
    assert holder_gaps(["a"], saved, run) == [
        "the holder of blocks 0, 3-4, 6-7 (the run's states reach step 50)"
    ]


def test_saved_states_past_the_model_count_for_nothing() -> None:
    """A record may name 64 states of up to 10^6 blocks: those past the run's model are no
    state of it (and the gaps are worked out on ranges, never block by block)."""
    run = RUN.replace(n_layer=8, stages=2, checkpoint_interval=20)
    huge = tuple(_saved(0, 10**6, 10**9 + n, f"{n:016x}") for n in range(64))
    saved: dict[str, tuple[SavedStage, ...] | None] = {"a": (_saved(0, 4, 100),), "liar": huge}
    assert holder_gaps(["a", "liar"], saved, run) == [
        "the holder of blocks 4-7 (the run's states reach step 100)"
    ]
    assert holder_gaps(["liar"], {"liar": huge}, run) == []  # nothing of this run saved
