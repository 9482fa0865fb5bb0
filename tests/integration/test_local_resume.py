"""A run outlives its swarm (issue 30), as an organiser meets it: `p2ptrain local --peers 2`
runs steps 0..9 with a checkpoint every 5 steps into an absolute checkpoint_dir and stops; the
same command with steps = 20 starts a new swarm (new identities, a new plan lineage) that
resumes at step 10 and ends at step 20, deleting none of the first swarm's stamped states."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.local_runs import peer_logs, run_local

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RUN = """
[run]
run_id = "resume-test"
compute_aware = false
stages = 2
n_layer = 2
n_head = 2
n_embd = 32
block_size = 16
batch_size = 8
checkpoint_interval = 5
checkpoint_dir = "{directory}"
"""


def test_a_restarted_swarm_resumes_the_run_and_keeps_the_first_swarms_states(
    tmp_path: Path,
) -> None:
    checkpoints = tmp_path / "checkpoints"
    run = tmp_path / "run.toml"
    run.write_text(RUN.format(directory=checkpoints))
    first = run_local(
        "--peers", "2", "--run", str(run), "--steps", "10", "--workdir", str(tmp_path / "first")
    )
    assert first["first_step"] == 0 and first["steps"] == 10
    stamped = {p.name for p in checkpoints.glob("stage-*.step*.pt")}
    assert any(".step10." in name for name in stamped), stamped

    second = run_local(
        "--peers", "2", "--run", str(run), "--steps", "20", "--workdir", str(tmp_path / "second")
    )
    # its first reported step is 11 (0-based 10): it started at the first swarm's last state
    assert second["first_step"] == 10 and second["steps"] == 10
    # and its loss goes on from the first swarm's last loss, not from the initial one
    initial, last = first["loss"][0], first["loss"][-1]
    assert abs(second["loss"][0] - last) < abs(second["loss"][0] - initial), (first, second)
    assert stamped <= {p.name for p in checkpoints.glob("stage-*.step*.pt")}
    logs = peer_logs(tmp_path / "second")
    assert "resumed from step 10 (lineage " in logs
