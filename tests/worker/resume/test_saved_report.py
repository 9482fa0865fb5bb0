"""What a worker tells its control process of the run's saved states before any plan
(worker/resume/saved_report.py): the newest step of each stage and lineage, of this run only."""

from __future__ import annotations

import os
from pathlib import Path

from p2ptrain.records import SavedStage, message_from_dict
from p2ptrain.records.lineage import id_of_tag
from p2ptrain.worker.resume.saved_report import saved_report, saved_stages
from tests.worker.resume.test_adopt import plan, root, save_swarm
from tests.worker.resume.test_recut import SPEC


def test_the_newest_state_of_each_stage_and_lineage_of_the_run_is_named(tmp_path: Path) -> None:
    first = plan((2, 2), 1, root())
    save_swarm(tmp_path, first, range(3))  # L0-2 and L2-4 at steps 1..3, one lineage
    second = plan((1, 3), 1, root())
    save_swarm(tmp_path, second, range(2))  # another lineage, another cut: steps 1..2
    first_id, second_id = id_of_tag(first.state_tag), id_of_tag(second.state_tag)
    assert first_id and second_id
    saved = saved_stages(tmp_path, SPEC)
    assert set(saved) == {
        SavedStage(0, 2, 3, first_id),
        SavedStage(2, 4, 3, first_id),
        SavedStage(0, 1, 2, second_id),
        SavedStage(1, 4, 2, second_id),
    }
    assert [state.step for state in saved] == sorted((s.step for s in saved), reverse=True)
    # through the IPC line as the control process reads it
    report = saved_report(SPEC, str(tmp_path))
    assert message_from_dict(report.to_dict()) == report and report.run_id == SPEC.run_id


def test_another_runs_and_unreadable_states_are_not_named(tmp_path: Path) -> None:
    other = SPEC.replace(run_id="another-run")
    save_swarm(tmp_path, plan((2, 2), 1, root()), range(2), other)
    assert saved_stages(tmp_path, SPEC) == ()
    mine = plan((2, 2), 1, root())
    save_swarm(tmp_path / "mine", mine, range(2))
    # a torn newest file (a crash's) is skipped; the step before it is named instead
    newest = next((tmp_path / "mine").glob("stage-L0-2.step2.*.pt"))
    newest.write_bytes(b"\0" * 16)
    os.utime(newest)
    named = {(s.first, s.end): s.step for s in saved_stages(tmp_path / "mine", SPEC)}
    assert named == {(0, 2): 1, (2, 4): 2}
    # states of blocks past the run's model (another shape's names) are not named either
    assert saved_stages(tmp_path / "mine", SPEC.replace(n_layer=1, stages=1)) == ()
    assert saved_stages(tmp_path / "nowhere", SPEC) == ()
