import pytest
import torch

from p2ptrain.errors import WireError
from p2ptrain.records import Role
from p2ptrain.records.run import RunSpec
from p2ptrain.records.run_sections import (
    COMPRESSIONS,
    ModelSpec,
    OptimSpec,
    WireSpec,
    frame_problem,
)
from p2ptrain.worker.pipeline import frames
from p2ptrain.worker.pipeline.frames import ACTIVATION, GRADIENT, Expected, FrameHeader
from p2ptrain.worker.pipeline.stage_step import expected_frame

PEER, OTHER = "12D3KooWpeer", "12D3KooWother"


def _header(**changes: object) -> FrameHeader:
    tensor = torch.randn(2, 4, 8).half()
    base = frames.header_for(tensor, ACTIVATION, "run", (1, 0), 5, 1, PEER)
    # unscaled (scale_exp 0): the tests pair it with raw fp16 bytes of other tensors
    return FrameHeader(**{**base.__dict__, "scale_exp": 0, **changes})  # type: ignore[arg-type]


EXPECTED = Expected(ACTIVATION, "run", 1, 0, PEER, "float16", (2, 4, 8))


def test_header_round_trip_and_tensor_decode() -> None:
    tensor = torch.randn(2, 4, 8).to(torch.bfloat16)
    header = frames.header_for(tensor, GRADIENT, "run", (2, 3), 7, 0, PEER)
    encoded = header.encode()
    (length,) = frames.HEADER_LEN.unpack(encoded[:4])
    assert FrameHeader.decode(encoded[4 : 4 + length]) == header
    decoded = frames.decode_tensor(header, bytes(frames.tensor_bytes(tensor)))
    assert decoded.dtype == torch.bfloat16 and torch.equal(decoded, tensor)


def test_expected_frame_passes() -> None:
    assert frames.check_header(_header(), PEER, EXPECTED) is None


@pytest.mark.parametrize(
    ("changes", "remote", "reason"),
    [
        ({}, OTHER, "not the stream's peer"),  # claims to be someone else
        ({"sender": OTHER}, OTHER, "sender"),  # a peer that is not our neighbour
        ({"kind": GRADIENT}, PEER, "kind"),
        ({"run_id": "other"}, PEER, "run_id"),
        ({"epoch": 1}, PEER, "epoch"),  # a stale plan
        ({"term": 2}, PEER, "term"),  # the same epoch number under another planner's term
        ({"dtype": "float32", "num_bytes": 256}, PEER, "dtype"),
        ({"shape": (2, 4, 9), "num_bytes": 144}, PEER, "shape"),
        ({"num_bytes": 10}, PEER, "num_bytes"),
    ],
)
def test_unexpected_frames_are_refused(
    changes: dict[str, object], remote: str, reason: str
) -> None:
    problem = frames.check_header(_header(**changes), remote, EXPECTED)
    assert problem is not None and reason in problem


def test_nothing_expected_is_refused() -> None:
    assert "no act expected" in (frames.check_header(_header(), PEER, None) or "")


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[]",
        b'{"kind": "act"}',
        _header().encode()[4:].replace(b'"step":5', b'"step":-1'),
        _header().encode()[4:].replace(b'"term":1,', b""),  # a v1 header: no term
    ],
)
def test_malformed_headers_raise(body: bytes) -> None:
    with pytest.raises(WireError):
        FrameHeader.decode(body)


def test_payload_must_match_and_be_finite() -> None:
    header = _header()
    with pytest.raises(WireError, match="bytes"):
        frames.decode_tensor(header, b"\x00" * 3)
    bad = torch.full((2, 4, 8), float("nan")).half()
    with pytest.raises(WireError, match="NaN"):
        frames.decode_tensor(header, bytes(frames.tensor_bytes(bad)))


