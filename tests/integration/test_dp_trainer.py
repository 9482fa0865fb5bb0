"""The hivemind.Optimizer baseline of `bench e2e` (harness/dp_trainer.py): two peers on 127.0.0.1
train the whole model data-parallel and follow the single-process reference loss."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from p2ptrain.harness.dp_swarm import DataParallelSwarm
from p2ptrain.records.run import RunSpec
from p2ptrain.train.reference import train_reference

pytestmark = pytest.mark.integration

TINY = RunSpec().replace(
    run_id="dp-trainer-test",
    stages=1,
    n_layer=2,
    n_head=2,
    n_embd=32,
    block_size=16,
    batch_size=8,
    compression="none",
    steps=3,
)


def test_two_peers_train_the_global_batch_like_one_process(tmp_path: Path) -> None:
    with DataParallelSwarm(TINY, 2, tmp_path) as swarm:
        swarm.wait_ready(timeout_s=120)
        started = swarm.start()
        steps = swarm.follow(stall_timeout_s=60)
        exit_codes = swarm.wait_exit()
    assert [s for s, _, _ in steps] == [0, 1, 2]
    losses = [loss for _, loss, _ in steps]
    assert all(math.isfinite(loss) for loss in losses)
    assert all(at >= started for _, _, at in steps)
    assert exit_codes == [0, 0]
    # every step averaged both halves of the global batch: the one-process losses, up to
    # float rounding of the all-reduce
    assert losses == pytest.approx(train_reference(TINY), abs=1e-4)
