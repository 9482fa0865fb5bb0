import pytest
import torch

from p2ptrain.worker.pipeline import frames
from p2ptrain.worker.pipeline.frames import ACTIVATION, GRADIENT, Expected, FrameHeader

PEER, OTHER = "12D3KooWpeer", "12D3KooWother"


def _header(**changes: object) -> FrameHeader:
    tensor = torch.randn(2, 4, 8).half()
    base = frames.header_for(tensor, ACTIVATION, "run", (1, 0), 5, 1, PEER)
    return FrameHeader(**{**base.__dict__, **changes})  # type: ignore[arg-type]


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
    with pytest.raises(ValueError):
        FrameHeader.decode(body)


def test_payload_must_match_and_be_finite() -> None:
    header = _header()
    with pytest.raises(ValueError, match="bytes"):
        frames.decode_tensor(header, b"\x00" * 3)
    bad = torch.full((2, 4, 8), float("nan")).half()
    with pytest.raises(ValueError, match="NaN"):
        frames.decode_tensor(header, bytes(frames.tensor_bytes(bad)))


@pytest.mark.parametrize("value", [2e4, -6e4])
def test_a_huge_finite_value_is_refused(value: float) -> None:
    """Finite but absurd activations (fp16 holds up to 65504) used to go straight into the
    next stage's forward pass."""
    header = _header()
    huge = torch.zeros(2, 4, 8).half()
    huge[1, 2, 3] = value
    with pytest.raises(ValueError, match="magnitude"):
        frames.decode_tensor(header, bytes(frames.tensor_bytes(huge)))
    fine = torch.full((2, 4, 8), 1e3).half()
    assert frames.decode_tensor(header, bytes(frames.tensor_bytes(fine))).shape == (2, 4, 8)
