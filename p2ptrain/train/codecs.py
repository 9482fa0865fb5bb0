"""Wire codecs for a stage's DiLoCo pseudo-gradient, and the payload checks every decoder shares.

Pseudo-gradients travel as one flat fp32 vector per stage (train/outer.py):

    fp16   2 bytes a value
    int8   blocks of 256 values, each an fp32 scale (max|x| / 127) and 256 int8 values, symmetric:
           1.016 bytes a value
    topk   chunks of 4096 values; per chunk the ceil(fraction x size) entries of largest
           magnitude, their positions as 12-bit indices (two in three bytes), each value as
           2 bits (sign and one of two magnitude levels, the levels as two fp32 per chunk). What
           is not sent (the other entries and the rounding of the sent ones) is error feedback:
           `TopKCompressor` keeps it per replica and adds it to the next round's pseudo-gradient.
           At 3%: 0.058 bytes a value (34x fewer than fp16)

Activations between pipeline stages have codecs of their own (train/activation_codecs.py), built
on the same int8 quantisation and payload checks.

Every encoder returns one uint8 tensor (the bytes on the wire); every decoder is total: it gets
the bytes and the shape the receiver expects (from the plan, never from the sender) and returns a
finite fp32 tensor of exactly that shape, or raises WireError.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from p2ptrain.errors import WireError

INT8_BLOCK = 256
TOPK_CHUNK = 4096  # 2**12: an index within a chunk fits 12 bits
_F32 = 4

OUTER_CODECS = ("fp16", "int8", "topk")


def _as_bytes(payload: torch.Tensor | bytes | bytearray | memoryview) -> torch.Tensor:
    if isinstance(payload, torch.Tensor):
        if payload.dtype != torch.uint8 or payload.dim() != 1:
            raise WireError("malformed payload: not a flat uint8 tensor")
        return payload
    raw = bytes(payload)
    return (
        torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        if raw
        else torch.zeros(0, dtype=torch.uint8)
    )


def _view(data: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Bytes reinterpreted as `dtype` (a fresh copy: a slice may sit at any byte offset)."""
    return data.clone().view(dtype)


def _expect_size(data: torch.Tensor, size: int, what: str) -> None:
    if data.numel() != size:
        raise WireError(f"malformed {what}: {data.numel()} bytes, expected {size}")


def _finite(values: torch.Tensor, what: str) -> torch.Tensor:
    if not bool(torch.isfinite(values).all()):
        raise WireError(f"malformed {what}: a value is not finite")
    return values


def _numel(shape: Sequence[int]) -> int:
    # torch refuses (RuntimeError) sizes whose product overflows int64, even beside a 0
    if any(d < 0 for d in shape) or math.prod(d for d in shape if d) >= 2**63:
        raise WireError(f"malformed shape: {tuple(shape)}")
    return math.prod(shape)


# --- fp16 ---


def encode_fp16(values: torch.Tensor) -> torch.Tensor:
    """fp16 bytes of `values` (saturated to fp16's range, so no infinity is sent)."""
    half = values.detach().float().clamp(-65504.0, 65504.0).half().contiguous()
    return half.reshape(-1).view(torch.uint8)


def decode_fp16(payload: torch.Tensor | bytes, shape: Sequence[int]) -> torch.Tensor:
    data = _as_bytes(payload)
    numel = _numel(shape)
    _expect_size(data, 2 * numel, "fp16 payload")
    return _finite(_view(data, torch.float16).float().reshape(tuple(shape)), "fp16 payload")


# --- block-wise int8 ---


