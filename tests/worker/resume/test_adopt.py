"""A run outlives its swarm (issue 30): a restarted swarm's first lineage adopts the run's newest
state of an earlier lineage, on another cut (worker/resume/adopt.py, worker/resume/start_choice.py choose_start,
worker/resume/restore.py), never a state of another run or model, never when the run says
resume = "never", never in a lineage that has its own states or ancestors; and no writer prunes
another lineage's states (train/checkpoint.py)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from p2ptrain.records import Plan
from p2ptrain.records.lineage import Lineage, may_adopt, next_lineage
from p2ptrain.records.run import RunSpec
from p2ptrain.train.checkpoint import record_step
from p2ptrain.train.checkpoint_folder import list_states
from p2ptrain.train.model import Stage, build_layers
from p2ptrain.train.optim import make_optimizer
from p2ptrain.train.snapshot import StageSnapshot
from p2ptrain.train.state_digest import file_sha256
from p2ptrain.worker.resume import restore
from p2ptrain.worker.resume.adopt import link_adopted
from p2ptrain.worker.resume.own_states import own_announcement
from p2ptrain.worker.resume.restore import restore_stage, started_line
from p2ptrain.worker.resume.start_choice import choose_start, placement
from tests.worker.resume.test_recut import SPEC, NoTransport, chain, moments, train_step, weights


def plan(stage_layers: tuple[int, ...], epoch: int, lineage: Lineage) -> Plan:
    return Plan(
        term=1,
        epoch=epoch,
        planner="P",
        stages=len(stage_layers) or 2,
        pipelines=(("a", "b"),) if len(stage_layers) != 3 else (("a", "b", "c"),),
        spares=(),
        data_addrs={},
        cost_s=0.0,
        stage_layers=stage_layers,
        lineage=lineage,
    )


def root(epoch: int = 1) -> Lineage:
    """A new swarm's first lineage (records/lineage.py: a random root id)."""
    return next_lineage((), False, 1, epoch, "P")


def save_swarm(
    directory: Path, under: Plan, steps: range, spec: RunSpec = SPEC
) -> list[tuple[Stage, torch.optim.Optimizer]]:
    """Train the plan's cut for `steps` in one process, saving each step under its tag."""
    pipeline: list[tuple[Stage, torch.optim.Optimizer]]
    pipeline = [
        (s, make_optimizer(s, spec))
        for s in (build_layers(spec, r) for r in under.layer_ranges(spec.model.n_layer))
    ]
    rank = under.state_rank
    for step in steps:
        train_step(pipeline, step)
        for stage, optimizer in pipeline:
            record_step(
                directory,
                spec,
                stage,
                StageSnapshot.take(stage, optimizer, step + 1),
                under.state_tag,
                lambda tag: rank(tag) is not None,
            )
    return pipeline


def agree(directory: Path, new: Plan, adopting: bool, spec: RunSpec = SPEC):  # type: ignore[no-untyped-def]
    members, placed = placement(new, spec.model.n_layer)
    mine = own_announcement(directory, new.state_rank, spec if adopting else None)
    announced = {peer: mine for peer in members}  # every member reads the same directory
    return choose_start(placed, announced, new.state_rank, members, adopting)


def test_a_restarted_swarm_adopts_the_newest_state_on_another_cut(tmp_path: Path) -> None:
    """Saved by 2 stages (L0-2, L2-4) up to step 5; the new swarm cuts 3 stages (1, 1, 2):
    every stage is built from the earlier swarm's step-5 states, weights and AdamW moments bit
    for bit, the optimizer's step counter carries over, and training goes on exactly."""
    earlier = plan((), 3, root(3))
    old = save_swarm(tmp_path, earlier, range(5))
    before = {s.path.name for s in list_states(tmp_path)}
    new_plan = plan((1, 1, 2), 1, root())
    assert may_adopt(new_plan.lineage) and new_plan.state_rank(earlier.state_tag) is None

    start = agree(tmp_path, new_plan, adopting=True)
    assert start.step == 5 and start.note == ""
    assert start.adopted == earlier.lineage[0][0]
    new = chain(new_plan.layer_ranges(SPEC.model.n_layer))
    for stage, optimizer in new:
        restored = restore_stage(SPEC, new_plan, NoTransport(), tmp_path, stage, optimizer, start)  # type: ignore[arg-type]
        assert restored == restore.Restored(5)
    assert all(torch.equal(weights(old)[n], w) for n, w in weights(new).items())
    assert all(torch.equal(moments(old)[n], m) for n, m in moments(new).items())
    assert moments(old).keys() == moments(new).keys()
    counters = {float(s["step"]) for _, o in new for s in o.state.values()}
    assert counters == {5.0}  # AdamW's bias correction continues at the resumed step
    # the new lineage now holds the states (it descends from them): its next plan needs no
    # adoption; the earlier swarm's files are all still there
    names = {s.path.name for s in list_states(tmp_path)}
    assert before <= names
    assert {s.key for s in list_states(tmp_path) if s.tag == new_plan.state_tag} == {
        "L0-2",
        "L2-4",
        "L0-1",
        "L1-2",
    }  # the adopted sources (linked), the stages built
    assert agree(tmp_path, plan((1, 1, 2), 2, ((new_plan.lineage[0][0], 2),)), True).adopted == ""
    assert "lineage " + earlier.lineage[0][0] in started_line(SPEC, new_plan, start, tmp_path)
    train_step(old, 5)
    train_step(new, 5)
    assert all(torch.equal(weights(old)[n], w) for n, w in weights(new).items())


