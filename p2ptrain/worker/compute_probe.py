"""Time a stage of the run's model on the device that will train (once per run spec).

The planner prices each peer's stages from this (schedule/compute.py): seconds per row of a
micro-batch, forward + backward, for one transformer block, the embedding and the head with the
loss. Each piece runs once to warm up, then again and again for at least its window (and
MIN_REPEATS times), over a few windows; the time kept is the best window's mean. A window
several scheduler periods long measures the throughput training will see: a peer under a CPU
quota (a cgroup's cpu.max, periods of 20-100 ms) runs a short pass at full speed and is throttled
only once its period's budget is spent, so the median of a few short passes would call it
fast. The best of a few windows leaves out what only happened to run alongside: eight equal
workers timed in one 0.4 s window each, on a 2-core box while their swarm started, read
1.7-8.5 ms per row and block. On the default run spec it takes about a second on CPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from p2ptrain.records import RunSpec, StageCompute
from p2ptrain.train.model import loss_fn, make_block, make_embedding, make_head
from p2ptrain.worker.device import memory_bytes, precision_for, sync

MIN_REPEATS = 3
# seconds each piece is timed for: the block dominates every stage; the embedding and the head
# occur once per pipeline
BLOCK_WINDOW_S = 0.3
EDGE_WINDOW_S = 0.1
BLOCK_WINDOWS = 3
EDGE_WINDOWS = 2
MAX_ROWS = 8  # time at most this many rows: the cost is linear in rows, the probe stays short


def probe_rows(spec: RunSpec) -> int:
    """Rows of the timed micro-batch: the run's micro-batch with one replica, at most MAX_ROWS."""
    return max(1, min(MAX_ROWS, spec.optim.batch_size // spec.optim.micro_batches))


def measure_stage_compute(spec: RunSpec, device: torch.device | None = None) -> StageCompute:
    """Mean forward + backward seconds per row of one block, the embedding and the head, on
    `device` (default: the CPU) in the precision training will use there; with the device's
    memory, which the planner checks stages against."""
    device = device or torch.device("cpu")
    precision = precision_for(device, spec.optim.loss_scale)
    config = spec.model_config()
    rows = probe_rows(spec)
    shape = (rows, config.block_size)
    generator = torch.Generator().manual_seed(spec.optim.seed)
    tokens = torch.randint(0, config.vocab_size, shape, generator=generator).to(device)
    hidden = torch.randn((*shape, config.n_embd), generator=generator).to(device)
    block, embed = make_block(config).to(device), make_embedding(config).to(device)
    head = make_head(config).to(device)  # a tied head costs the same: timed with its own weight

    def block_pass() -> None:
        x = hidden.detach().requires_grad_(True)
        with precision.passes():
            out = block(x)
        out.backward(torch.ones_like(out))

    def embed_pass() -> None:
        with precision.passes():
            out = embed(tokens)
        out.backward(torch.ones_like(out))

    def head_pass() -> None:
        x = hidden.detach().requires_grad_(True)
        with precision.passes():
            logits = head(x)
        loss_fn(logits.float(), tokens).backward()

    seconds = [
        min(_mean_s(run, device, window_s) for _ in range(windows)) / rows
        for run, window_s, windows in (
            (block_pass, BLOCK_WINDOW_S, BLOCK_WINDOWS),
            (embed_pass, EDGE_WINDOW_S, EDGE_WINDOWS),
            (head_pass, EDGE_WINDOW_S, EDGE_WINDOWS),
        )
    ]
    return StageCompute(
        block_row_s=seconds[0],
        embed_row_s=seconds[1],
        head_row_s=seconds[2],
        rows=rows,
        device=device_name(device),
        run_id=spec.run_id,
        memory_bytes=memory_bytes(device),
        precision=precision.name,
    )


def _mean_s(run: Callable[[], None], device: torch.device, window_s: float) -> float:
    run()  # warm up (allocations, kernels)
    sync(device)
    start = time.perf_counter()
    count = 0
    while count < MIN_REPEATS or time.perf_counter() - start < window_s:
        run()
        sync(device)
        count += 1
    return (time.perf_counter() - start) / count


def device_name(device: torch.device) -> str:
    """The device as the planner and `doctor` name it: `cuda NVIDIA H200`, `cpu`."""
    if device.type == "cuda":
        return f"cuda {torch.cuda.get_device_name(device)}"[:80]
    return str(device)
