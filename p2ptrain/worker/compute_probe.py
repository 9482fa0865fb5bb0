"""Time a stage of the run's model on the device that will train (once per run spec).

The planner prices each peer's stages from this (schedule/compute.py): seconds per row of a
micro-batch, forward + backward, for one transformer block, the embedding and the head with the
loss. Each piece runs once to warm up, then REPEATS times; the median is kept (robust to a
scheduler hiccup on a busy machine). On the default run spec it takes well under a second on CPU.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from p2ptrain.records import RunSpec, StageCompute
from p2ptrain.train.model import Block, Embedding, GPTConfig, Head, loss_fn

REPEATS = 5
MAX_ROWS = 8  # time at most this many rows: the cost is linear in rows, the probe stays short


def probe_rows(spec: RunSpec) -> int:
    """Rows of the timed micro-batch: the run's micro-batch with one replica, at most MAX_ROWS."""
    return max(1, min(MAX_ROWS, spec.batch_size // spec.micro_batches))


def measure_stage_compute(spec: RunSpec, device: torch.device | None = None) -> StageCompute:
    """Median forward + backward seconds per row of one block, the embedding and the head."""
    device = device or torch.device("cpu")
    config = GPTConfig.from_spec(spec)
    rows = probe_rows(spec)
    shape = (rows, config.block_size)
    generator = torch.Generator().manual_seed(spec.seed)
    tokens = torch.randint(0, config.vocab_size, shape, generator=generator).to(device)
    hidden = torch.randn((*shape, config.n_embd), generator=generator).to(device)
    block, embed, head = Block(config).to(device), Embedding(config).to(device), Head(config)
    head = head.to(device)

    def block_pass() -> None:
        x = hidden.detach().requires_grad_(True)
        out = block(x)
        out.backward(torch.ones_like(out))

    def embed_pass() -> None:
        out = embed(tokens)
        out.backward(torch.ones_like(out))

    def head_pass() -> None:
        x = hidden.detach().requires_grad_(True)
        loss_fn(head(x), tokens).backward()

    seconds = [_median_s(run, device) / rows for run in (block_pass, embed_pass, head_pass)]
    return StageCompute(
        block_row_s=seconds[0],
        embed_row_s=seconds[1],
        head_row_s=seconds[2],
        rows=rows,
        device=_device_name(device),
        run_id=spec.run_id,
    )


def _median_s(run: Callable[[], None], device: torch.device) -> float:
    times = []
    for i in range(REPEATS + 1):
        _sync(device)
        start = time.perf_counter()
        run()
        _sync(device)
        if i:  # the first pass warms up (allocations, kernels)
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda {torch.cuda.get_device_name(device)}"[:80]
    return str(device)
