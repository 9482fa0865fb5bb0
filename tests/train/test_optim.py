"""The finite check that guards every optimizer step."""

import torch
from torch import nn

from p2ptrain.train.optim import grads_are_finite


def test_a_single_non_finite_gradient_value_is_caught() -> None:
    model = nn.Linear(4, 2)
    assert grads_are_finite(model)  # no gradients yet
    model(torch.randn(3, 4)).sum().backward()
    assert grads_are_finite(model)
    for bad in (float("nan"), float("inf"), float("-inf")):
        assert model.weight.grad is not None
        model.weight.grad[1, 2] = bad
        assert not grads_are_finite(model)
        model.weight.grad[1, 2] = 0.0
