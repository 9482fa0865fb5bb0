"""`sync = "diloco"` end to end: `p2ptrain local` with 4 join nodes on 127.0.0.1 (2 stages x 2
replicas), each replica training its own batches, each stage's two fragments (Streaming DiLoCo's
`outer_fragments = 2`) meeting their groups every H = 4 steps at staggered offsets
(worker/averaging/outer_rounds.py); the loss falls and the replicas of each stage end with the
same parameters and outer state (up to the fp16 rounding of the exchange)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from p2ptrain.train import state_file
from tests.integration.local_runs import run_local, tiny_run_toml

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # ~45 s

RUN = tiny_run_toml("diloco-test", 'sync = "diloco"', "inner_steps = 4", "outer_fragments = 2")
STEPS = 12


def test_two_diloco_replicas_train_and_agree_after_their_outer_rounds(tmp_path: Path) -> None:
    run = tmp_path / "run.toml"
    run.write_text(RUN)
    workdir = tmp_path / "swarm"
    summary = run_local(
        "--peers",
        "4",
        "--run",
        str(run),
        "--steps",
        str(STEPS),
        "--workdir",
        str(workdir),
        timeout_s=240,
    )
    assert [len(p) for p in summary["plan"]["pipelines"]] == [2, 2]
    losses = summary["loss"]
    assert len(losses) == STEPS and sum(losses[-3:]) < sum(losses[:3]) - 0.3, losses
    # every fragment's rounds were averaged over both replicas, the four (stage, fragment)
    # slots a step apart from the first period's end: stage 0's fragments after steps 3, 7 and
    # 5, 9; stage 1's after 4, 8 and 6, 10; every fragment after 11. Each applied by both
    logs = {i: (workdir / f"peer-{i}.log").read_text() for i in range(4)}
    applied = {i: log.count("applied (round of step") for i, log in logs.items()}
    assert sorted(applied.values()) == [6, 6, 6, 6], applied
    assert "fragment 2/2, 2 replicas)" in "".join(logs.values())
    assert "2 replicas)" in logs[0] and "not applied" not in "".join(logs.values())
    assert "outer 3 (H 4) avg ok" in "".join(logs.values())  # the progress line
    # both replicas of each stage end with the same parameters and outer state
    finals: dict[str, list[dict]] = {}
    for path in workdir.glob("peer-*/checkpoints/stage-L*-*.pt"):
        if ".step" not in path.name:
            finals.setdefault(path.name, []).append(state_file.read(path))
    assert sorted(finals) == ["stage-L0-1.pt", "stage-L1-2.pt"]
    for name, (a, b) in finals.items():
        assert a["step"] == b["step"] == STEPS
        for tensors in ("model_state", "outer_state"):
            for key, tensor in a[tensors].items():
                other = b[tensors][key].float()
                scale = float(tensor.float().norm()) + 1e-12
                # hivemind hands each member its average as an fp16 delta from its own part:
                # the replicas agree to ~1e-4 of the norm, not bit for bit
                assert float((tensor.float() - other).norm()) / scale < 2e-3, (name, key)
        assert int(a["outer_state"]["outer/steps"]) == int(b["outer_state"]["outer/steps"])
        assert torch.isfinite(
            torch.cat([t.float().reshape(-1) for t in a["model_state"].values()])
        ).all()
