"""`python -m p2ptrain.worker --plan PLAN.json --name NAME`: workers on a static plan, no control
process; they rendezvous through hello files next to the plan and print metrics as JSON lines."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from p2ptrain.records.run import RunSpec
from p2ptrain.train.checkpoint_read import read_file
from p2ptrain.train.reference import train_reference

pytestmark = pytest.mark.integration
WORKER = [sys.executable, "-m", "p2ptrain.worker"]


def test_two_stage_pipeline_on_a_static_plan(tmp_path: Path) -> None:
    spec = RunSpec().replace(
        run_id="static",
        stages=2,
        n_layer=2,
        n_head=2,
        n_embd=32,
        block_size=16,
        batch_size=4,
        steps=3,
        compression="none",
        checkpoint_dir=str(tmp_path / "ckpt"),
    )
    plan_path = tmp_path / "plan.json"
    plan = {"plan": {"epoch": 0, "stages": 2, "pipelines": [["w0", "w1"]]}, "run": spec.to_dict()}
    plan_path.write_text(json.dumps(plan))
    procs = [
        subprocess.Popen(
            # on the CPU, as the one-process reference: a GPU's bf16 passes are not exact
            [*WORKER, "--plan", str(plan_path), "--name", name, "--device", "cpu"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        for name in ("w0", "w1")
    ]
    try:
        outputs = [p.communicate(timeout=180)[0].decode() for p in procs]
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert [p.returncode for p in procs] == [0, 0]
    metrics = [json.loads(line) for line in outputs[1].splitlines() if line.startswith("{")]
    losses = [m["loss"] for m in metrics if m["type"] == "metrics"]
    torch.testing.assert_close(losses, train_reference(spec), rtol=1e-4, atol=0)
    hello = json.loads((tmp_path / "w0.hello.json").read_text())
    assert hello["peer_id"].startswith("12D3KooW") and hello["data_addrs"]
    # at the end: each stage's latest state and the last steps' history (3 steps, all kept)
    names = {p.name for p in (tmp_path / "ckpt").iterdir()}
    assert names == {"stage-L0-1.pt", "stage-L1-2.pt"} | {
        f"stage-L{a}-{a + 1}.step{s}.pt" for a in (0, 1) for s in (2, 3)
    }
    assert read_file(tmp_path / "ckpt" / "stage-L1-2.pt")["step"] == 3
