"""Tensor frames between pipeline neighbours: the wire format and its validation.

A frame is `u32 header length | JSON header | raw tensor bytes`; the receiver answers one byte
(ACCEPTED, REJECTED or BUSY). The header names what the tensor is (activation or gradient, run,
plan term and epoch, step, micro-batch), who sent it, and its wire type and (logical) shape.
Before a single payload byte is trusted, the receiver checks every field against what it expects
from that neighbour right now.

Wire types: float32, float16, bfloat16 (the tensor's raw bytes), and int8_rows (compression =
"int8": each row of the last dimension as an fp32 scale, then the int8 values, all scales first;
train/activation_codecs.py). A float16 payload holds the values times 2^-scale_exp (a header field, 0 for
every other type): the sender picks it per frame so the largest magnitude lands in [2^14, 2^15).
Gradient frames carry the run's loss_scale (up to 2^24): cast as they were, an ordinary
gradient passed fp16's 65504, became inf and was refused. A power of two is exact both ways.
A payload is decoded (float16: to float32, times 2^scale_exp) to a tensor of the header's shape
before its values are checked (finite, within MAX_ABS_VALUE; a gradient within MAX_ABS_VALUE x
the run's loss_scale). Every refusal of a frame's bytes is a WireError.

Pure (torch only), so the rules are unit-testable without a network.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import asdict, dataclass
from typing import Any

import torch

from p2ptrain.errors import WireError
from p2ptrain.records import fields as f
from p2ptrain.records.run import MAX_RUN_ID_CHARS
from p2ptrain.records.run_sections import MAX_PAYLOAD_BYTES  # the run spec refuses larger runs
from p2ptrain.train import activation_codecs

# the p2pd stream handler name; v2: the header names the plan's term (v1 had the epoch alone,
# which restarts at 1 under a new term); v3: the header's scale_exp (a v2 float16 payload is
# unscaled: read as v3 it would be off by 2^scale_exp, so the two never talk)
PROTOCOL = "p2ptrain.pipe.v3"  # one frame a stream (still served and spoken: the last version's)
# v4: the same frames one after another on a stream, each answered (worker/kept_streams.py); an
# ACCEPTED frame was read whole, any other answer ends the stream
STREAM_PROTOCOL = "p2ptrain.pipe.v4"
MAX_HEADER_BYTES = 4096
# |value| above this in an activation or an (unscaled) gradient is refused like a malformed
# frame: a small GPT's hidden states stay within ~1e2 and their gradients far below 1, so only a
# broken or hostile neighbour sends more (fp16's own limit, 65504, would let far more through).
# Gradient frames carry the run's loss_scale (stage_step.py): their bound is this times it.
MAX_ABS_VALUE = 1e4
ACCEPTED, REJECTED, BUSY = b"\x01", b"\x00", b"\x02"  # BUSY: not ready yet, retry
HEADER_LEN = struct.Struct(">I")
MAX_DIMS = 8
_HEADER, _FRAME = "frame header", "frame"

ACTIVATION, GRADIENT = "act", "grad"
FLOAT_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
INT8_ROWS = "int8_rows"
WIRE_DTYPES = (*FLOAT_DTYPES, INT8_ROWS)
COMPRESSION_DTYPES = {"none": "float32", "fp16": "float16", "bf16": "bfloat16", "int8": INT8_ROWS}
_SCALE_BYTES = 4  # int8_rows: an fp32 scale a row
# float16 frames: |scale_exp| <= this keeps every decoded value a normal fp32 (65504 x 2^64 and
# 2^-24 x 2^-64 are), exact; an honest gradient at loss_scale 2^24 needs at most 2^23
MAX_SCALE_EXP = 64
_FP16_TOP_EXP = 15  # the largest magnitude is scaled into [2^14, 2^15): no rounding reaches inf


@dataclass(frozen=True)
class FrameHeader:
    kind: str  # ACTIVATION (forward) or GRADIENT (backward)
    run_id: str
    term: int  # the plan (term, epoch) the sender works under
    epoch: int
    step: int
    micro: int  # micro-batch index
    sender: str  # peer id; must equal the authenticated stream peer
    dtype: str  # a wire type (WIRE_DTYPES)
    shape: tuple[int, ...]  # of the tensor the payload decodes to
    num_bytes: int
    scale_exp: int = 0  # float16: the payload holds the values times 2^-scale_exp; else 0

    def encode(self) -> bytes:
        body = json.dumps(self.to_dict(), separators=(",", ":")).encode()
        return HEADER_LEN.pack(len(body)) + body

    def to_dict(self) -> dict[str, Any]:
        data = {**asdict(self), "shape": list(self.shape)}
        if not self.scale_exp:
            del data["scale_exp"]  # absent = 0: an unscaled frame's header is v2's, byte for byte
        return data

    @classmethod
    def decode(cls, body: bytes) -> FrameHeader:
        """Parse a header body (at most MAX_HEADER_BYTES): a valid header, or WireError for
        any other bytes."""
        if len(body) > MAX_HEADER_BYTES:
            raise WireError(f"oversized frame header: {len(body)} bytes")
        try:
            raw = json.loads(body)
        except (ValueError, RecursionError):  # not UTF-8, not JSON, deep nesting, huge ints
            raise f.malformed(_HEADER, "not JSON") from None
        return cls.from_dict(raw)

    @classmethod
    def from_dict(cls, data: object) -> FrameHeader:
        """A header from its JSON value: every field present (scale_exp may be left out: 0) and
        within bounds, or WireError. Whether it is the frame expected from that neighbour is
        check_header's question."""
        raw = f.mapping(data, _HEADER)
        if set(raw) - {"scale_exp"} != set(cls.__dataclass_fields__) - {"scale_exp"}:
            raise f.malformed(_HEADER, "fields are wrong")
        shape = raw["shape"]
        if not isinstance(shape, list) or len(shape) > MAX_DIMS:
            raise f.malformed(_HEADER, f"shape must be a list of <= {MAX_DIMS} sizes")
        return cls(
            kind=f.choice(raw["kind"], _HEADER, "kind", (ACTIVATION, GRADIENT)),
            run_id=f.text(raw["run_id"], _HEADER, "run_id", MAX_RUN_ID_CHARS),
            term=f.integer(raw["term"], _HEADER, "term"),
            epoch=f.integer(raw["epoch"], _HEADER, "epoch"),
            step=f.integer(raw["step"], _HEADER, "step"),
            micro=f.integer(raw["micro"], _HEADER, "micro"),
            sender=f.peer_id(raw["sender"], _HEADER, "sender"),
            dtype=f.choice(raw["dtype"], _HEADER, "dtype", WIRE_DTYPES),
            shape=tuple(f.integer(d, _HEADER, "a dimension") for d in shape),
            num_bytes=f.integer(raw["num_bytes"], _HEADER, "num_bytes"),
            scale_exp=f.integer(
                raw.get("scale_exp", 0), _HEADER, "scale_exp", -MAX_SCALE_EXP, MAX_SCALE_EXP
            ),
        )