def _int8_rows(values: torch.Tensor, row: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(scales (n,), int8 codes (n, row)) of `values` cut into rows of `row` (the last padded)."""
    flat = values.detach().float().reshape(-1)
    pad = (-flat.numel()) % row
    rows = torch.nn.functional.pad(flat, (0, pad)).view(-1, row)
    scales = rows.abs().amax(dim=1) / 127.0
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    codes = torch.round(rows / safe[:, None]).clamp(-127, 127).to(torch.int8)
    return scales, codes


def encode_int8_blocks(values: torch.Tensor, block: int = INT8_BLOCK) -> torch.Tensor:
    """Block-wise symmetric int8: all the blocks' fp32 scales, then all the int8 codes."""
    scales, codes = _int8_rows(values, block)
    return torch.cat([scales.view(torch.uint8), codes.reshape(-1).view(torch.uint8)])


def decode_int8_blocks(
    payload: torch.Tensor | bytes, shape: Sequence[int], block: int = INT8_BLOCK
) -> torch.Tensor:
    data = _as_bytes(payload)
    numel = _numel(shape)
    num_blocks = -(-numel // block)
    _expect_size(data, num_blocks * (_F32 + block), "int8 payload")
    scales = _finite(_view(data[: num_blocks * _F32], torch.float32), "int8 payload")
    codes = _view(data[num_blocks * _F32 :], torch.int8).view(num_blocks, block).float()
    # a finite scale times 127 may not be (3e38 x 127): the product is checked too
    values = (codes * scales[:, None]).reshape(-1)[:numel].reshape(tuple(shape))
    return _finite(values, "int8 payload")


def int8_bytes_per_value(block: int = INT8_BLOCK) -> float:
    return (_F32 + block) / block


# --- top-k at 2 bits ---
# Layout: every chunk's two levels (fp32), then every chunk's indices as one 12-bit stream
# (two in three bytes, an odd last one in two), then every chunk's codes as one 2-bit stream.
# Chunks are TOPK_CHUNK values, the last one shorter; each sends topk_count(its size) entries.


def topk_count(size: int, fraction: float) -> int:
    """Entries a chunk of `size` values sends: ceil(fraction x size), at least one."""
    return min(size, max(1, math.ceil(fraction * size - 1e-9)))


def _groups(numel: int) -> list[tuple[int, int]]:
    """(number of chunks, chunk size): the full chunks, then the shorter last one if any."""
    full, tail = divmod(numel, TOPK_CHUNK)
    return [(n, size) for n, size in ((full, TOPK_CHUNK), (1 if tail else 0, tail)) if n]


def _layout(numel: int, fraction: float) -> tuple[int, int, int]:
    """(chunks, entries sent, payload bytes) of a top-k payload of `numel` values."""
    chunks = sum(n for n, _ in _groups(numel))
    sent = sum(n * topk_count(size, fraction) for n, size in _groups(numel))
    return chunks, sent, chunks * 2 * _F32 + _index_bytes(sent) + -(-sent // 4)


def topk_payload_bytes(numel: int, fraction: float) -> int:
    return _layout(numel, fraction)[2]


def topk_bytes_per_value(numel: int, fraction: float) -> float:
    return topk_payload_bytes(numel, fraction) / max(1, numel)


def _index_bytes(k: int) -> int:
    return 3 * (k // 2) + 2 * (k % 2)


def _pack12(indices: torch.Tensor) -> torch.Tensor:
    idx = indices.reshape(-1).to(torch.int32)
    pairs = idx[: idx.numel() // 2 * 2].view(-1, 2)
    a, b = pairs[:, 0], pairs[:, 1]
    packed = torch.stack([a & 0xFF, (a >> 8) | ((b & 0xF) << 4), b >> 4], dim=1).reshape(-1)
    if idx.numel() % 2:
        last = idx[-1:]
        packed = torch.cat([packed, last & 0xFF, last >> 8])
    return packed.to(torch.uint8)


def _unpack12(data: torch.Tensor, k: int) -> torch.Tensor:
    raw = data.to(torch.int32)
    triples = raw[: 3 * (k // 2)].view(-1, 3)
    a = triples[:, 0] | ((triples[:, 1] & 0xF) << 8)
    b = (triples[:, 1] >> 4) | (triples[:, 2] << 4)
    out = torch.stack([a, b], dim=1).reshape(-1)
    if k % 2:
        tail = raw[3 * (k // 2) :]
        out = torch.cat([out, tail[0:1] | (tail[1:2] << 8)])
    return out.long()


def _pack2(codes: torch.Tensor) -> torch.Tensor:
    flat = codes.reshape(-1).to(torch.int32)
    quads = torch.nn.functional.pad(flat, (0, (-flat.numel()) % 4)).view(-1, 4)
    return (quads[:, 0] | quads[:, 1] << 2 | quads[:, 2] << 4 | quads[:, 3] << 6).to(torch.uint8)


def _unpack2(data: torch.Tensor, k: int) -> torch.Tensor:
    raw = data.to(torch.int32)
    quads = torch.stack([(raw >> shift) & 0x3 for shift in (0, 2, 4, 6)], dim=1)
    return quads.reshape(-1)[:k]


def _decode_values(codes: torch.Tensor, levels: torch.Tensor) -> torch.Tensor:
    """codes (n, k): bit 0 picks the chunk's level (levels (n, 2)), bit 1 is the sign."""
    magnitude = torch.gather(levels, 1, (codes & 1).long())
    return torch.where((codes & 2) > 0, -magnitude, magnitude)


def _select(rows: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(indices (n, k) ascending, codes (n, k), levels (n, 2)) of each row's k largest entries."""
    indices = rows.abs().topk(k, dim=1, sorted=False).indices.sort(dim=1).values
    picked = torch.gather(rows, 1, indices)
    magnitude = picked.abs()
    # two levels per chunk: the mean magnitude of the values at or below the median, and above
    high = magnitude > magnitude.median(dim=1, keepdim=True).values
    num_high = high.sum(dim=1)
    low_level = (magnitude * ~high).sum(dim=1) / (k - num_high).clamp(min=1)
    high_level = torch.where(
        num_high > 0, (magnitude * high).sum(dim=1) / num_high.clamp(min=1), low_level
    )
    codes = high.to(torch.int32) | ((picked < 0).to(torch.int32) << 1)
    return indices, codes, torch.stack([low_level, high_level], dim=1)


def encode_topk(values: torch.Tensor, fraction: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(bytes, what the receiver decodes from them) of a flat vector's top `fraction` per chunk."""
    flat = values.detach().float().reshape(-1)
    decoded = torch.zeros_like(flat)
    all_levels, all_indices, all_codes = [], [], []
    start = 0
    for num_chunks, size in _groups(flat.numel()):
        rows = flat[start : start + num_chunks * size].view(num_chunks, size)
        indices, codes, levels = _select(rows, topk_count(size, fraction))
        decoded[start : start + num_chunks * size].view(num_chunks, size).scatter_(
            1, indices, _decode_values(codes, levels)
        )
        all_levels.append(levels.reshape(-1))
        all_indices.append(indices.reshape(-1))
        all_codes.append(codes.reshape(-1))
        start += num_chunks * size
    if not all_levels:
        return torch.zeros(0, dtype=torch.uint8), decoded
    payload = torch.cat(
        [
            torch.cat(all_levels).view(torch.uint8),
            _pack12(torch.cat(all_indices)),
            _pack2(torch.cat(all_codes)),
        ]
    )
    return payload, decoded


def decode_topk(payload: torch.Tensor | bytes, numel: int, fraction: float) -> torch.Tensor:
    """The flat vector of `numel` values (zeros where nothing was sent); WireError unless the
    bytes are exactly a top-k payload of that size: finite non-negative levels, and per chunk
    strictly increasing indices inside the chunk."""
    data = _as_bytes(payload)
    chunks, sent, total = _layout(numel, fraction)
    _expect_size(data, total, "top-k payload")
    levels = _finite(_view(data[: chunks * 2 * _F32], torch.float32), "top-k payload")
    if bool((levels < 0).any()):
        raise WireError("malformed top-k payload: a negative magnitude level")
    offset = chunks * 2 * _F32
    indices = _unpack12(data[offset : offset + _index_bytes(sent)], sent)
    codes = _unpack2(data[offset + _index_bytes(sent) :], sent)
    out = torch.zeros(numel, dtype=torch.float32)
    start, chunk, entry = 0, 0, 0
    for num_chunks, size in _groups(numel):
        k = topk_count(size, fraction)
        rows_indices = indices[entry : entry + num_chunks * k].view(num_chunks, k)
        if bool((rows_indices >= size).any()) or bool(
            (rows_indices[:, 1:] <= rows_indices[:, :-1]).any()
        ):
            raise WireError("malformed top-k payload: indices out of order or out of the chunk")
        values = _decode_values(
            codes[entry : entry + num_chunks * k].view(num_chunks, k),
            levels[2 * chunk : 2 * (chunk + num_chunks)].view(num_chunks, 2),
        )
        out[start : start + num_chunks * size].view(num_chunks, size).scatter_(
            1, rows_indices, values
        )
        start, chunk, entry = start + num_chunks * size, chunk + num_chunks, entry + num_chunks * k
    return out


class TopKCompressor:
    """One replica's top-k sender with error feedback: each round sends the top entries of
    (pseudo-gradient + what earlier rounds did not send) and keeps the rest for the next."""

    def __init__(self, numel: int, fraction: float) -> None:
        self.fraction = fraction
        self.residual = torch.zeros(numel, dtype=torch.float32)

    def encode(self, pseudo_gradient: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(bytes to send, the values they decode to); the residual keeps what was left out."""
        wanted = pseudo_gradient.detach().float().reshape(-1) + self.residual
        payload, sent = encode_topk(wanted, self.fraction)
        self.residual = wanted - sent
        return payload, sent

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return {"outer/residual": self.residual.clone()}

    def load_state_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        residual = tensors.get("outer/residual")
        if residual is None or residual.shape != self.residual.shape:
            raise WireError("malformed outer state: no residual of the stage's size")
        self.residual = _finite(residual.float().clone(), "outer state")


def outer_bytes_per_value(codec: str, numel: int, fraction: float) -> float:
    """Bytes on the wire per pseudo-gradient value with `codec` (fp16, int8 or topk)."""
    if codec == "fp16":
        return 2.0
    if codec == "int8":
        return int8_bytes_per_value()
    if codec == "topk":
        return topk_bytes_per_value(numel, fraction)
    raise ValueError(f"unknown outer codec {codec!r}")
