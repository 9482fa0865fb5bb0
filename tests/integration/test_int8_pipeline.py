"""compression = "int8" between two pipeline stages over real worker processes on 127.0.0.1:
the run trains (falling loss) within 1% of the unquantised run's losses, and the bytes that
cross the boundary are the planner's figure (schedule/wire_bytes.py), not fp16's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from p2ptrain.harness.direct_swarm import LocalSwarm, plan_for
from p2ptrain.records import MetricsReport
from p2ptrain.schedule.workload import step_traffic
from p2ptrain.train.reference import train_reference
from tests.integration.tiny_specs import TINY_TWO_STAGES

# ~80 s on this box: slow; tests/worker/pipeline/test_int8_frames.py is the default suite's part
pytestmark = [pytest.mark.integration, pytest.mark.slow]

SPEC = TINY_TWO_STAGES.replace(run_id="int8-pipeline-test", compression="int8", steps=8, lr=3e-3)


def test_int8_activations_train_two_stages_within_one_percent(tmp_path: Path) -> None:
    spec = SPEC.replace(checkpoint_dir=str(tmp_path / "ckpt"))  # the exit's checkpoint goes here
    with LocalSwarm(spec, 2, tmp_path) as swarm:
        hellos = swarm.wait_hellos()
        plan = plan_for(spec, hellos)
        swarm.send_plan(plan)
        messages = swarm.collect_until_exit(timeout_s=120)
        exit_codes = swarm.wait_exit()
    assert exit_codes == [0, 0], [swarm.log_tail(i) for i in range(2)]
    first = plan.pipelines[0][0]
    reports = [m for _, m in messages if isinstance(m, MetricsReport)]
    losses = {m.step: m.loss for m in reports if m.loss is not None}
    loss = [losses[s] for s in range(SPEC.optim.steps)]
    assert loss[-1] < 0.95 * loss[0], loss
    # fp32 activations in one process: fp16's wire is within 1e-4 of it (test_data_plane.py)
    reference = train_reference(SPEC.replace(compression="none"))
    torch.testing.assert_close(loss, reference, rtol=1e-2, atol=0)
    assert loss != reference  # the frames really were quantised

    # the last stage's counters: activations in from the first stage, gradients out to it
    final = max((m for m in reports if m.stage == 1), key=lambda m: m.step)
    link = final.link_bytes[first]
    frame_bytes = step_traffic(SPEC, 2, 1).activation_bytes  # a micro-batch's, one direction
    assert frame_bytes == 4 * 16 * (32 + 4)  # rows x (a byte a value + an fp32 scale)
    num_frames = SPEC.optim.steps * SPEC.optim.micro_batches
    # payloads exactly; a header adds ~210 bytes (room here for a retry of every frame)
    headers_at_most = 2 * num_frames * 300
    assert num_frames * frame_bytes <= link.received <= num_frames * frame_bytes + headers_at_most
    assert num_frames * frame_bytes <= link.sent <= num_frames * frame_bytes + headers_at_most
