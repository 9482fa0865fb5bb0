"""`p2ptrain bench convergence`: does low-communication training reach the loss of every-step
averaging at equal tokens? One process, no network, the run spec's default model on the embedded
corpus.

R replicas train on one global batch per step of R x `batch` sequences (train/data.py: replica r
takes its rows of step s's batch), so every variant sees exactly the same tokens:

    step              every-step averaging: the replicas' mean gradient is the gradient of one
                      model on the whole global batch, so it is computed as that
    diloco_hH         R models, each `H` AdamW steps on its own rows, then the outer Nesterov
                      step on the mean pseudo-gradient (train/outer.py), fp16 on the wire, with
                      the recommended outer lr and momentum (harness/scaleout_runs.py); the round
                      applied min(H/2, 15) steps later, as the product applies it
    diloco_hH_int8    the same with block-wise int8, and top-k with error feedback (train/codecs.py)
    diloco_hH_topk    at the first H, and at the recommended top-k H (5: top-k needs many rounds)
    diloco_hH_int8_fF int8 rounds in F staggered fragments (Streaming DiLoCo; F the recommended
                      outer_fragments): each slice of the model syncs at its own offset in H
    diloco_hH_paper   the same with DiLoCo's outer step (lr 0.7, Nesterov momentum 0.9)
    act_fp16          every-step, the model cut into two stages at its middle layer, the boundary
    act_int8          quantizing activations and their gradients (fp16, or int8 per row)

The final loss is the loss of the final model (after the last outer step) on a fixed held-out set:
the last 5% of the corpus, never trained on. The learning rate follows the run spec (linear
warmup, cosine decay to min_lr), the inner optimizer is the product's AdamW (train/optim.py).
The variants are convergence_variants.py's, the printed table convergence_bench_report.py's.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from p2ptrain.harness.convergence_variants import Variant, default_variants
from p2ptrain.harness.scaleout_runs import INNER_STEPS, OUTER_LR, OUTER_MOMENTUM
from p2ptrain.records.run import RunSpec
from p2ptrain.train import activation_codecs, codecs
from p2ptrain.train.data import get_batch, load_corpus, replica_rows
from p2ptrain.train.model import build_model, build_stage, loss_fn
from p2ptrain.train.optim import clip_grads, lr_at, make_optimizer, set_lr
from p2ptrain.train.outer import OuterOptimizer, fragment_spans, fragments_due, overlap_steps

HELD_OUT_FRACTION = 0.05
EVAL_SEQUENCES = 128


@dataclass
class Curve:
    loss: list[float] = field(default_factory=list)  # training loss per step (replicas' mean)
    eval: list[tuple[int, float]] = field(default_factory=list)  # (steps done, held-out loss)
    wall_s: float = 0.0


class BoundaryModel(nn.Module):
    """Two pipeline stages with a quantizing boundary between them (same initial weights as
    the whole model: each piece is seeded by its name)."""

    def __init__(self, spec: RunSpec, boundary: str) -> None:
        super().__init__()
        self.first = build_stage(spec, 0, 2)
        self.second = build_stage(spec, 1, 2)
        self.crossing = (
            activation_codecs.Int8RowsBoundary
            if boundary == "int8"
            else activation_codecs.Fp16Boundary
        )

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.second(self.crossing.apply(self.first(idx)))


class Replica:
    """One model, its AdamW and (diloco) its outer state and error feedback."""

    def __init__(self, model: nn.Module, spec: RunSpec, variant: Variant) -> None:
        self.model = model
        self.optimizer = make_optimizer(model, spec)
        self.outer = OuterOptimizer(model, variant.outer_lr, variant.outer_momentum)
        self.spans = fragment_spans(self.outer.numel, variant.fragments)
        # error feedback per fragment, as each fragment's exchange keeps its own
        self.topk = [
            codecs.TopKCompressor(end - start, spec.wire.topk_fraction)
            for start, end in self.spans
            if variant.outer_compression == "topk"
        ]

    def train_step(self, spec: RunSpec, step: int, x: torch.Tensor, y: torch.Tensor) -> float:
        set_lr(self.optimizer, lr_at(step, spec))
        loss = loss_fn(self.model(x), y)
        loss.backward()
        clip_grads(self.model, spec.optim.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(loss.item())

    def sent_pseudo_gradient(self, codec: str, fragment: int) -> torch.Tensor:
        """What the group receives of this replica's pseudo-gradient of `fragment`, through
        the wire codec."""
        delta = self.outer.pseudo_gradient(span=self.spans[fragment])
        if codec == "fp16":
            return codecs.decode_fp16(codecs.encode_fp16(delta), delta.shape)
        if codec == "int8":
            return codecs.decode_int8_blocks(codecs.encode_int8_blocks(delta), delta.shape)
        topk = self.topk[fragment]
        payload, _ = topk.encode(delta)
        return codecs.decode_topk(payload, delta.numel(), topk.fraction)


@dataclass
class PendingRound:
    """A fragment's round started after step `step`: the group's mean pseudo-gradient and each
    replica's parameters then (its inner progress since is kept when the result is applied)."""

    fragment: int
    step: int
    apply_at: int
    mean: torch.Tensor
    started: list[torch.Tensor]


