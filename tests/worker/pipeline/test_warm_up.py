"""The stage's warm-up before step 0 (worker/pipeline/stage_step.py warm_up): it runs every
stage's passes and changes nothing a step would see: the same parameters, no gradients left, the
same random state, so the first step trains exactly as without it."""

from __future__ import annotations

import pytest
import torch

from p2ptrain.records import Role
from p2ptrain.records.run import RunSpec
from p2ptrain.train.data import get_batch, load_corpus
from p2ptrain.train.model import build_layers, loss_fn
from p2ptrain.worker.pipeline.stage_step import replica_batch, warm_up

SPEC = RunSpec().replace(batch_size=4, micro_batches=2)


def _role(stage: int, num_stages: int) -> Role:
    return Role(
        term=1,
        epoch=1,
        stage=stage,
        num_stages=num_stages,
        replica=0,
        num_replicas=1,
        prev_peer="a" if stage else None,
        next_peer="b" if stage < num_stages - 1 else None,
        stage_peers=("me",),
    )


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_warm_up_leaves_every_stage_as_it_found_it(stage: int) -> None:
    n_layer = SPEC.model.n_layer
    cuts = [range(0, 1), range(1, n_layer - 1), range(n_layer - 1, n_layer)]
    model = build_layers(SPEC, cuts[stage])
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    rng = torch.get_rng_state()
    warm_up(model, SPEC, _role(stage, 3))
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(p, before[name]) for name, p in model.named_parameters())
    assert torch.equal(torch.get_rng_state(), rng)


def test_the_first_step_after_a_warm_up_trains_exactly_as_without() -> None:
    spec = SPEC.replace(micro_batches=1)
    corpus = load_corpus(spec)
    x, y = get_batch(corpus, spec, 0, replica_batch(spec, _role(0, 1))[1])
    grads = []
    for warm in (False, True):
        model = build_layers(spec, range(0, spec.model.n_layer))
        if warm:
            warm_up(model, spec, _role(0, 1))
        loss_fn(model(x), y).backward()
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
    assert len(grads[0]) == len(grads[1]) > 0
    assert all(torch.equal(a, b) for a, b in zip(*grads, strict=True))
