"""The memory estimate (schedule/memory.py) against what torch allocates.

Weights, gradients and AdamW's state are measured on the meta device: a real forward, backward
and optimizer step of the stage, with every tensor's shape and dtype as on a real device, but no
memory. Activations are measured on the CPU, as the bytes of the tensors autograd saves for
backward (a saved-tensors hook; the meta device would pick another attention kernel).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import pytest
import torch

from p2ptrain.records.run import RunSpec
from p2ptrain.schedule.memory import (
    StageMemory,
    block_activation_bytes,
    embedding_activation_bytes,
    head_activation_bytes,
    stage_activation_bytes,
    stage_memory,
    stage_parameters,
)
from p2ptrain.train.model import Stage, build_layers, loss_fn, make_block, make_embedding, make_head
from p2ptrain.train.optim import make_optimizer


def saved_bytes(module: torch.nn.Module, run: Callable[[], object]) -> int:
    """Bytes of the tensors autograd saves for backward while `run` runs, the module's own
    weights left out, each storage counted once."""
    weights = {p.untyped_storage().data_ptr() for p in module.parameters()}
    seen: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in weights:
            seen[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        run()
    return sum(seen.values())


def stage_input(spec: RunSpec, layers: range, rows: int) -> torch.Tensor:
    shape = (rows, spec.model.block_size)
    if layers.start == 0:
        return torch.randint(0, spec.model.vocab_size, shape)
    return torch.randn((*shape, spec.model.n_embd), requires_grad=True)


def forward_and_loss(stage: Stage, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    out = stage(x)
    return loss_fn(out, targets) if stage.is_last else out


def measured_training_state(spec: RunSpec, layers: range) -> StageMemory:
    """Weights, gradients and AdamW state of a real step of the stage, on the meta device."""
    with torch.device("meta"):
        stage = Stage(spec.model_config(), layers, spec.optim.seed)
        x = stage_input(spec, layers, rows=1)
    optimizer = make_optimizer(stage, spec)
    out = stage(x)
    if stage.is_last:
        loss_fn(out, torch.zeros(out.shape[:2], dtype=torch.long, device="meta")).backward()
    else:
        out.backward(torch.ones_like(out))
    optimizer.step()
    params = list(stage.parameters())
    moments = [t for s in optimizer.state.values() for t in s.values()]
    return StageMemory(
        weight_bytes=sum(p.nbytes for p in params),
        gradient_bytes=sum(p.grad.nbytes for p in params if p.grad is not None),
        optimizer_bytes=sum(t.nbytes for t in moments),
        activation_bytes=0,
    )


def cuts(spec: RunSpec) -> list[range]:
    """The whole model, a first, a last and (with 3 layers or more) a middle stage."""
    n = spec.model.n_layer
    if spec.model.tie_word_embeddings:  # one stage only
        return [range(0, n)]
    return [range(0, n), range(0, 1), range(1, n)] + ([range(1, n - 1)] if n > 2 else [])


SPECS = [
    RunSpec().replace(n_layer=3, n_head=2, n_embd=16, block_size=8, stages=1),
    RunSpec().replace(model="llama", preset="tiny", block_size=16),
    RunSpec().replace(
        model="llama", n_layer=3, n_head=4, n_embd=32, num_key_value_heads=4, block_size=8
    ),
    RunSpec().replace(
        model="llama", preset="tiny", block_size=8, stages=1, tie_word_embeddings=True
    ),
]
SPEC_IDS = ["nanogpt", "llama-gqa", "llama-mha", "llama-tied"]


@pytest.mark.parametrize("spec", SPECS, ids=SPEC_IDS)
def test_a_stage_s_activations_are_what_autograd_saves(spec: RunSpec) -> None:
    rows = 3
    for layers in cuts(spec):
        stage = build_layers(spec, layers)
        x = stage_input(spec, layers, rows)
        targets = torch.randint(0, spec.model.vocab_size, (rows, spec.model.block_size))
        measured = saved_bytes(stage, partial(forward_and_loss, stage, x, targets))
        assert measured == stage_activation_bytes(spec.model_config(), layers, rows), layers


@pytest.mark.parametrize("spec", SPECS, ids=SPEC_IDS)
def test_a_stage_s_weights_gradients_and_adamw_state_are_counted_exactly(spec: RunSpec) -> None:
    config = spec.model_config()
    for layers in cuts(spec):
        measured = measured_training_state(spec, layers)
        estimate = stage_memory(config, layers, rows=1)
        assert (
            measured.weight_bytes == estimate.weight_bytes == 4 * stage_parameters(config, layers)
        )
        assert measured.gradient_bytes == estimate.gradient_bytes
        assert measured.optimizer_bytes == estimate.optimizer_bytes


@pytest.mark.parametrize("stage", [0, 1])
def test_a_1_3b_stage_s_estimate_is_within_10_percent_of_what_torch_allocates(stage: int) -> None:
    """Half of the 1.3b preset (12 blocks of 2048): its training state measured on the meta
    device (a real step), its activations on the CPU: one real 2048-wide block, the embedding
    and the head, each run once and counted per piece (every block saves the same)."""
    spec = RunSpec().replace(
        model="llama", preset="1.3b", block_size=128, batch_size=4, micro_batches=2
    )
    config, rows = spec.model_config(), 2
    layers = range(0, 12) if stage == 0 else range(12, 24)
    state = measured_training_state(spec, layers)
    torch.manual_seed(0)
    hidden = torch.randn(rows, spec.model.block_size, spec.model.n_embd, requires_grad=True)
    tokens = torch.randint(0, spec.model.vocab_size, (rows, spec.model.block_size))
    block = make_block(config)
    activations = len(layers) * saved_bytes(block, lambda: block(hidden))
    if stage == 0:
        embedding = make_embedding(config)
        activations += saved_bytes(embedding, lambda: embedding(tokens))
    else:
        head = make_head(config)
        activations += saved_bytes(head, lambda: loss_fn(head(hidden), tokens))
    measured = StageMemory(
        state.weight_bytes, state.gradient_bytes, state.optimizer_bytes, activations
    )
    estimate = stage_memory(config, layers, rows)
    for part in ("weight_bytes", "gradient_bytes", "optimizer_bytes", "activation_bytes"):
        assert getattr(estimate, part) == pytest.approx(getattr(measured, part), rel=0.10), part
    assert estimate.total_bytes == pytest.approx(measured.total_bytes, rel=0.10)
    assert 9e9 < estimate.total_bytes < 11e9  # ~615M parameters x 16 bytes, and activations


def test_activations_grow_with_rows_and_micro_batches_in_flight() -> None:
    config = RunSpec().replace(model="llama", preset="125m").model_config()
    one = block_activation_bytes(config, 1)
    assert block_activation_bytes(config, 4) == pytest.approx(4 * one, rel=0.01)
    layers = range(0, 6)
    assert stage_memory(config, layers, 2, micro_batches=3).activation_bytes == 3 * (
        6 * block_activation_bytes(config, 2) + embedding_activation_bytes(config, 2)
    )
    assert head_activation_bytes(config, 1) > config.vocab_size * config.block_size * 4


@pytest.mark.parametrize("spec", SPECS, ids=SPEC_IDS)
def test_diloco_s_outer_state_and_round_buffers_are_counted(spec: RunSpec) -> None:
    """Under sync = "diloco" a stage also holds, on its device, the anchor and the outer
    momentum (train/outer.py) and a round's parameters and pseudo-gradient (outer_rounds.py):
    four fp32 vectors of its parameters, which a plan that just fits must leave room for."""
    from p2ptrain.train.outer import OuterOptimizer

    config = spec.model_config()
    for layers in cuts(spec):
        outer = OuterOptimizer(build_layers(spec, layers), 1.0, 0.5)
        held = (outer.anchor.numel() + outer.momentum_buffer.numel()) * 4
        step = stage_memory(config, layers, rows=1)
        diloco = stage_memory(config, layers, rows=1, diloco=True)
        assert diloco.outer_bytes == 2 * held and step.outer_bytes == 0
        assert diloco.total_bytes - step.total_bytes == diloco.outer_bytes