def start_round(
    replicas: list[Replica], codec: str, fragment: int, step: int, apply_at: int
) -> PendingRound:
    """Every replica sends its pseudo-gradient of `fragment` through the codec; their mean."""
    mean = torch.stack([r.sent_pseudo_gradient(codec, fragment) for r in replicas]).mean(dim=0)
    started = [r.outer.flat_params(span=r.spans[fragment]) for r in replicas]
    return PendingRound(fragment, step, apply_at, mean, started)


def apply_round(replicas: list[Replica], pending: PendingRound) -> None:
    """All apply the same outer step to the same anchor, then add back their own progress
    since the round started (none when applied at once), as worker/averaging/outer_rounds.py."""
    for replica, started in zip(replicas, pending.started, strict=True):
        span = replica.spans[pending.fragment]
        progress = replica.outer.flat_params(span=span) - started
        replica.outer.step(pending.mean, span)
        replica.outer.load_params(replica.outer.anchor[span[0] : span[1]] + progress, span)


@torch.no_grad()
def evaluate(model: nn.Module, held_out: tuple[torch.Tensor, torch.Tensor]) -> float:
    model.eval()
    x, y = held_out
    losses = [loss_fn(model(x[i : i + 32]), y[i : i + 32]).item() for i in range(0, len(x), 32)]
    model.train()
    return sum(losses) / len(losses)


def train_variant(
    variant: Variant,
    spec: RunSpec,
    num_replicas: int,
    corpus: torch.Tensor,
    held_out: tuple[torch.Tensor, torch.Tensor],
    eval_every: int,
) -> Curve:
    """Train one variant for spec.optim.steps steps on `corpus`; its loss curve and held-out losses."""
    torch.manual_seed(spec.optim.seed)
    base: nn.Module = (
        BoundaryModel(spec, variant.boundary) if variant.boundary else build_model(spec)
    )
    count = num_replicas if variant.sync == "diloco" else 1
    replicas = [Replica(copy.deepcopy(base), spec, variant) for _ in range(count)]
    curve = Curve()
    overlap = overlap_steps(variant.inner_steps) if variant.overlap < 0 else variant.overlap
    pending: dict[int, PendingRound] = {}  # by fragment
    fragments = len(replicas[0].spans)
    start = time.perf_counter()
    for step in range(spec.optim.steps):
        losses = []
        for index, replica in enumerate(replicas):
            rows = replica_rows(spec.optim.batch_size, count, index)
            x, y = get_batch(corpus, spec, step, rows)
            losses.append(replica.train_step(spec, step, x, y))
        curve.loss.append(sum(losses) / len(losses))
        done = step + 1
        last = done == spec.optim.steps
        for fragment, started in list(pending.items()):
            if last or started.apply_at <= step:
                apply_round(replicas, pending.pop(fragment))
        due = fragments_due(step, spec.optim.steps, variant.inner_steps, 0, 1, fragments)
        for fragment in due if variant.sync == "diloco" else []:
            if fragment in pending:  # its previous round is due before its next one starts
                apply_round(replicas, pending.pop(fragment))
            apply_at = step + (0 if last else overlap)
            round_ = start_round(replicas, variant.outer_compression, fragment, step, apply_at)
            if apply_at == step:
                apply_round(replicas, round_)
            else:
                pending[fragment] = round_
        if done % eval_every == 0 or done == spec.optim.steps:
            curve.eval.append((done, evaluate(replicas[0].model, held_out)))
    curve.wall_s = time.perf_counter() - start
    return curve


def bytes_per_value(variant: Variant, spec: RunSpec, numel: int) -> float:
    """Bytes on the wire per value per exchange: the pseudo-gradient's (diloco), the gradient's
    in fp16 (step), or the activations' at the boundary (act_*)."""
    if variant.boundary == "int8":
        return activation_codecs.int8_rows_bytes_per_value(spec.model.n_embd)
    if variant.sync == "diloco":
        return codecs.outer_bytes_per_value(
            variant.outer_compression, numel, spec.wire.topk_fraction
        )
    return 2.0