@pytest.mark.parametrize("value", [2e4, -6e4])
def test_a_huge_finite_value_is_refused(value: float) -> None:
    """Finite but absurd activations (fp16 holds up to 65504) used to go straight into the
    next stage's forward pass."""
    header = _header()
    huge = torch.zeros(2, 4, 8).half()
    huge[1, 2, 3] = value
    with pytest.raises(WireError, match="magnitude"):
        frames.decode_tensor(header, bytes(frames.tensor_bytes(huge)))
    fine = torch.full((2, 4, 8), 1e3).half()
    assert frames.decode_tensor(header, bytes(frames.tensor_bytes(fine))).shape == (2, 4, 8)


def test_gradients_are_bounded_with_the_run_s_loss_scale() -> None:
    """Gradient frames carry the loss times loss_scale (up to 2**24): honest boundary gradients
    of ~4e4 at 2**24 were refused by the activations' bound, and every step failed."""
    spec = RunSpec().replace(loss_scale=2.0**24, compression="none")
    role = Role(
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
    expected = expected_frame(spec, role, 5, GRADIENT, 5, 0)
    assert expected is not None and expected.max_abs == frames.MAX_ABS_VALUE * 2.0**24
    grad = torch.zeros(expected.shape)
    grad[0, 0, 0] = 4.1e4
    header = frames.header_for(grad, GRADIENT, spec.run_id, (1, 0), 5, 0, PEER, "float32")
    payload = bytes(frames.tensor_bytes(grad))
    assert frames.check_header(header, PEER, expected) is None
    assert frames.decode_tensor(header, payload, expected.max_abs).abs().max() == 4.1e4
    with pytest.raises(WireError, match="magnitude"):  # an activation keeps MAX_ABS_VALUE
        frames.decode_tensor(header, payload)
    plain = expected_frame(RunSpec(), role, 5, GRADIENT, 5, 0)
    assert plain is not None and plain.max_abs == frames.MAX_ABS_VALUE


@pytest.mark.parametrize(
    ("dtype", "shape", "num_bytes", "payload"),
    [
        ("float16", (0, 4), 0, b""),  # an empty tensor: torch.frombuffer refuses b""
        ("float32", (2, 3), 7, b"\x00" * 7),  # the header's count agrees, the layout does not
        ("float32", (-1, -4), 16, b"\x00" * 16),  # negative sizes whose product fits
        ("float16", (2**62, 2**62, 0), 0, b""),  # a product past int64 beside a 0
        ("int8_rows", (-2, 3), 14, b"\x00" * 14),
        ("float64", (2,), 16, b"\x00" * 16),  # not a wire type
    ],
)
def test_odd_headers_and_payloads_decode_or_raise_a_wire_error(
    dtype: str, shape: tuple[int, ...], num_bytes: int, payload: bytes
) -> None:
    header = _header(dtype=dtype, shape=shape, num_bytes=num_bytes)
    if shape == (0, 4):
        assert frames.decode_tensor(header, payload).shape == shape
    else:
        with pytest.raises(WireError, match="malformed frame"):
            frames.decode_tensor(header, payload)


@pytest.mark.parametrize("compression", COMPRESSIONS)
@pytest.mark.parametrize(("batch_size", "micro_batches"), [(16, 2), (31, 2), (32, 1), (9, 4)])
def test_the_run_spec_prices_the_largest_frame_as_the_wire_lays_it_out(
    compression: str, batch_size: int, micro_batches: int
) -> None:
    """records/run_sections.py: frame_problem refuses a run exactly when its largest frame's
    payload (frames.payload_bytes) is over MAX_PAYLOAD_BYTES."""
    model = ModelSpec(preset="7b", block_size=4096)
    optim = OptimSpec(batch_size=batch_size, micro_batches=micro_batches)
    rows = -(-batch_size // micro_batches)  # the largest micro-batch of a lone replica
    wire = frames.COMPRESSION_DTYPES[compression]
    size = frames.payload_bytes(wire, (rows, model.block_size, model.n_embd))
    problem = frame_problem(model, optim, WireSpec(compression=compression))
    assert (problem is None) == (size <= frames.MAX_PAYLOAD_BYTES)
    assert problem is None or f"would hold {size} bytes" in problem