class PeerLost(RuntimeError):
    """A neighbour did not answer in time, or refused our frame."""


class Stopped(RuntimeError):
    """The worker was asked to stop (or re-planned) while waiting for a frame."""


class NotReady(Exception):
    """The receiver cannot judge this frame yet (no plan yet, or it is further ahead)."""


class AlreadyHave(Exception):
    """A retried copy of a frame the receiver already used (its first answer got lost)."""


@dataclass(frozen=True)
class Expected:
    """What a worker accepts from one neighbour for one (kind, step, micro)."""

    kind: str
    run_id: str
    term: int
    epoch: int
    sender: str
    dtype: str
    shape: tuple[int, ...]
    max_abs: float = MAX_ABS_VALUE  # the largest |value| accepted (gradients: x loss_scale)


def max_abs_of(kind: str, loss_scale: float) -> float:
    """The bound on a frame's values: a gradient carries the loss_scale the stages divide out
    later, so it is held to the same bound once unscaled."""
    return MAX_ABS_VALUE * loss_scale if kind == GRADIENT else MAX_ABS_VALUE


def header_for(
    tensor: torch.Tensor,
    kind: str,
    run_id: str,
    plan: tuple[int, int],
    step: int,
    micro: int,
    sender: str,
    wire: str | None = None,
) -> FrameHeader:
    """The header of `tensor` sent under plan (term, epoch) as wire type `wire` (by default
    the tensor's own dtype); float16 with the tensor's scale_exp."""
    dtype = wire or str(tensor.dtype).removeprefix("torch.")
    shape = tuple(tensor.shape)
    term, epoch = plan
    num_bytes = payload_bytes(dtype, shape)
    exp = scale_exp_of(tensor, dtype)
    return FrameHeader(kind, run_id, term, epoch, step, micro, sender, dtype, shape, num_bytes, exp)


def scale_exp_of(tensor: torch.Tensor, wire: str) -> int:
    """The frame's scale_exp: for float16, the power of two that brings the tensor's largest
    magnitude into [2^14, 2^15) (within +-MAX_SCALE_EXP), so neither a loss-scaled gradient
    overflows nor a small one underflows; 0 for other wire types, and for a tensor of zeros,
    none or non-finite values (the receiver refuses the latter as before)."""
    if wire != "float16" or not tensor.numel():
        return 0
    peak = float(tensor.detach().abs().amax())  # one sync where the tensor is on a GPU
    if not math.isfinite(peak) or peak == 0.0:
        return 0
    _, exponent = math.frexp(peak)  # peak = m x 2^exponent, m in [0.5, 1)
    return max(-MAX_SCALE_EXP, min(MAX_SCALE_EXP, exponent - _FP16_TOP_EXP))


