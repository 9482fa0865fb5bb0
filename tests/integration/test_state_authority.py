"""Attack 4b over real worker processes on 127.0.0.1: a member of the plan (a spare) holds
crafted (well-shaped, finite) states of every stage at a newer step than the honest stage
members, announces them (signed with its own key, as any worker does) and serves them. The
honest workers neither start at its step nor fetch its states: they resume from their own.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from p2ptrain.harness.direct_swarm import LocalSwarm
from p2ptrain.records import Plan
from p2ptrain.train.checkpoint import record_step
from p2ptrain.train.checkpoint_folder import checkpoint_path
from p2ptrain.train.checkpoint_read import read_file
from p2ptrain.train.model import build_stage
from p2ptrain.train.optim import make_optimizer
from p2ptrain.train.snapshot import StageSnapshot
from tests.integration.tiny_specs import TINY_TWO_STAGES

pytestmark = pytest.mark.integration

SPEC = TINY_TWO_STAGES.replace(run_id="state-authority-test", steps=5)
HONEST_STEP, CRAFTED_STEP = 2, 3
CRAFTED_SCALE = 3.0


def _save(directory: Path, stage: int, step: int, scale: float = 1.0) -> None:
    model = build_stage(SPEC, stage, 2)
    with torch.no_grad():
        for param in model.parameters():
            param.mul_(scale)
    optimizer = make_optimizer(model, SPEC)
    record_step(directory, SPEC, model, StageSnapshot.take(model, optimizer, step))


def test_a_member_offering_crafted_newer_states_is_not_followed(tmp_path: Path) -> None:
    dirs = [tmp_path / name for name in ("honest0", "honest1", "hostile")]
    _save(dirs[0], 0, HONEST_STEP)
    _save(dirs[1], 1, HONEST_STEP)
    for stage in (0, 1):  # the hostile spare: every stage, at the honest step and a newer one
        for step in (HONEST_STEP, CRAFTED_STEP):
            _save(dirs[2], stage, step, CRAFTED_SCALE)
    flags = {i: ["--checkpoint-dir", str(d)] for i, d in enumerate(dirs)}
    with LocalSwarm(SPEC, 3, tmp_path / "swarm", worker_flags=flags) as swarm:
        hellos = swarm.wait_hellos()
        swarm.may_die = {2}  # the spare waits for a plan that never comes
        swarm.send_plan(
            Plan(
                term=0,
                epoch=0,
                planner="static",
                stages=2,
                pipelines=((hellos[0].peer_id, hellos[1].peer_id),),
                spares=(hellos[2].peer_id,),
                data_addrs={h.peer_id: h.data_addrs for h in hellos},
                cost_s=0.0,
            ),
            stop_spares=False,  # the hostile spare announces and serves
        )
        result = swarm.train()
        exit_codes = swarm.wait_exit(only=(0, 1))  # the spare stays till it is stopped
        logs = [swarm.log_tail(i, 400) for i in range(3)]
    # the honest start: steps 2, 3, 4 trained (the crafted step 3 would have left only 3, 4)
    assert result.steps == SPEC.optim.steps - HONEST_STEP, logs
    assert exit_codes[:2] == [0, 0], logs
    assert "fetched" not in logs[0] and "fetched" not in logs[1], logs
    # the honest final weights are near the honest state, far from the crafted one
    for stage, directory in ((0, dirs[0]), (1, dirs[1])):
        honest = build_stage(SPEC, stage, 2)
        final = read_file(checkpoint_path(directory, honest.layers))
        assert final["step"] == SPEC.optim.steps
        for name, tensor in honest.state_dict().items():
            if tensor.abs().max() > 0.1:  # a layer-norm gain (1.0) would be 3.0 if crafted
                ratio = final["model_state"][name].abs().max() / tensor.abs().max()
                assert ratio < 1.5, (name, ratio)
