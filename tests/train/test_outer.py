"""DiLoCo's outer step (train/outer.py): the Nesterov math on a hand-computed case, identical
replicas after a round, and a state that round-trips and refuses what is not this stage's."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from p2ptrain.errors import WireError
from p2ptrain.train.outer import OuterOptimizer


class TwoParams(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.tensor([1.0, 2.0]))
        self.b = nn.Parameter(torch.tensor([[3.0]]))


def _two_params() -> TwoParams:
    return TwoParams()


def test_outer_step_by_hand() -> None:
    module = _two_params()
    outer = OuterOptimizer(module, lr=0.5, momentum=0.9)
    with torch.no_grad():  # the inner steps moved the parameters
        module.a.copy_(torch.tensor([0.0, 2.5]))
        module.b.fill_(2.0)
    delta = outer.pseudo_gradient()
    assert delta.tolist() == [1.0, -0.5, 1.0]  # anchor - now
    outer.step(delta)
    # m = delta; anchor -= 0.5 * (delta + 0.9 * m) = anchor - 0.95 * delta
    assert module.a.tolist() == pytest.approx([1.0 - 0.95, 2.0 + 0.475])
    assert module.b.item() == pytest.approx(3.0 - 0.95)
    # second round, nothing moved: delta 0, m = 0.9 m, step = 0.5 * 0.9 * 0.9 * m
    outer.step(outer.pseudo_gradient())
    assert module.a[0].item() == pytest.approx(0.05 - 0.5 * 0.81 * 1.0)
    assert outer.outer_steps == 2


def test_matches_torch_nesterov_sgd() -> None:
    torch.manual_seed(0)
    module = nn.Linear(3, 2)
    outer = OuterOptimizer(module, lr=0.7, momentum=0.9)
    anchor = [p.detach().clone().requires_grad_(True) for p in module.parameters()]
    sgd = torch.optim.SGD(anchor, lr=0.7, momentum=0.9, nesterov=True)
    for _ in range(3):
        with torch.no_grad():
            for param in module.parameters():
                param.add_(torch.randn_like(param) * 0.1)
        delta = outer.pseudo_gradient()
        offset = 0
        for p in anchor:
            p.grad = delta[offset : offset + p.numel()].view_as(p).clone()
            offset += p.numel()
        sgd.step()
        outer.step(delta)
    for mine, reference in zip(module.parameters(), anchor, strict=True):
        assert torch.allclose(mine, reference, atol=1e-6)


def test_replicas_agree_after_a_round() -> None:
    torch.manual_seed(1)
    base = nn.Linear(4, 4)
    replicas = [nn.Linear(4, 4) for _ in range(3)]
    outers = []
    for replica in replicas:
        replica.load_state_dict(base.state_dict())
        outers.append(OuterOptimizer(replica, 0.7, 0.9))
        with torch.no_grad():
            replica.weight.add_(torch.randn(4, 4))
    mean = torch.stack([o.pseudo_gradient() for o in outers]).mean(dim=0)
    for outer in outers:
        outer.step(mean)
    assert all(torch.equal(r.weight, replicas[0].weight) for r in replicas)


def test_state_round_trip_and_refusals() -> None:
    module = _two_params()
    outer = OuterOptimizer(module, 0.7, 0.9)
    with torch.no_grad():
        module.a.add_(1.0)
    outer.step(outer.pseudo_gradient())
    tensors, scalars = outer.state_tensors(), outer.state_scalars()
    assert set(tensors) == {
        "outer/anchor/a",
        "outer/anchor/b",
        "outer/momentum/a",
        "outer/momentum/b",
    }
    fresh_module = _two_params()
    fresh = OuterOptimizer(fresh_module, 0.7, 0.9)
    fresh.load_state_tensors(tensors, scalars)
    assert torch.equal(fresh.anchor, outer.anchor)
    assert torch.equal(fresh.momentum_buffer, outer.momentum_buffer)
    assert fresh.outer_steps == 1 and torch.equal(fresh_module.a, module.a)
    bad_cases = [
        ({**tensors, "outer/anchor/a": torch.zeros(3)}, scalars),
        ({**tensors, "outer/anchor/a": torch.tensor([float("nan"), 0.0])}, scalars),
        ({k: v for k, v in tensors.items() if k != "outer/momentum/b"}, scalars),
        ({**tensors, "outer/anchor/c": torch.zeros(1)}, scalars),
        (tensors, {"outer_steps": -1}),
        (tensors, {"outer_steps": True}),
        (tensors, {}),
    ]
    for bad_tensors, bad_scalars in bad_cases:
        with pytest.raises(WireError):
            fresh.load_state_tensors(bad_tensors, bad_scalars)
    assert fresh.outer_steps == 1  # nothing changed by a refused state


def test_flat_params_load_params_and_keep_params() -> None:
    """The public parameter API the worker's outer rounds use: flat_params()/load_params()
    in the anchor's order, and a state loaded with keep_params leaves the parameters alone
    (a replica between outer steps keeps its inner progress)."""
    module = _two_params()
    outer = OuterOptimizer(module, 0.7, 0.9)
    assert torch.equal(outer.flat_params(), torch.tensor([1.0, 2.0, 3.0]))
    outer.load_params(torch.tensor([4.0, 5.0, 6.0]))
    assert torch.equal(module.a, torch.tensor([4.0, 5.0])) and float(module.b.detach()) == 6.0
    with pytest.raises(ValueError, match="values"):
        outer.load_params(torch.zeros(2))
    donor = OuterOptimizer(_two_params(), 0.7, 0.9)
    donor.outer_steps = 3
    outer.load_state_tensors(donor.state_tensors(), donor.state_scalars(), keep_params=True)
    assert torch.equal(outer.anchor, torch.tensor([1.0, 2.0, 3.0])) and outer.outer_steps == 3
    assert torch.equal(outer.flat_params(), torch.tensor([4.0, 5.0, 6.0]))  # kept
    assert torch.equal(outer.pseudo_gradient(), torch.tensor([-3.0, -3.0, -3.0]))
    outer.load_state_tensors(donor.state_tensors(), donor.state_scalars())
    assert torch.equal(outer.flat_params(), outer.anchor)  # the default: params = anchor