def payload_bytes(wire: str, shape: tuple[int, ...]) -> int:
    """Bytes of the payload of a tensor of `shape` as wire type `wire` (schedule/wire_bytes.py
    prices the same layout)."""
    numel = math.prod(shape)
    if wire == INT8_ROWS:
        row = shape[-1] if shape else 1
        return (numel // row if row else 0) * (_SCALE_BYTES + row)
    return numel * torch.empty((), dtype=FLOAT_DTYPES[wire]).element_size()


def encode_payload(tensor: torch.Tensor, wire: str, scale_exp: int | None = None) -> torch.Tensor:
    """The tensor as wire type `wire`, on the CPU and contiguous (int8_rows: flat uint8 bytes);
    quantised or cast where the tensor lives, so a GPU moves the smaller payload. scale_exp:
    the header's (by default scale_exp_of the tensor)."""
    exp = scale_exp_of(tensor, wire) if scale_exp is None else scale_exp
    if wire == INT8_ROWS:
        encoded = activation_codecs.encode_int8_rows(tensor.detach().float())
    elif exp:  # in fp32, where times a power of two is exact
        encoded = (tensor.detach().float() * 2.0**-exp).to(FLOAT_DTYPES[wire])
    else:
        encoded = tensor.detach().to(FLOAT_DTYPES[wire])
    return encoded.to("cpu").contiguous()


def check_header(header: FrameHeader, remote_peer: str, expected: Expected | None) -> str | None:
    """Why this frame must be refused, or None if it is what we expect."""
    if header.sender != remote_peer:
        return f"sender {header.sender} is not the stream's peer {remote_peer}"
    if expected is None:
        return f"no {header.kind} expected from {remote_peer} for step {header.step}"
    for name in ("kind", "run_id", "term", "epoch", "sender", "dtype", "shape"):
        if getattr(header, name) != getattr(expected, name):
            return f"{name} {getattr(header, name)!r} != expected {getattr(expected, name)!r}"
    if header.dtype not in WIRE_DTYPES:
        return f"dtype {header.dtype} not allowed"
    if header.scale_exp and header.dtype != "float16":
        return f"scale_exp {header.scale_exp} on a {header.dtype} frame (float16 only)"
    if (
        header.num_bytes != payload_bytes(header.dtype, header.shape)
        or header.num_bytes > MAX_PAYLOAD_BYTES
    ):
        return f"num_bytes {header.num_bytes} does not match dtype and shape"
    return None


def tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """The tensor's raw bytes without a copy (it must be contiguous)."""
    flat = tensor.detach().contiguous().view(-1)
    return memoryview(flat.view(torch.uint8).numpy())  # type: ignore[arg-type]


def decode_tensor(
    header: FrameHeader, payload: bytes | bytearray, max_abs: float = MAX_ABS_VALUE
) -> torch.Tensor:
    """The payload as a tensor of the header's shape (its float dtype, or float32 decoded from
    int8_rows, or from float16 times 2^scale_exp); WireError for any bytes that do not fit the
    header, or values that hold NaN/inf or a magnitude over max_abs (Expected.max_abs). Total:
    no other exception, whatever the header and bytes (check_header has vetted the header in the
    transport; tests fuzz both)."""
    if len(payload) != header.num_bytes:
        raise f.malformed(
            _FRAME, f"payload has {len(payload)} bytes, header says {header.num_bytes}"
        )
    # torch refuses (RuntimeError) negative sizes and ones whose product overflows int64, even
    # beside a 0 dimension; no honest frame has more values than MAX_PAYLOAD_BYTES
    sizes = [d for d in header.shape if d != 0]
    if (
        header.dtype not in WIRE_DTYPES
        or any(d < 0 for d in sizes)
        or math.prod(sizes) > MAX_PAYLOAD_BYTES
    ):
        raise f.malformed(_FRAME, f"no tensor of dtype {header.dtype!r} and shape {header.shape}")
    if header.num_bytes != payload_bytes(header.dtype, header.shape):
        raise f.malformed(_FRAME, f"{header.num_bytes} bytes do not make a {header.shape} tensor")
    if (header.scale_exp and header.dtype != "float16") or abs(header.scale_exp) > MAX_SCALE_EXP:
        raise f.malformed(_FRAME, f"scale_exp {header.scale_exp} on a {header.dtype} frame")
    if header.dtype == INT8_ROWS:
        tensor = activation_codecs.decode_int8_rows(bytes(payload), header.shape)
    else:
        # frombuffer refuses (ValueError) an empty buffer: a tensor with a 0 dimension
        raw = (
            torch.frombuffer(bytearray(payload), dtype=torch.uint8)
            if payload
            else torch.zeros(0, dtype=torch.uint8)
        )
        tensor = raw.view(FLOAT_DTYPES[header.dtype]).view(header.shape)
        if header.dtype == "float16":  # fp32 holds every value exactly (MAX_SCALE_EXP)
            tensor = tensor.float() * 2.0**header.scale_exp
    if not torch.isfinite(tensor).all():
        raise f.malformed(_FRAME, "tensor holds NaN or inf")
    if tensor.numel() and float(tensor.abs().max()) > max_abs:
        raise f.malformed(_FRAME, f"tensor holds a value over {max_abs:g} in magnitude")
    return tensor
