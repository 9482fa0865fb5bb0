"""Bytes on the wire of what a run sends, by its wire formats: arithmetic only, for the traffic
model (workload.py).

The codecs themselves live in train/codecs.py and train/activation_codecs.py (torch, a layer
above the scheduler, which cannot import it); the figures here follow their layouts exactly: tests/schedule/test_diloco_cost.py
checks them against the codecs' own byte counts, and tests/worker/pipeline/test_int8_frames.py against
the pipeline frames as the transport writes them (worker/pipeline/frames.py), for every `compression`.
"""

from __future__ import annotations

import math

# bytes of one value of activations (and their gradients) on the wire, by the run spec's
# `compression`; int8 adds one fp32 scale a row (a row: one token's n_embd values)
BYTES_PER_VALUE = {"fp16": 2, "bf16": 2, "int8": 1, "none": 4}
SCALE_BYTES = 4  # fp32: an activation gradient's row maximum can be below fp16's smallest
INT8_BLOCK = 256  # values per scale of a block-wise int8 pseudo-gradient
TOPK_CHUNK = 4096  # a top-k payload picks its entries per chunk of this many values
TOPK_LEVELS_BYTES = 2 * 4  # ... each chunk's two magnitude levels, fp32


def activation_row_bytes(compression: str, n_embd: int) -> float:
    """One token's activations (or their gradient) crossing a boundary, one direction."""
    scale = SCALE_BYTES if compression == "int8" else 0
    return float(n_embd * BYTES_PER_VALUE.get(compression, 4) + scale)


def gradient_bytes(compression: str, numel: int) -> float:
    """A stage's gradient averaged every step (sync = "step"): fp16, unless `compression` is
    "none" (int8 compresses activations only; averaging stays fp16)."""
    return float(numel * (4 if compression == "none" else 2))


def outer_payload_bytes(codec: str, numel: int, fraction: float) -> float:
    """A stage's pseudo-gradient of `numel` values encoded with `codec` (sync = "diloco"):
    fp16 2 bytes a value; int8 a byte a value and an fp32 scale a block of 256 (1.016); top-k
    per chunk of 4096 the ceil(fraction x size) largest entries, each a 12-bit index and a
    2-bit value, and two fp32 levels (0.0545 bytes a value at 3%)."""
    if codec == "int8":
        return float(-(-numel // INT8_BLOCK) * (SCALE_BYTES + INT8_BLOCK))
    if codec == "topk":
        full, tail = divmod(numel, TOPK_CHUNK)
        chunks = full + (1 if tail else 0)
        sent = full * _topk_count(TOPK_CHUNK, fraction) + (
            _topk_count(tail, fraction) if tail else 0
        )
        index_bytes = 3 * (sent // 2) + 2 * (sent % 2)  # 12 bits: two in three bytes
        return float(chunks * TOPK_LEVELS_BYTES + index_bytes + -(-sent // 4))
    return float(2 * numel)


def _topk_count(size: int, fraction: float) -> int:
    return min(size, max(1, math.ceil(fraction * size - 1e-9)))
