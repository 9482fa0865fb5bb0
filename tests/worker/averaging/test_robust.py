"""The reducers' rule (worker/averaging/robust.py) and the reducer that applies it inside hivemind's
all-reduce (worker/averaging/robust_allreduce.py), fed parts directly: an honest round is the plain
weighted mean; a poisoned part is dropped or clipped, whatever its sender claims."""

from __future__ import annotations

import pytest
import torch

from p2ptrain.worker.averaging.robust import (
    MOMENTS_DRIFT_BOUND,
    PARAMS_DRIFT_BOUND,
    coordinate_median,
    robust_mean,
)

N = 4096


def _honest(num: int, seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    shared = torch.randn(N, generator=generator)
    return [shared + 0.5 * torch.randn(N, generator=generator) for _ in range(num)]


def _mean(parts: list[torch.Tensor], weights: list[float]) -> torch.Tensor:
    return sum(w * p for w, p in zip(weights, parts, strict=True)) / sum(weights)


@pytest.mark.parametrize("num", [1, 2, 3, 4, 8])
def test_an_honest_round_is_the_plain_weighted_mean(num: int) -> None:
    parts, weights = _honest(num), [float(3 + i % 2) for i in range(num)]
    combined = robust_mean(parts, weights, own=0)
    torch.testing.assert_close(combined.value, _mean(parts, weights), rtol=0, atol=1e-6)
    assert not combined.dropped and not combined.clipped


def test_a_non_finite_part_is_dropped() -> None:
    parts = _honest(3)
    parts[1] = parts[1].clone()
    parts[1][7] = float("nan")
    combined = robust_mean(parts, [1.0, 1.0, 1.0], own=0)
    assert list(combined.dropped) == [1]
    torch.testing.assert_close(combined.value, _mean([parts[0], parts[2]], [1.0, 1.0]))


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_only_non_finite_values_drop_a_part_never_huge_finite_ones(bad: float) -> None:
    """The finite check is a float64 sum: one NaN or infinity anywhere drops a part, while
    parts of values near float32's largest (whose float32 sum would overflow) are kept."""
    huge = torch.full((N,), 3.0e38)
    kept = robust_mean([huge, huge.clone(), huge.clone()], [1.0, 1.0, 1.0], own=0)
    assert not kept.dropped and bool(torch.isfinite(kept.value).all())
    parts = _honest(3)
    parts[2] = parts[2].clone()
    parts[2][N - 1] = bad
    assert list(robust_mean(parts, [1.0, 1.0, 1.0], own=0).dropped) == [2]


def test_of_two_parts_one_far_larger_is_dropped() -> None:
    """Two senders: no median can say who lies, but a part a million times longer is out."""
    honest, other = _honest(2)
    combined = robust_mean([honest, 1e6 * other], [1.0, 1.0], own=0)
    assert list(combined.dropped) == [1]
    torch.testing.assert_close(combined.value, honest)


@pytest.mark.parametrize("num", [3, 4, 8])
def test_a_huge_part_among_three_or_more_is_clipped(num: int) -> None:
    parts = _honest(num)
    honest_mean = _mean(parts[1:], [1.0] * (num - 1))
    parts[0] = 1e6 * parts[0]
    combined = robust_mean(parts, [1.0] * num, own=1)
    assert combined.clipped == (0,)
    assert float((combined.value - honest_mean).norm()) < float(honest_mean.norm())


def test_orthogonal_garbage_with_honest_checksums_is_clipped() -> None:
    """The attack the checksums cannot see: the liar's part keeps the honest sum and the
    projection on the (predictable) ±1 signs, plus huge garbage orthogonal to both."""
    parts = _honest(3)
    signs = torch.randint(0, 2, (N,), generator=torch.Generator().manual_seed(9)).double() * 2 - 1
    basis, _ = torch.linalg.qr(torch.stack([torch.ones(N, dtype=torch.float64), signs], dim=1))
    garbage = torch.randn(N, dtype=torch.float64, generator=torch.Generator().manual_seed(10))
    garbage -= basis @ (basis.T @ garbage)
    poisoned = parts[2] + (1000 * float(parts[2].norm()) * garbage / garbage.norm()).float()
    assert abs(float(poisoned.sum() - parts[2].sum())) < 1e-2 * float(parts[2].norm())
    combined = robust_mean([parts[0], parts[1], poisoned], [1.0, 1.0, 1.0], own=0)
    assert combined.clipped == (2,)
    honest_mean = _mean(parts, [1.0, 1.0, 1.0])
    # the garbage moved the mean by 333× the gradient norm; the clip leaves about 1× (0.95-1.01
    # over garbage draws: the bound was once 1×, and an unseeded draw failed it under xdist)
    assert float((combined.value - honest_mean).norm()) < 1.5 * float(honest_mean.norm())


def test_a_claimed_weight_is_never_used() -> None:
    """The weights passed are the plan's; the reducer below ignores what senders send."""
    parts = _honest(2)
    combined = robust_mean(parts, [2.0, 1.0], own=0)
    torch.testing.assert_close(combined.value, (2 * parts[0] + parts[1]) / 3, rtol=0, atol=1e-6)


def test_a_state_round_refuses_a_part_far_from_ours() -> None:
    """A false parameter digest forces a re-sync round: the crafted parameters it sends there
    are far from ours and refused; a replica that drifted by a few updates is averaged in."""
    ours = torch.randn(N)
    drifted = ours + 1e-2 * ours.norm() / N**0.5 * torch.randn(N)
    crafted = torch.randn(N)  # well-shaped, finite, and not ours
    combined = robust_mean(
        [ours, drifted, crafted], [1.0] * 3, own=0, drift_bound=PARAMS_DRIFT_BOUND
    )
    assert list(combined.dropped) == [2]
    torch.testing.assert_close(combined.value, (ours + drifted) / 2)
    moments = robust_mean([ours, 1.5 * ours], [1.0, 1.0], own=0, drift_bound=MOMENTS_DRIFT_BOUND)
    assert not moments.dropped


def test_mostly_zero_copies_of_token_rows_do_not_clip_the_one_that_is_not() -> None:
    """Embedding rows of tokens only one replica saw: zero in the others' copies. In the token
    rows the floor (from the members' median claimed norm) keeps the honest copy from being an
    outlier; the same copies outside them are one sender against two that agree exactly."""
    seen = torch.randn(N)
    parts = [seen, torch.zeros(N), torch.zeros(N)]
    combined = robust_mean(parts, [1.0] * 3, own=0, floor=float(seen.norm()), token_rows=[(0, N)])
    assert not combined.clipped
    torch.testing.assert_close(combined.value, seen / 3)
    assert robust_mean(parts, [1.0] * 3, own=0, floor=float(seen.norm())).clipped == (0,)


@pytest.mark.parametrize("rows", [1, 2, 3, 7, 8, 9, 16, 17])
def test_the_coordinate_median_is_what_sorting_each_column_gives(rows: int) -> None:
    """Small groups take the median by a min/max network (far less CPU than torch.sort along
    the rows); its result is the sorted median exactly, ties and all."""
    generator = torch.Generator().manual_seed(rows)
    stacked = torch.randn(rows, 1001, generator=generator, dtype=torch.float64)
    stacked[:, :10] = torch.randint(0, 3, (rows, 10), generator=generator).double()  # ties
    ordered = stacked.sort(dim=0).values
    expected = (ordered[(rows - 1) // 2] + ordered[rows // 2]) / 2
    assert torch.equal(coordinate_median(stacked), expected)
