"""DiLoCo's outer step (train/outer.py): the Nesterov math on a hand-computed case, identical
replicas after a round, and a state that round-trips and refuses what is not this stage's."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from p2ptrain.errors import WireError
from p2ptrain.train.outer import OuterOptimizer, fragment_spans, fragments_due, round_phase


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


def test_fragment_steps_equal_the_whole_step_slice_by_slice() -> None:
    """Streaming DiLoCo's fragments: spans that cut through parameters, stepped one at a time,
    end where one whole-stage step ends; each step touches its own slice only."""
    torch.manual_seed(1)
    whole, parts = nn.Linear(5, 3), nn.Linear(5, 3)
    parts.load_state_dict(whole.state_dict())
    outer_whole, outer_parts = OuterOptimizer(whole, 0.7, 0.9), OuterOptimizer(parts, 0.7, 0.9)
    spans = fragment_spans(outer_whole.numel, 3)
    assert spans == [(0, 6), (6, 12), (12, 18)]  # 15 weights + 3 biases: the 3rd cuts both
    for _ in range(2):
        moved = [torch.randn_like(p) * 0.1 for p in whole.parameters()]
        with torch.no_grad():
            for module in (whole, parts):
                for param, move in zip(module.parameters(), moved, strict=True):
                    param.add_(move)
        outer_whole.step(outer_whole.pseudo_gradient())
        for span in spans:
            before = outer_parts.flat_params()
            outer_parts.step(outer_parts.pseudo_gradient(span=span), span)
            after = outer_parts.flat_params()
            outside = torch.ones_like(before, dtype=torch.bool)
            outside[span[0] : span[1]] = False
            assert torch.equal(before[outside], after[outside])
            assert torch.equal(after[span[0] : span[1]], outer_parts.flat_params(span=span))
    torch.testing.assert_close(outer_parts.flat_params(), outer_whole.flat_params())
    torch.testing.assert_close(outer_parts.momentum_buffer, outer_whole.momentum_buffer)
    assert outer_parts.outer_steps == outer_whole.outer_steps == 2  # the first fragment's count


def test_a_stages_fragments_are_staggered_over_h() -> None:
    # 2 stages x 2 fragments at H 8: the four slots 2 steps apart, a stage's own 4 apart; the
    # first round of each after the first period
    phases = [[round_phase(s, 2, f, 2, 8) for f in range(2)] for s in range(2)]
    assert phases == [[0, 4], [2, 6]]
    due = {step: fragments_due(step, 20, 8, 1, 2, 2) for step in range(20)}
    assert {step: f for step, f in due.items() if f} == {
        9: [0],
        13: [1],
        17: [0],
        19: [0, 1],
    }
    assert fragment_spans(3, 5) == [(0, 1), (1, 2), (2, 3)]  # never an empty fragment


def test_a_state_read_onto_the_cpu_lands_on_the_stages_device() -> None:
    """A saved or fetched state is read onto the CPU; a stage on a GPU must hold its anchor and
    momentum there, or its first outer round mixes devices (`meta` stands in for the GPU)."""
    saved = OuterOptimizer(nn.Linear(3, 2), 1.0, 0.5)
    on_gpu = OuterOptimizer(nn.Linear(3, 2, device="meta"), 1.0, 0.5)
    on_gpu.load_state_tensors(saved.state_tensors(), saved.state_scalars())
    assert on_gpu.anchor.device.type == on_gpu.momentum_buffer.device.type == "meta"
    assert on_gpu.pseudo_gradient().device.type == "meta"  # it raised: "the same device"