def test_states_a_member_holds_elsewhere_are_linked_only_with_the_agreed_digest(
    tmp_path: Path,
) -> None:
    earlier = plan((), 3, root(3))
    save_swarm(tmp_path, earlier, range(2))
    new_plan = plan((), 1, root())
    start = agree(tmp_path, new_plan, adopting=True)
    wrong = {key: "0" * 64 for key in start.digests}
    assert link_adopted(tmp_path, start.adopted, start.state_step, wrong, new_plan.state_tag) == []
    made = link_adopted(
        tmp_path, start.adopted, start.state_step, start.digests, new_plan.state_tag
    )
    assert sorted(p.name for p in made) == [
        f"stage-L0-2.step2.{new_plan.state_tag}.pt",
        f"stage-L2-4.step2.{new_plan.state_tag}.pt",
    ]


def test_stages_that_share_no_step_are_linked_each_at_its_own(tmp_path: Path) -> None:
    """A restarted swarm whose stages stopped at different steps resumes each from its own
    (StartPoint.state_step): its file here is linked at that step, not fetched from nobody."""
    earlier = plan((), 3, root(3))
    save_swarm(tmp_path, earlier, range(3))
    new_plan = plan((), 1, root())
    at = {"L0-2": 2, "L2-4": 1}
    digests = {
        s.key: file_sha256(s.path)
        for s in list_states(tmp_path)
        if s.key in at and s.step == at[s.key]
    }
    start = agree(tmp_path, new_plan, adopting=True)
    made = link_adopted(tmp_path, start.adopted, at.__getitem__, digests, new_plan.state_tag)
    assert sorted(p.name for p in made) == [
        f"stage-L0-2.step2.{new_plan.state_tag}.pt",
        f"stage-L2-4.step1.{new_plan.state_tag}.pt",
    ]


def test_resume_never_starts_from_initial_weights_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    earlier = plan((), 3, root(3))
    save_swarm(tmp_path, earlier, range(3))
    never = SPEC.replace(resume="never")
    new_plan = plan((), 1, root())
    start = agree(tmp_path, new_plan, adopting=False, spec=never)  # session: "never" adopts not
    assert start.step == 0 and start.adopted == ""
    stage, optimizer = chain(new_plan.layer_ranges(SPEC.model.n_layer))[0]
    initial = {n: t.clone() for n, t in stage.state_dict().items()}
    assert (
        restore_stage(never, new_plan, NoTransport(), tmp_path, stage, optimizer, start).step == 0
    )  # type: ignore[arg-type]
    assert all(torch.equal(initial[n], t) for n, t in stage.state_dict().items())
    with caplog.at_level(logging.WARNING):
        line = started_line(never, new_plan, start, tmp_path)
    assert line.startswith('resume = "never": started from initial weights')
    assert "up to step 3" in line and line in caplog.text


@pytest.mark.parametrize(
    "other",
    [
        SPEC.replace(run_id="another-run"),
        SPEC.replace(n_embd=32),  # another model shape, the same file names
        SPEC.replace(data_sha256="a" * 64),  # another corpus
    ],
    ids=["run id", "model shape", "data digest"],
)
def test_a_state_of_another_run_or_model_is_never_adopted(tmp_path: Path, other: RunSpec) -> None:
    ours = plan((), 3, root(3))
    save_swarm(tmp_path, ours, range(2))
    save_swarm(tmp_path, plan((), 5, root(5)), range(6), spec=other)  # newer, in the same dir
    run = SPEC.replace(data_sha256="b" * 64) if other.data.data_sha256 else SPEC
    start = agree(tmp_path, plan((), 1, root()), adopting=True, spec=run)
    assert start.step == 2 and start.adopted == ours.lineage[0][0]
    alone = tmp_path / "alone"
    save_swarm(alone, plan((), 5, root(5)), range(3), spec=other)
    assert agree(alone, plan((), 1, root()), adopting=True, spec=run).step == 0


def test_a_lineage_with_its_own_state_or_an_ancestor_never_adopts(tmp_path: Path) -> None:
    """After a partition heals, a live plan's descendants never take the other half's states."""
    ours = plan((), 1, root())
    save_swarm(tmp_path, ours, range(1))  # ours holds step 1
    other_half = plan((), 2, root(2))
    save_swarm(tmp_path / "x", other_half, range(4))
    for state in list_states(tmp_path / "x"):
        state.path.rename(tmp_path / state.path.name)  # the other half's step 4, newer
    later = plan((), 2, ((ours.lineage[0][0], 2),))
    start = agree(tmp_path, later, adopting=True)
    assert start.step == 1 and start.adopted == ""
    elected = next_lineage(ours.lineage, False, 2, 1, "Q")
    assert not may_adopt(elected)


def test_pruning_keeps_every_state_of_another_lineage(tmp_path: Path) -> None:
    """The issue's measurement: the first swarm's stamped states (steps 4, 5, 9, 10) survive
    the second swarm's writing steps 11 to 16; the second keeps its own newest four."""
    first = plan((), 1, root())
    save_swarm(tmp_path, first, range(3, 5))  # steps 4, 5
    save_swarm(tmp_path, first, range(8, 10))  # steps 9, 10
    first_files = {s.path.name for s in list_states(tmp_path)}
    second = plan((), 1, root())
    save_swarm(tmp_path, second, range(10, 16))
    names = {s.path.name for s in list_states(tmp_path)}
    assert first_files <= names
    own = sorted({s.step for s in list_states(tmp_path) if s.tag == second.state_tag})
    assert own == [13, 14, 15, 16]
