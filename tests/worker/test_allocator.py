"""The worker's allocator setting (worker/allocator.py): with it, the buffers a training step
frees are reused from the heap in the next one, not returned to the kernel and faulted in
again."""

from __future__ import annotations

import ctypes
import ctypes.util
import statistics
import subprocess
import sys

import pytest

# steps of the default model at 16 rows; prints the minor page faults of each of the last 10
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
for seed in range(5, 15):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    step(seed)
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


# a 48 MiB block malloc'd, written and freed 4 times after 3 warm-ups; prints each one's faults.
# glibc's dynamic mmap threshold stops at 32 MiB, so by default such a block always gets its
# own mmap and every page faults again: unlike a model step's mix of sizes, whose default
# faults depend on the order of earlier frees (2,300-5,300 a step here, 176 once on CI's box)
BLOCKS = """
import ctypes, ctypes.util, resource, sys
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
if sys.argv[1] == "keep":
    from p2ptrain.worker.allocator import keep_freed_memory
    assert keep_freed_memory()
size = 48 << 20
def block():
    pointer = libc.malloc(size)
    libc.memset(pointer, 1, size)
    libc.free(pointer)
for _ in range(3):
    block()
for _ in range(4):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block()
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(script: str, mode: str) -> list[int]:
    out = subprocess.run(
        [sys.executable, "-c", script, mode], capture_output=True, text=True, check=True
    )
    return [int(n) for n in out.stdout.split()]


def _heap_takes_a_gibibyte_block() -> bool:
    """Whether this glibc lets the heap serve blocks past 32 MiB (some builds cap it there)."""
    name = ctypes.util.find_library("c")
    probe = f"import ctypes; print(ctypes.CDLL({name!r}).mallopt(-3, 1 << 30))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    return out.stdout.strip() == "1"


linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")


@linux_only
def test_kept_memory_serves_a_freed_large_block_again_without_faulting() -> None:
    if not _heap_takes_a_gibibyte_block():
        pytest.skip("this glibc caps the mmap threshold at 32 MiB")
    default, kept = _faults(BLOCKS, "default"), _faults(BLOCKS, "keep")
    pages = (48 << 20) // 4096
    assert all(faults >= pages for faults in default), default
    # a block is 12,288 pages; a few may be the interpreter's own
    assert all(faults < 64 for faults in kept), kept


@linux_only
def test_a_steps_freed_buffers_are_reused_without_page_faults() -> None:
    kept = _faults(STEPS, "keep")
    # most steps fault nothing; the odd step that grows an interpreter arena or collects
    # garbage (more of them on a busy machine: a mean of 141 once under CI's two workers) does
    # not decide it
    assert statistics.median(kept) < 100, kept
