"""compression = "int8" on the pipeline wire (worker/pipeline/frames.py): the int8_rows wire type, what
it decodes to, what a receiver refuses, and its bytes against the planner's figure
(schedule/wire_bytes.py), for every `compression` as the transport sends it."""

from __future__ import annotations

import pytest
import torch

from p2ptrain.errors import WireError
from p2ptrain.records.run import RunSpec
from p2ptrain.records.run_sections import COMPRESSIONS
from p2ptrain.schedule.wire_bytes import activation_row_bytes
from p2ptrain.train import activation_codecs
from p2ptrain.worker.pipeline import frames
from p2ptrain.worker.pipeline.frames import ACTIVATION, GRADIENT, INT8_ROWS, Expected, FrameHeader
from p2ptrain.worker.pipeline.stage_step import wire_type

PEER = "12D3KooWpeer"
SHAPE = (2, 4, 8)  # (B, T, C): 8 rows of 8 values


def _sent(tensor: torch.Tensor, wire: str, kind: str = ACTIVATION) -> tuple[FrameHeader, bytes]:
    """The header and payload bytes the transport writes for `tensor` (Transport.send)."""
    header = frames.header_for(tensor, kind, "run", (1, 0), 5, 1, PEER, wire)
    payload = bytes(frames.tensor_bytes(frames.encode_payload(tensor, header.dtype)))
    return header, payload


def test_int8_frame_round_trip() -> None:
    noise = torch.randn(SHAPE, generator=torch.Generator().manual_seed(0))
    x = noise * torch.logspace(-6, 2, 8)[:, None, None].view(2, 4, 1)
    header, payload = _sent(x, INT8_ROWS, GRADIENT)
    assert header.dtype == INT8_ROWS and header.shape == SHAPE
    assert header.num_bytes == len(payload) == 8 * (4 + 8)  # an fp32 scale and 8 bytes a row
    (length,) = frames.HEADER_LEN.unpack(header.encode()[:4])
    assert FrameHeader.decode(header.encode()[4 : 4 + length]) == header
    expected = Expected(GRADIENT, "run", 1, 0, PEER, INT8_ROWS, SHAPE)
    assert frames.check_header(header, PEER, expected) is None
    decoded = frames.decode_tensor(header, payload)
    assert decoded.dtype == torch.float32 and torch.equal(
        decoded, activation_codecs.int8_rows_roundtrip(x)
    )
    # within half a quantisation step of each row, tiny rows (gradients) included
    step = x.abs().amax(dim=-1, keepdim=True) / 127
    assert bool(((decoded - x).abs() <= step / 2 * (1 + 1e-5) + 1e-12).all())  # fp32 rounding


def test_an_int8_frame_of_the_wrong_size_or_type_is_refused() -> None:
    header, _ = _sent(torch.randn(SHAPE), INT8_ROWS)
    expected = Expected(ACTIVATION, "run", 1, 0, PEER, INT8_ROWS, SHAPE)
    fp16 = FrameHeader(**{**header.__dict__, "dtype": "float16", "num_bytes": 2 * 64})
    assert "dtype" in (frames.check_header(fp16, PEER, expected) or "")
    short = FrameHeader(**{**header.__dict__, "num_bytes": 64})  # int8 values without scales
    assert "num_bytes" in (frames.check_header(short, PEER, expected) or "")


def _hostile(scale: float) -> bytes:
    """A valid int8_rows payload of SHAPE whose first row's scale is `scale`."""
    _, payload = _sent(torch.ones(SHAPE), INT8_ROWS)
    scales = torch.frombuffer(bytearray(payload[:32]), dtype=torch.float32).clone()
    scales[0] = scale
    return bytes(scales.view(torch.uint8).numpy()) + payload[32:]


@pytest.mark.parametrize(
    ("scale", "error"),
    [
        (float("nan"), "not finite"),  # the codec refuses a non-finite scale
        (float("inf"), "not finite"),
        (3e38, "not finite"),  # finite scale, 127 x it overflows fp32: the codec refuses it
        (1e3, "magnitude"),  # 127 x 1e3 > MAX_ABS_VALUE: checked after decoding
    ],
)
def test_hostile_int8_payloads_are_refused_after_decoding(scale: float, error: str) -> None:
    header, _ = _sent(torch.ones(SHAPE), INT8_ROWS)
    with pytest.raises(WireError, match=error):
        frames.decode_tensor(header, _hostile(scale))
    assert frames.decode_tensor(header, _hostile(50.0)).abs().max() == 127 * 50.0


def test_an_int8_payload_of_the_wrong_length_is_a_wire_error() -> None:
    header, payload = _sent(torch.ones(SHAPE), INT8_ROWS)
    with pytest.raises(WireError, match="bytes"):
        frames.decode_tensor(header, payload[:-1])
    lying = FrameHeader(**{**header.__dict__, "num_bytes": len(payload) - 1})
    with pytest.raises(WireError):  # the header's count agrees, the layout does not
        frames.decode_tensor(lying, payload[:-1])


@pytest.mark.parametrize("compression", COMPRESSIONS)
@pytest.mark.parametrize("shape", [(3, 5, 128), (1, 1, 1), (2, 7, 33)])
def test_frame_bytes_are_the_planners_figure(compression: str, shape: tuple[int, ...]) -> None:
    """What the transport writes for one micro-batch's activations (header aside) is exactly
    what the planner prices (schedule/wire_bytes.py) for every `compression`."""
    header, payload = _sent(
        torch.randn(shape), wire_type(RunSpec().replace(compression=compression))
    )
    rows = shape[0] * shape[1]
    assert header.num_bytes == len(payload) == rows * activation_row_bytes(compression, shape[2])
