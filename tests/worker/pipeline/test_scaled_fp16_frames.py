"""Gradient frames carry the run's loss_scale (worker/pipeline/stage_step.py); on an fp16 wire
(compression = "fp16", the default) a float16 frame holds its values times 2^-scale_exp, a
power of two the sender picks per frame (worker/pipeline/frames.py).

Before: the scaled gradient was cast to fp16 as it was. At loss_scale 2^24 an ordinary boundary
gradient of 0.004 is 67,109 scaled, past fp16's 65,504: it became inf, the receiver refused the
frame ("tensor holds NaN or inf", answered REJECTED) and the sender's step failed with PeerLost.
bf16 (fp32's exponent range) and int8_rows (an fp32 scale a row) never had the problem."""

from __future__ import annotations

import pytest
import torch

from p2ptrain.errors import WireError
from p2ptrain.records import Role
from p2ptrain.records.run import RunSpec
from p2ptrain.worker.pipeline import frames
from p2ptrain.worker.pipeline.frames import ACTIVATION, GRADIENT, FrameHeader
from p2ptrain.worker.pipeline.stage_step import expected_frame, wire_type

PEER, OTHER = "12D3KooWpeer", "12D3KooWother"
SCALE = 2.0**24  # the largest loss_scale a run spec takes
FP16_EPS = 2.0**-11  # fp16's relative rounding error (11 significant bits)
ROLE = Role(  # stage 0 of 2: it receives gradient frames from PEER
    term=1,
    epoch=0,
    stage=0,
    num_stages=2,
    replica=0,
    num_replicas=1,
    stage_peers=(OTHER,),
    prev_peer=None,
    next_peer=PEER,
)


def _gradient(value: float, shape: tuple[int, ...]) -> torch.Tensor:
    """A deterministic gradient of `shape` whose largest magnitude is `value`."""
    noise = torch.rand(shape, generator=torch.Generator().manual_seed(0)) * 2 - 1
    noise.view(-1)[0] = 1.0
    return noise * value


def _sent(
    tensor: torch.Tensor, wire: str, kind: str = GRADIENT, header_bytes: bool = True
) -> tuple[FrameHeader, bytes]:
    """The header (through its wire bytes) and payload Transport.send writes for `tensor`."""
    header = frames.header_for(tensor, kind, "p2ptrain-default", (1, 0), 5, 0, PEER, wire)
    payload = frames.encode_payload(tensor, header.dtype, header.scale_exp)
    if header_bytes:
        header = FrameHeader.decode(header.encode()[frames.HEADER_LEN.size :])
    return header, bytes(frames.tensor_bytes(payload))


def _expected(compression: str, loss_scale: float = SCALE) -> frames.Expected:
    spec = RunSpec().replace(loss_scale=loss_scale, compression=compression)
    expected = expected_frame(spec, ROLE, 5, GRADIENT, 5, 0)
    assert expected is not None and expected.dtype == wire_type(spec)
    return expected


def test_a_loss_scaled_gradient_crosses_an_fp16_wire() -> None:
    expected = _expected("fp16")
    grad = _gradient(0.004 * SCALE, expected.shape)  # 67,109: past fp16's 65,504
    header, payload = _sent(grad, "float16")
    assert frames.check_header(header, PEER, expected) is None
    assert header.scale_exp == 2  # 67,109 = 0.51 x 2^17: sent as 67,109 / 4 in [2^14, 2^15)
    decoded = frames.decode_tensor(header, payload, expected.max_abs)
    assert decoded.dtype == torch.float32 and decoded.shape == grad.shape
    assert bool(((decoded - grad).abs() <= grad.abs() * FP16_EPS).all())
    # what a v2 sender wrote (the value cast as it was): inf, refused by the receiver
    unscaled = FrameHeader(**{**header.__dict__, "scale_exp": 0})
    raw = bytes(frames.tensor_bytes(grad.half()))
    with pytest.raises(WireError, match="NaN or inf"):
        frames.decode_tensor(unscaled, raw, expected.max_abs)


@pytest.mark.parametrize("compression", ["bf16", "int8", "none"])
def test_the_other_wire_types_carry_it_unscaled(compression: str) -> None:
    """bf16 has fp32's exponent range and int8_rows an fp32 scale a row: no scale_exp, and the
    frame is accepted within the type's own rounding."""
    expected = _expected(compression)
    grad = _gradient(0.004 * SCALE, expected.shape)
    header, payload = _sent(grad, expected.dtype)
    assert header.scale_exp == 0 and frames.check_header(header, PEER, expected) is None
    decoded = frames.decode_tensor(header, payload, expected.max_abs).float()
    row_max = grad.abs().amax(dim=-1, keepdim=True)
    bound = {"bf16": grad.abs() * 2.0**-8, "int8": row_max / 254, "none": 0 * grad}[compression]
    assert bool(((decoded - grad).abs() <= bound * (1 + 1e-5)).all())


