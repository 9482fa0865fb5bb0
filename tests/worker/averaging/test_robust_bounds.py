"""The centred clip's radius (worker/averaging/robust.py, docs/security.md row 29.9): the honest
parts' own spread, never the scale their claimed norms give. Realistic honest rounds (a shared
signal plus each replica's own noise, sent raw, as fp16 or as int8) pass unclipped as their
plain weighted mean; a member that sends its own gradient reversed and scaled while claiming
that part's true checksums and norm is clipped (the round then fails: a documented residual,
never a poisoned mean); the token rows of the embedding and head, whose honest copies are
outliers by nature, keep the claims' scale as their floor."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from p2ptrain.train import codecs
from p2ptrain.worker.averaging.robust import robust_mean

N = 8192
NOISES = [0.1, 0.3, 1.0, 3.0]  # each replica's own noise, relative to the shared signal


def _replicas(num: int, noise: float, seed: int = 0) -> tuple[torch.Tensor, list[torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    signal = torch.randn(N, generator=generator)
    return signal, [signal + noise * torch.randn(N, generator=generator) for _ in range(num)]


def _sent(part: torch.Tensor, codec: str) -> torch.Tensor:
    """What a reducer decodes of `part` (the outer rounds' codecs)."""
    if codec == "fp16":
        return codecs.decode_fp16(codecs.encode_fp16(part), part.shape)
    if codec == "int8":
        return codecs.decode_int8_blocks(codecs.encode_int8_blocks(part), part.shape)
    return part


def _floor(parts: list[torch.Tensor]) -> float:
    """The reducers' floor for a part that is the whole tensor: the claims' median."""
    return statistics.median([float(p.norm()) for p in parts])  # as the reducers take it


def _mean(parts: list[torch.Tensor], weights: list[float]) -> torch.Tensor:
    return sum(w * p for w, p in zip(weights, parts, strict=True)) / sum(weights)


@pytest.mark.parametrize("codec", ["none", "fp16", "int8"])
@pytest.mark.parametrize("noise", NOISES)
@pytest.mark.parametrize("num", [2, 3, 4, 8])
def test_honest_replicas_are_averaged_unclipped(num: int, noise: float, codec: str) -> None:
    _signal, raw = _replicas(num, noise, seed=num)
    parts = [_sent(p, codec) for p in raw]
    weights = [float(3 + i % 2) for i in range(num)]  # rows of the batch differ by a few
    combined = robust_mean(parts, weights, own=0, floor=_floor(parts))
    assert not combined.dropped and not combined.clipped
    torch.testing.assert_close(combined.value, _mean(parts, weights), rtol=0, atol=1e-5)


@pytest.mark.parametrize("noise", [0.1, 0.3])
@pytest.mark.parametrize("num", [3, 4, 8])
def test_a_reversed_gradient_with_its_true_claims_is_clipped(num: int, noise: float) -> None:
    """The liar sends -2.4x its own gradient and claims that part's true checksums and norm
    (2.4x an honest one: within check_round's 4x). With tau floored at the claims' scale it
    passed, and a 3-member round's mean pointed against the true gradient (cos -0.42 at noise
    0.3); now it is clipped, so the round fails and everyone keeps their own gradient."""
    signal, parts = _replicas(num, noise)
    parts[-1] = -2.4 * parts[-1]
    floor = _floor(parts)  # the liar's claim is the largest: the low median is an honest one
    poisoned = _mean(parts, [1.0] * num)
    if num == 3:  # what the old floor let through: a mean against the true gradient
        assert float(torch.nn.functional.cosine_similarity(poisoned, signal, dim=0)) < 0
    combined = robust_mean(parts, [1.0] * num, own=0, floor=floor)
    assert combined.clipped == (num - 1,)
    assert float(torch.nn.functional.cosine_similarity(combined.value, signal, dim=0)) > 0.5


# a stage in miniature: an embedding's token rows, then a dense block, in hivemind-sized parts
VOCAB, WIDTH, DENSE, PART = 4096, 32, 65_536, 16_384


def _stage(num: int, seed: int) -> list[torch.Tensor]:
    """Each replica's flat gradient: rows only for the tokens of its 512 (Zipf-drawn, one
    document repeating 4 tokens 32 times each), each a sum over the token's occurrences; the
    block's values a shared signal plus noise."""
    generator = torch.Generator().manual_seed(seed)
    frequency = 1 / torch.arange(1, VOCAB + 1, dtype=torch.float64) ** 1.1
    token_ids = torch.randperm(VOCAB, generator=generator)
    direction = torch.randn(VOCAB, WIDTH, generator=generator)  # each token's shared pull
    shared = torch.randn(DENSE, generator=generator)
    flats = []
    for _ in range(num):
        tokens = token_ids[torch.multinomial(frequency, 512, True, generator=generator)]
        tokens[:128] = tokens[128:132].repeat(32)
        rows = torch.zeros(VOCAB, WIDTH)
        for token in tokens.tolist():
            rows[token] += 0.05 * (direction[token] + torch.randn(WIDTH, generator=generator))
        dense = shared + 0.3 * torch.randn(DENSE, generator=generator)
        flats.append(torch.cat([rows.reshape(-1), dense]))
    return flats


def _combine_parts(
    flats: list[torch.Tensor], token_rows: list[tuple[int, int]]
) -> list[tuple[bool, torch.Tensor, torch.Tensor]]:
    """(clipped?, result, plain mean) of every part, as the reducers see them."""
    numel = flats[0].numel()
    per_value = _floor(flats) / math.sqrt(numel)
    out = []
    for start in range(0, numel, PART):
        stop = min(numel, start + PART)
        parts = [f[start:stop] for f in flats]
        spans = [(max(a, start) - start, min(b, stop) - start) for a, b in token_rows]
        spans = [(a, b) for a, b in spans if b > a]
        floor = per_value * math.sqrt(stop - start)
        combined = robust_mean(parts, [1.0] * len(flats), 0, None, floor, spans)
        out.append((bool(combined.clipped), combined.value, _mean(parts, [1.0] * len(flats))))
    return out


@pytest.mark.parametrize("num", [3, 4, 8])
def test_honest_token_rows_pass_where_the_median_distance_alone_would_clip_them(num: int) -> None:
    """Why the token rows keep the claims' scale: a batch that repeats a rare token has a row
    far larger than any other replica's, and rows of tokens most batches lack are zero in most
    copies; measured alone by the median distance, honest parts are clipped (so were a
    GPT-2-vocabulary nanoGPT's embedding and head parts, bursty Zipf batches, in 3 of 3
    rounds)."""
    flats = _stage(num, seed=0)
    token_rows = [(0, VOCAB * WIDTH)]
    for clipped, value, mean in _combine_parts(flats, token_rows):
        assert not clipped
        torch.testing.assert_close(value, mean, rtol=0, atol=1e-6)
    assert any(clipped for clipped, _value, _mean in _combine_parts(flats, []))


@pytest.mark.parametrize("num", [3, 4, 8])
def test_a_reversed_gradient_is_clipped_in_a_part_that_holds_token_rows(num: int) -> None:
    """A part across the embedding's last rows and the block's first values: the liar's
    reversed copy is caught by the block's coordinates, whatever room the rows leave it."""
    flats = _stage(num, seed=1)
    start = VOCAB * WIDTH - PART // 2
    parts = [f[start : start + PART] for f in flats]
    parts[-1] = -2.4 * parts[-1]
    floor = _floor(flats) * math.sqrt(PART / flats[0].numel())
    combined = robust_mean(parts, [1.0] * num, 0, None, floor, [(0, PART // 2)])
    assert combined.clipped == (num - 1,)
