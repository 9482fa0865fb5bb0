"""A member's own spike clip (train/spike_clip.py): off at 0, no clip before WARMUP norms, a
spike clipped to factor x the median of its own recent norms (and recorded at that bound, so it
does not raise the next), ordinary gradients left alone."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch import nn

from p2ptrain.errors import UserError
from p2ptrain.records.run import RunSpec
from p2ptrain.train.spike_clip import WARMUP, WINDOW, SpikeClip


def model_with_grad_norm(norm: float) -> nn.Module:
    """Two parameters whose gradients together have norm `norm` (3-4-5 split)."""
    model = nn.Linear(1, 1)
    model.weight.grad = torch.full_like(model.weight, 0.6 * norm)
    model.bias.grad = torch.full_like(model.bias, 0.8 * norm)
    return model


def grad_norm(model: nn.Module) -> float:
    return math.sqrt(sum(float(p.grad.norm()) ** 2 for p in model.parameters()))


def test_off_leaves_every_gradient_alone() -> None:
    clip = SpikeClip(0.0)
    for norm in (1.0, 1.0, 1.0, 1.0, 1.0, 1000.0):
        model = model_with_grad_norm(norm)
        assert clip.clip(model) is None
        assert grad_norm(model) == pytest.approx(norm)
    assert clip.clipped == 0


def test_a_spike_is_clipped_to_the_factor_times_the_median_of_its_own_norms() -> None:
    clip = SpikeClip(2.0)
    for norm in [1.0, 2.0, 3.0, 4.0][:WARMUP]:  # the warm-up: known, never clipped
        assert clip.clip(model_with_grad_norm(norm)) is None
    ordinary = model_with_grad_norm(4.9)  # under 2 x the median (2.5)
    assert clip.clip(ordinary) is None and grad_norm(ordinary) == pytest.approx(4.9)
    spike = model_with_grad_norm(40.0)  # median of [1, 2, 3, 4, 4.9] is 3: bound 6
    scale = clip.clip(spike)
    assert scale == pytest.approx(6.0 / 40.0)
    assert grad_norm(spike) == pytest.approx(6.0)
    # the direction is kept: the split is still 3-4-5
    assert float(spike.weight.grad) == pytest.approx(0.6 * 6.0)
    assert clip.clipped == 1


def test_a_run_of_spikes_does_not_raise_its_own_bound_at_once() -> None:
    clip = SpikeClip(2.0)
    for _ in range(WARMUP):
        clip.clip(model_with_grad_norm(1.0))
    sent = []
    for _ in range(2 * WINDOW):
        model = model_with_grad_norm(100.0)
        clip.clip(model)
        sent.append(grad_norm(model))
    # each spike enters the history at its bound, not its size: the first is held to 2 x the
    # warm-up's 1.0, and the bound grows at most 2x a step, so a lasting change of scale
    # (gradients that stay 100x larger) is followed gradually, never at once
    assert sent[0] == pytest.approx(2.0)
    assert all(a <= b <= 2 * a * (1 + 1e-9) for a, b in itertools.pairwise(sent))
    assert sent[WINDOW // 2] < sent[-1] < 100.0


def test_a_non_finite_gradient_is_left_to_the_steps_finite_check() -> None:
    clip = SpikeClip(2.0)
    for _ in range(WARMUP):
        clip.clip(model_with_grad_norm(1.0))
    model = model_with_grad_norm(float("nan"))
    assert clip.clip(model) is None
    assert clip.clip(model_with_grad_norm(1.0)) is None  # the NaN set no bound


def test_zero_gradients_set_no_bound() -> None:
    clip = SpikeClip(2.0)
    for _ in range(WARMUP):
        clip.clip(model_with_grad_norm(0.0))
    model = model_with_grad_norm(1.0)
    assert clip.clip(model) is None and grad_norm(model) == pytest.approx(1.0)


@pytest.mark.parametrize("factor", [0.5, -1.0, 101.0, float("nan")])
def test_the_run_spec_takes_off_or_a_factor_from_1_to_100(factor: float) -> None:
    with pytest.raises(UserError, match="spike_clip"):
        RunSpec().replace(spike_clip=factor)
    assert RunSpec().optim.spike_clip == 0.0
    assert RunSpec().replace(spike_clip=2.0).optim.spike_clip == 2.0
