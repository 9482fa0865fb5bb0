"""`local --device cuda` on a machine with a CUDA GPU (skipped elsewhere): four `join` nodes
share the GPU, their passes run under bf16 autocast (on an older GPU in fp32: the run sets no
`loss_scale`), and the swarm's losses stay close to the one-process fp32 reference on the CPU.
CI has no GPU; this runs where one is lent (docs/operations.md, "GPUs")."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from p2ptrain.records.run import load_run_spec
from p2ptrain.train.reference import train_reference
from p2ptrain.worker.device import precision_note
from tests.integration.local_runs import peer_logs, run_local, tiny_run_toml, tiny_swarm

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here"),
]
STEPS = 8


def test_four_peers_on_one_gpu_train_close_to_the_cpu_reference(tmp_path: Path) -> None:
    args, workdir = tiny_swarm(tmp_path, tiny_run_toml("gpu-test"), peers=4, steps=STEPS)
    summary = run_local(*args, "--device", "cuda")
    assert [len(p) for p in summary["plan"]["pipelines"]] == [2, 2]
    logs = peer_logs(workdir)
    # every worker on the GPU, in the precision it has (bf16 from Ampere on)
    assert logs.count(f"training on cuda:0 ({precision_note(torch.device('cuda', 0))})") == 4
    spec = load_run_spec(tmp_path / "run.toml").replace(steps=STEPS, compression="none")
    reference = train_reference(spec)  # fp32 on the CPU
    assert summary["loss"] != reference  # not the CPU's arithmetic
    torch.testing.assert_close(summary["loss"], reference, rtol=3e-2, atol=0)