@pytest.mark.parametrize("peak", [1e-7, 3.0, 5e3, 4e4, 1e4 * SCALE])
def test_fp16_frames_keep_fp16_precision_over_the_whole_range(peak: float) -> None:
    """From a tiny gradient (fp16 subnormals: 1e-7 kept ~1 bit) to the bound at 2^24, every
    value within fp16's relative rounding of its frame's largest one (values down to 2^-11 of
    it keep full precision)."""
    grad = _gradient(peak, (4, 16, 8))
    header, payload = _sent(grad, "float16")
    decoded = frames.decode_tensor(header, payload, frames.max_abs_of(GRADIENT, SCALE))
    assert 2.0**14 <= peak * 2.0**-header.scale_exp < 2.0**15
    assert bool(((decoded - grad).abs() <= grad.abs() * FP16_EPS + peak * 2.0**-24).all())


def test_values_fp16_held_decode_as_a_plain_cast_did() -> None:
    """A power of two is exact: within fp16's normal range the scaled frame decodes to the very
    values a plain fp16 cast (v2) gave, activations and gradients alike."""
    x = _gradient(9.5, (2, 4, 8))
    for kind in (ACTIVATION, GRADIENT):
        header, payload = _sent(x, "float16", kind)
        assert header.scale_exp == 4 - 15  # 9.5 = 0.59 x 2^4
        assert torch.equal(frames.decode_tensor(header, payload), x.half().float())


def test_the_bound_holds_on_the_decoded_values() -> None:
    """max_abs_of judges what the frame decodes to, scale_exp applied: a hostile sender cannot
    slip a gradient past MAX_ABS_VALUE x loss_scale, nor an activation past MAX_ABS_VALUE."""
    limit = frames.max_abs_of(GRADIENT, SCALE)
    header, payload = _sent(_gradient(2 * limit, (2, 4, 8)), "float16")
    with pytest.raises(WireError, match="magnitude"):
        frames.decode_tensor(header, payload, limit)
    header, payload = _sent(_gradient(3.0, (2, 4, 8)), "float16", ACTIVATION)
    assert frames.decode_tensor(header, payload).abs().max() == 3.0
    inflated = FrameHeader(**{**header.__dict__, "scale_exp": frames.MAX_SCALE_EXP})
    with pytest.raises(WireError, match="magnitude"):
        frames.decode_tensor(inflated, payload)


def test_an_all_zero_or_empty_frame_is_unscaled() -> None:
    assert frames.scale_exp_of(torch.zeros(2, 3), "float16") == 0
    assert frames.scale_exp_of(torch.zeros(0, 3), "float16") == 0
    assert frames.scale_exp_of(torch.full((2,), float("inf")), "float16") == 0
    assert frames.scale_exp_of(torch.full((2,), 1e30), "float16") == frames.MAX_SCALE_EXP
    assert frames.scale_exp_of(torch.full((2,), 1e-30), "float16") == -frames.MAX_SCALE_EXP
    assert frames.scale_exp_of(torch.full((2,), 1e30), "bfloat16") == 0


def test_the_header_names_scale_exp_only_when_it_scales() -> None:
    """An unscaled frame's header has no scale_exp (absent = 0: v2's header bytes); the field is
    an integer within +-MAX_SCALE_EXP, and only a float16 frame may have one."""
    plain, _ = _sent(torch.ones(2, 8), "bfloat16")
    assert plain.scale_exp == 0 and b"scale_exp" not in plain.encode()
    scaled, _ = _sent(torch.ones(2, 8), "float16")
    assert scaled.scale_exp == 1 - 15 and b'"scale_exp":-14' in scaled.encode()  # 1 = 0.5 x 2^1
    assert FrameHeader.from_dict(scaled.to_dict()) == scaled
    body = scaled.to_dict()
    for bad in (frames.MAX_SCALE_EXP + 1, -frames.MAX_SCALE_EXP - 1, True, 1.5, "3", None):
        with pytest.raises(WireError, match="scale_exp"):
            FrameHeader.from_dict({**body, "scale_exp": bad})
    with pytest.raises(WireError, match="fields are wrong"):
        FrameHeader.from_dict({**body, "scale": 2})
    expected = frames.Expected(GRADIENT, "p2ptrain-default", 1, 0, PEER, "bfloat16", (2, 8))
    header, payload = _sent(torch.ones(2, 8), "bfloat16")
    scaled_bf16 = FrameHeader(**{**header.__dict__, "scale_exp": 3})
    assert "float16 only" in (frames.check_header(scaled_bf16, PEER, expected) or "")
    with pytest.raises(WireError, match="scale_exp"):
        frames.decode_tensor(scaled_bf16, payload)


def test_the_stream_protocol_names_the_version() -> None:
    """A v2 peer reads a float16 payload as unscaled: it must not share the stream."""
    assert frames.PROTOCOL == "p2ptrain.pipe.v3"
