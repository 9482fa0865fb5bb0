"""The single-process reference trainer: the loop every pipeline x data-parallel run must reproduce.

One visible loop in the order things happen: lr -> batch -> forward/backward by micro-batch ->
clip -> step. The worker runs the same pieces, spread over peers.
"""

from __future__ import annotations

import torch

from p2ptrain.records.run import RunSpec
from p2ptrain.train.data import get_batch, load_corpus
from p2ptrain.train.model import Stage, build_model, even_ranges, loss_fn
from p2ptrain.train.optim import clip_grads, lr_at, make_optimizer, set_lr


def micro_batch_rows(num_rows: int, micro_batches: int) -> list[range]:
    """Split `num_rows` rows into at most `micro_batches` near-equal contiguous micro-batches."""
    return even_ranges(num_rows, max(1, min(micro_batches, num_rows)))


def forward_backward(model: Stage, x: torch.Tensor, y: torch.Tensor, micro_batches: int) -> float:
    """Accumulate the gradient of the batch's mean loss in `model`; return that loss."""
    total = 0.0
    for rows in micro_batch_rows(x.shape[0], micro_batches):
        logits = model(x[rows.start : rows.stop])
        # weight each micro-batch by its share of rows: the sum is the mean over the batch
        loss = loss_fn(logits, y[rows.start : rows.stop]) * (len(rows) / x.shape[0])
        loss.backward()
        total += loss.item()
    return total


def train_reference(
    spec: RunSpec, steps: int | None = None, model: Stage | None = None
) -> list[float]:
    """Train the whole model in this process for `steps` (default spec.optim.steps); per-step losses."""
    torch.manual_seed(spec.optim.seed)
    model = model if model is not None else build_model(spec)
    optimizer = make_optimizer(model, spec)
    corpus = load_corpus(spec)
    losses = []
    for step in range(spec.optim.steps if steps is None else steps):
        set_lr(optimizer, lr_at(step, spec))
        x, y = get_batch(corpus, spec, step)
        losses.append(forward_backward(model, x, y, spec.optim.micro_batches))
        clip_grads(model, spec.optim.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return losses
