"""Wire codecs for activations and their gradients between pipeline stages, and the stage
boundaries that give a single process a compression's round trip (int8 rows, fp16).

`compression = "int8"`: each row (the last dimension) as an fp32 scale (max|x| / 127) and int8
values. fp32 scales, not fp16: an activation gradient's row maximum is often below fp16's
smallest subnormal. The decoder is total, as train/codecs.py's are: bytes and the shape the
receiver expects in, a finite fp32 tensor of exactly that shape out, or WireError.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

# the pseudo-gradient codecs' int8 quantisation and payload checks: one arithmetic for both
from p2ptrain.train.codecs import _F32, _as_bytes, _expect_size, _finite, _int8_rows, _numel, _view


def encode_int8_rows(x: torch.Tensor) -> torch.Tensor:
    """Each row of `x` (its last dimension) as an fp32 scale and int8 values; scales first."""
    scales, codes = _int8_rows(x, x.shape[-1])
    return torch.cat([scales.view(torch.uint8), codes.reshape(-1).view(torch.uint8)])


def decode_int8_rows(payload: torch.Tensor | bytes, shape: Sequence[int]) -> torch.Tensor:
    data = _as_bytes(payload)
    numel = _numel(shape)
    row = shape[-1] if len(shape) else 1
    num_rows = numel // row if row else 0
    _expect_size(data, num_rows * (_F32 + row), "int8 activation payload")
    scales = _finite(_view(data[: num_rows * _F32], torch.float32), "int8 activation payload")
    codes = _view(data[num_rows * _F32 :], torch.int8).view(num_rows, row).float()
    return _finite((codes * scales[:, None]).reshape(tuple(shape)), "int8 activation payload")


def int8_rows_roundtrip(x: torch.Tensor) -> torch.Tensor:
    """What the receiver of encode_int8_rows(x) gets, without the bytes (same arithmetic)."""
    scales, codes = _int8_rows(x, x.shape[-1])
    return (codes.float() * scales[:, None]).reshape(x.shape).to(x.dtype)


class Int8RowsBoundary(torch.autograd.Function):
    """A stage boundary carrying int8 rows both ways: the forward quantizes the activations,
    the backward their gradients (what two pipeline peers exchange with compression = int8)."""

    @staticmethod
    def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
        return int8_rows_roundtrip(x)

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
        return int8_rows_roundtrip(grad)


class Fp16Boundary(torch.autograd.Function):
    """A stage boundary carrying fp16 both ways (compression = fp16, the default)."""

    @staticmethod
    def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
        return x.clamp(-65504.0, 65504.0).half().to(x.dtype)

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
        return grad.clamp(-65504.0, 65504.0).half().to(grad.dtype)


def int8_rows_bytes_per_value(row: int) -> float:
    return (_F32 + row) / row
