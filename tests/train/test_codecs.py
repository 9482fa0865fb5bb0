"""Wire codecs (train/codecs.py, train/activation_codecs.py): round trips within their error
bounds, top-k's error feedback, and decoders that are total on hostile bytes (a small fuzz)."""

from __future__ import annotations

import random
import struct

import pytest
import torch

from p2ptrain.errors import WireError
from p2ptrain.train import activation_codecs, codecs


def _values(numel: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(numel, generator=generator) * 1e-3


def test_fp16_round_trip() -> None:
    x = _values(1000)
    payload = codecs.encode_fp16(x)
    assert payload.numel() == 2000
    assert torch.allclose(
        codecs.decode_fp16(bytes(payload.numpy()), (1000,)), x, rtol=1e-3, atol=1e-7
    )


def test_int8_blocks_within_half_a_step_per_block() -> None:
    x = _values(1000) * torch.linspace(0.1, 10, 1000)  # blocks of different scales
    payload = codecs.encode_int8_blocks(x)
    assert payload.numel() == 4 * (4 + 256)  # 1000 values: 4 blocks, the last padded
    y = codecs.decode_int8_blocks(payload, (10, 100))
    for start in range(0, 1000, 256):
        block = x[start : start + 256]
        error = (y.reshape(-1)[start : start + 256] - block).abs().max()
        assert error <= block.abs().max() / 127 / 2 * 1.001


def test_int8_rows_round_trip_and_roundtrip_helper() -> None:
    x = torch.randn(3, 5, 16) * torch.logspace(-8, 2, 16)  # tiny rows keep their own scale
    payload = activation_codecs.encode_int8_rows(x)
    assert payload.numel() == 15 * (4 + 16)
    y = activation_codecs.decode_int8_rows(payload, x.shape)
    assert torch.equal(y, activation_codecs.int8_rows_roundtrip(x))
    bound = x.abs().amax(dim=-1, keepdim=True) / 127 / 2 * 1.001
    assert bool(((y - x).abs() <= bound).all())


def test_int8_boundary_quantizes_forward_and_backward() -> None:
    x = torch.randn(4, 8, requires_grad=True)
    grad = torch.randn(4, 8) * 1e-9  # below fp16's subnormals: an fp32 scale keeps it
    out = activation_codecs.Int8RowsBoundary.apply(x)
    out.backward(grad)
    assert torch.equal(out, activation_codecs.int8_rows_roundtrip(x.detach()))
    assert x.grad is not None and torch.equal(x.grad, activation_codecs.int8_rows_roundtrip(grad))
    assert bool((x.grad != 0).any())


def test_topk_sends_the_largest_at_two_levels() -> None:
    x = _values(10_000)
    payload, sent = codecs.encode_topk(x, 0.03)
    assert payload.numel() == codecs.topk_payload_bytes(10_000, 0.03)
    assert torch.equal(codecs.decode_topk(payload, 10_000, 0.03), sent)
    nonzero = sent != 0
    # per chunk: ceil(3% of 4096) = 123, 123, and ceil(3% of 1808) = 55
    assert int(nonzero.sum()) == 123 + 123 + 55
    assert bool((torch.sign(sent[nonzero]) == torch.sign(x[nonzero])).all())
    first = x[:4096].abs()
    assert bool(first[nonzero[:4096]].min() >= first[~nonzero[:4096]].max())
    assert len(set(sent[:4096][nonzero[:4096]].abs().tolist())) <= 2  # two levels per chunk
    assert codecs.topk_bytes_per_value(1_000_000, 0.03) < 0.06


def test_error_feedback_keeps_what_topk_dropped() -> None:
    compressor = codecs.TopKCompressor(5000, 0.03)
    first = _values(5000, seed=1)
    _, sent = compressor.encode(first)
    assert torch.allclose(compressor.residual + sent, first)
    second = _values(5000, seed=2)
    _, sent_again = compressor.encode(second)
    # everything ever offered is either sent or still in the residual
    assert torch.allclose(sent + sent_again + compressor.residual, first + second, atol=1e-9)
    # one entry a round, one coordinate pushed 10x harder: the others' small pushes accumulate
    # until they are sent too, and nothing is lost
    compressor = codecs.TopKCompressor(100, 0.01)
    push = torch.full((100,), 1e-3)
    push[0] = 0.01
    total = torch.zeros(100)
    for _ in range(200):
        total += compressor.encode(push)[1]
    assert int((total[1:] != 0).sum()) > 90
    assert torch.allclose(total + compressor.residual, 200 * push, atol=1e-6)


def test_topk_state_round_trip() -> None:
    compressor = codecs.TopKCompressor(300, 0.1)
    compressor.encode(_values(300))
    other = codecs.TopKCompressor(300, 0.1)
    other.load_state_tensors(compressor.state_tensors())
    assert torch.equal(other.residual, compressor.residual)
    with pytest.raises(WireError):
        other.load_state_tensors({"outer/residual": torch.zeros(299)})


def _decoders() -> list[tuple[str, object, int]]:
    shape = (3, 50)
    x = _values(150, seed=3).reshape(shape)
    return [
        ("fp16", codecs.encode_fp16(x), 0),
        ("int8", codecs.encode_int8_blocks(x), 0),
        ("rows", activation_codecs.encode_int8_rows(x), 0),
        ("topk", codecs.encode_topk(x, 0.1)[0], 0),
    ]


def _decode(kind: str, payload: bytes) -> torch.Tensor:
    if kind == "fp16":
        return codecs.decode_fp16(payload, (3, 50))
    if kind == "int8":
        return codecs.decode_int8_blocks(payload, (3, 50))
    if kind == "rows":
        return activation_codecs.decode_int8_rows(payload, (3, 50))
    return codecs.decode_topk(payload, 150, 0.1)


@pytest.mark.parametrize("kind", ["fp16", "int8", "rows", "topk"])
def test_decoders_are_total(kind: str) -> None:
    payload = bytes(dict((k, p) for k, p, _ in _decoders())[kind].numpy())  # type: ignore[attr-defined]
    rng = random.Random(kind)
    candidates = [b"", payload[:-1], payload + b"\x00", bytes(len(payload)), b"\xff" * len(payload)]
    for _ in range(300):
        mutated = bytearray(payload)
        for _ in range(rng.randint(1, 4)):
            mutated[rng.randrange(len(mutated))] = rng.randrange(256)
        candidates.append(bytes(mutated))
    candidates += [bytes(rng.randrange(256) for _ in range(rng.randint(0, 700))) for _ in range(50)]
    for candidate in candidates:
        try:
            decoded = _decode(kind, candidate)
        except WireError:
            continue
        expected = (150,) if kind == "topk" else (3, 50)
        assert decoded.shape == expected and decoded.dtype == torch.float32
        assert bool(torch.isfinite(decoded).all())


def test_topk_decoder_refuses_unordered_indices() -> None:
    payload, _ = codecs.encode_topk(_values(150), 0.1)  # one chunk, 15 entries
    raw = bytearray(payload.numpy().tobytes())
    indices = codecs._unpack12(
        torch.tensor(list(raw[8 : 8 + codecs._index_bytes(15)]), dtype=torch.uint8), 15
    )
    swapped = indices.clone()
    swapped[0], swapped[1] = indices[1], indices[0]
    raw[8 : 8 + codecs._index_bytes(15)] = codecs._pack12(swapped).numpy().tobytes()
    with pytest.raises(WireError):
        codecs.decode_topk(bytes(raw), 150, 0.1)
    with pytest.raises(WireError):
        codecs.decode_fp16(torch.zeros(4, dtype=torch.int32), (2,))


def test_a_finite_scale_whose_product_is_not_is_refused() -> None:
    """Each scale was checked, not scale x code: 3e38 x 127 decoded to inf, and an outer
    round's shard went on with it."""
    huge = struct.pack("<f", 3e38)
    with pytest.raises(WireError):
        codecs.decode_int8_blocks(huge + bytes([127]) * codecs.INT8_BLOCK, (codecs.INT8_BLOCK,))
    with pytest.raises(WireError):
        activation_codecs.decode_int8_rows(huge + bytes([127]) * 4, (1, 4))
