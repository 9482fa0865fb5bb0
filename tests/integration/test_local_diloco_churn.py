"""A diloco replica's peer is SIGKILLed mid-run (`p2ptrain local`, real processes on 127.0.0.1):
the control plane re-plans around it, the survivors resume from the agreed step with the stage's
outer state (anchor, outer momentum) and their outer rounds go on to the last step; nothing of a
stage's state is lost (its inner progress at most)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import processes_with
from tests.integration.local_runs import finish_local, kill_peer, local_run, wait_for_steps

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # 1-2 min; load-sensitive

RUN = """
[run]
run_id = "diloco-churn"
compute_aware = false
stages = {stages}
n_layer = 2
n_head = 2
n_embd = 32
block_size = 16
batch_size = 8
sync = "diloco"
inner_steps = 4
checkpoint_interval = 4
"""
STEPS = 24
KILL_AFTER_STEP = 9


# 2 stages: the survivors are 1 x 2 and a spare; 1 stage: 3 x 1, replicas that never step in
# lockstep and keep no state one step back (worker/session.py): the start is still agreed on a
# state of the stage, and every survivor's outer count is carried
@pytest.mark.parametrize(("stages", "survivors"), [(2, [2]), (1, [1, 1, 1])])
def test_diloco_survives_a_killed_replica(
    tmp_path: Path, stages: int, survivors: list[int]
) -> None:
    run = tmp_path / "run.toml"
    run.write_text(RUN.format(stages=stages))
    workdir = tmp_path / "swarm"
    with local_run(
        "--peers", "4", "--run", str(run), "--steps", str(STEPS), "--workdir", str(workdir)
    ) as proc:
        wait_for_steps(proc, workdir, KILL_AFTER_STEP, timeout_s=150)
        kill_peer(workdir, 3)
        summary = finish_local(proc, timeout_s=300)
    # `local` exits 0 only once the last step's loss is in; diloco's replicas do not step in
    # lockstep, so a few steps before the kill may lack the dead replica's loss (and are left
    # out of the summary): not steps lost
    assert STEPS - 2 * 4 <= summary["steps"] <= STEPS
    assert [len(p) for p in summary["plan"]["pipelines"]] == survivors
    logs = "".join((workdir / f"peer-{i}.log").read_text() for i in range(3))
    assert "STAGE STATE LOST" not in logs and "started fresh" not in logs
    resumed_at = [
        int(line.rsplit("start at step ", 1)[1].split()[0])
        for line in logs.splitlines()
        if "agreed to start at step" in line
    ]
    assert max(resumed_at) >= KILL_AFTER_STEP - 4, resumed_at  # resumed, not restarted
    # the survivors' outer steps went on past the kill, up to the final round after the last step
    applied = [line for line in logs.splitlines() if "outer step" in line and "applied" in line]
    assert any(f"round of step {STEPS - 1}" in line for line in applied), applied[-5:]
    # the outer state was carried, not restarted: each survivor's first outer step after its
    # resume continues the count its resumed state held (a failed round applies nothing: the
    # victim's, and the one the re-plan stopped, so the counts depend on timing), and at least
    # one carried count was not 0
    carried, first_after_resume = [], []
    for i in range(3):
        lines = (workdir / f"peer-{i}.log").read_text().splitlines()
        resumed = [n for n, line in enumerate(lines) if "resumed layers" in line]
        if not resumed:  # the spare
            continue
        after = lines[resumed[-1] :]
        [count] = [
            int(line.split("outer state carried: ", 1)[1].split()[0])
            for line in after
            if "outer state carried: " in line
        ][:1]
        first = [
            int(line.split("outer step ", 1)[1].split()[0]) for line in after if line in applied
        ]
        carried.append(count)
        first_after_resume.append(first[0] if first else None)
    assert first_after_resume == [count + 1 for count in carried], (carried, first_after_resume)
    assert max(carried) >= 1, carried
    losses = summary["loss"]
    assert sum(losses[-3:]) < sum(losses[:3]) - 0.3, losses
    assert not processes_with(str(workdir)), "a process of the run is left"
