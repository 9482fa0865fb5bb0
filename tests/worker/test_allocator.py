"""The worker's allocator setting (worker/allocator.py): with it, the buffers a training step
frees are reused from the heap in the next one, not returned to the kernel and faulted in
again."""

from __future__ import annotations

import subprocess
import sys

import pytest

# steps of the default model at 16 rows; prints the minor page faults of the last 10 steps
STEPS = """
import resource, sys, torch
torch.set_num_threads(1)
if sys.argv[1] == "keep":
    from p2ptrain.worker.allocator import keep_freed_memory
    assert keep_freed_memory()
from p2ptrain.records.run import RunSpec
from p2ptrain.train.model import build_model, loss_fn
from p2ptrain.train.optim import make_optimizer
spec = RunSpec()
model = build_model(spec)
optimizer = make_optimizer(model, spec)
def step(seed):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randint(0, spec.model.vocab_size, (16, spec.model.block_size + 1), generator=generator)
    loss_fn(model(x[:, :-1]), x[:, 1:]).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
for seed in range(5):
    step(seed)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for seed in range(5, 15):
    step(seed)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults_a_step(mode: str) -> float:
    out = subprocess.run(
        [sys.executable, "-c", STEPS, mode], capture_output=True, text=True, check=True
    )
    return int(out.stdout.split()[-1]) / 10


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_steps_freed_buffers_are_reused_without_page_faults() -> None:
    default, kept = _faults_a_step("default"), _faults_a_step("keep")
    # glibc's defaults trimmed and re-faulted thousands of pages a step (2,300-5,300 measured)
    assert default > 500, default
    assert kept < 100, kept