def run_benchmark(
    num_replicas: int = 4,
    steps: int = 300,
    batch_per_replica: int = 8,
    inner_steps: tuple[int, ...] = (INNER_STEPS, 10),
    only: tuple[str, ...] = (),
    spec: RunSpec | None = None,
    progress: Callable[[str], None] = lambda _: None,
    seeds: int = 1,
) -> dict[str, Any]:
    """Every variant at equal tokens; the JSON of the bench (`variants`, `replicas`, ...).
    seeds > 1: every variant trains once per seed (the run spec's seed and the next ones: the
    initial weights, the batches and the held-out windows), and each row's final loss and
    ratios are the means over the seeds (a single run's ratio moves by about 1% with the seed:
    docs/benchmarks.md), the per-seed values beside them; the curves are the first seed's."""
    base = spec or RunSpec()
    spec = base.replace(
        steps=steps,
        batch_size=num_replicas * batch_per_replica,
        micro_batches=1,
        warmup_steps=max(base.optim.warmup_steps, steps // 20),
    )
    corpus = load_corpus(spec)
    split = int(corpus.numel() * (1 - HELD_OUT_FRACTION))
    train, held = corpus[:split], corpus[split:]
    runs = [spec.replace(seed=spec.optim.seed + k) for k in range(max(1, seeds))]
    # each seed's held-out windows (get_batch draws them with the seed): a seed's ratios
    # compare its variants on the same windows
    held_outs = [get_batch(held, run.replace(batch_size=EVAL_SEQUENCES), 0) for run in runs]
    eval_every = max(inner_steps) if steps >= max(inner_steps) else steps
    variants = [v for v in default_variants(list(inner_steps)) if not only or v.name in only]
    numel = sum(p.numel() for p in build_model(spec).parameters())
    results: dict[str, Any] = {}
    for variant in variants:
        curves = []
        for run, held_out in zip(runs, held_outs, strict=True):
            seed = f", seed {run.optim.seed}" if len(runs) > 1 else ""
            progress(f"{variant.name}: {steps} steps x {num_replicas} replicas{seed}")
            curves.append(train_variant(variant, run, num_replicas, train, held_out, eval_every))
        curve = curves[0]
        finals = [c.eval[-1][1] for c in curves]
        results[variant.name] = {
            "final_loss": round(sum(finals) / len(finals), 5),
            "final_loss_by_seed": [round(f, 5) for f in finals],
            "loss": [round(v, 4) for v in curve.loss],
            "eval": [[s, round(v, 5)] for s, v in curve.eval],
            "train_loss_tail": round(_tail_mean(curve.loss), 5),
            "bytes_per_value": round(bytes_per_value(variant, spec, numel), 5),
            "syncs_per_step": round(1 / variant.inner_steps, 5),
            "sync": variant.sync,
            "inner_steps": variant.inner_steps,
            "outer_compression": variant.outer_compression if variant.sync == "diloco" else "",
            "boundary": variant.boundary,
            "reference": variant.reference,
            "wall_s": round(sum(c.wall_s for c in curves), 1),
        }
        progress(f"{variant.name}: final held-out loss {' '.join(f'{f:.4f}' for f in finals)}")
    _add_ratios(results, variants)
    return {
        "variants": results,
        "replicas": num_replicas,
        "steps": steps,
        "seeds": [run.optim.seed for run in runs],
        "tokens": steps * spec.optim.batch_size * spec.model.block_size,
        "batch_per_replica": batch_per_replica,
        "lr": spec.optim.lr,
        "min_lr": spec.optim.min_lr,
        "warmup_steps": spec.optim.warmup_steps,
        "outer_lr": OUTER_LR,  # the diloco variants' (diloco_hH_paper: DiLoCo's 0.7 / 0.9)
        "outer_momentum": OUTER_MOMENTUM,
        "topk_fraction": spec.wire.topk_fraction,
        "parameters": numel,
        "final_loss": "held-out loss of the final model",
        "held_out_tokens": EVAL_SEQUENCES * spec.model.block_size,
    }


def _tail_mean(values: list[float]) -> float:
    tail = values[-max(1, len(values) // 10) :]
    return sum(tail) / len(tail)


def _ratios(row: dict[str, Any], reference: dict[str, Any] | None) -> list[float]:
    """The row's final loss over the reference's, seed by seed (each on its seed's held-out
    windows); none without the reference."""
    if not reference:
        return []
    pairs = zip(row["final_loss_by_seed"], reference["final_loss_by_seed"], strict=True)
    return [round(loss / ref, 5) for loss, ref in pairs]


def _add_ratios(results: dict[str, Any], variants: list[Variant]) -> None:
    for variant in variants:
        row = results[variant.name]
        for key, reference in (("step", "step"), ("reference", variant.reference)):
            ratios = _ratios(row, results.get(reference))
            row[f"ratio_to_{key}"] = round(sum(ratios) / len(ratios), 5) if ratios else None
            row[f"ratio_to_{key}_by_seed"] = ratios
        row["limit"] = variant.limit or None
        row["passed"] = (
            row["ratio_to_reference"] <= variant.limit
            if variant.limit and row["ratio_to_reference"] is not None
            else None
        )
