"""The trials behind docs/benchmarks.md's 2026-12-03 bullet under "`bench convergence`": bench
convergence's trainer (p2ptrain/harness/convergence_bench.py: 4 replicas x 16 rows, 300 steps,
the held-out final loss) with gradient clipping, which no earlier trial had: the run spec's
`grad_clip` (each replica's, or the one model's, gradient norm) and a spike clip (each
replica's gradient clipped to C x the median of its own last 16 norms, a spike setting no
reference). Kept as the record of what was run; not part of the package, its tests or its lint.

    .venv/bin/python docs/results/convergence_trials_2026_12_03.py OUT.jsonl SPEC [SPEC ...]

SPEC = name,H,codec,outer_lr,outer_momentum,inner_lr_x,grad_clip,spike_c
  name "step..." is every-step averaging (H and the outer fields are then ignored); the round
  is applied as bench convergence applies it (min(H/2, 15) steps late).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time

import torch
from torch import nn

from p2ptrain.harness import convergence_bench as bench
from p2ptrain.records.run import RunSpec
from p2ptrain.train.data import get_batch, load_corpus
from p2ptrain.train.optim import clip_grads

WINDOW = 16


def spike_clipper(c: float):  # type: ignore[no-untyped-def]
    """bench.clip_grads's stand-in: the spike clip (per model: each replica its own history),
    then the run spec's clip."""
    history: dict[int, list[float]] = {}

    def clip(model: nn.Module, max_norm: float) -> None:
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        norm = math.sqrt(sum(float(g.norm()) ** 2 for g in grads))
        seen = history.setdefault(id(model), [])
        if len(seen) >= 4:
            bound = c * statistics.median(seen[-WINDOW:])
            if norm > bound:
                for g in grads:
                    g.mul_(bound / norm)
            seen.append(min(norm, bound))
        else:
            seen.append(norm)
        clip_grads(model, max_norm)

    return clip


def trainer(steps: int) -> tuple[RunSpec, torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """bench convergence's shape (64 rows a step: 4 replicas x 16, warmup 5%), the training part
    of the corpus and the held-out windows (also used by convergence_trials_pooled_scale.py)."""
    base = RunSpec()
    spec = base.replace(
        steps=steps,
        batch_size=64,
        micro_batches=1,
        warmup_steps=max(base.optim.warmup_steps, steps // 20),
    )
    corpus = load_corpus(spec)
    split = int(corpus.numel() * (1 - bench.HELD_OUT_FRACTION))
    held_out = get_batch(corpus[split:], spec.replace(batch_size=bench.EVAL_SEQUENCES), 0)
    return spec, corpus[:split], held_out


def variant_and_run(spec: RunSpec, fields: list[str]) -> tuple[bench.Variant, RunSpec]:
    """name,H,codec,outer_lr,outer_momentum,inner_lr_x,grad_clip: the variant and its run spec."""
    name, h, codec, lr, momentum, lr_x, grad_clip = fields
    sync = "step" if name.startswith("step") else "diloco"
    variant = bench.Variant(
        name, sync, int(h), codec, outer_lr=float(lr), outer_momentum=float(momentum)
    )
    scale = float(lr_x)
    run = spec.replace(
        lr=spec.optim.lr * scale, min_lr=spec.optim.min_lr * scale, grad_clip=float(grad_clip)
    )
    return variant, run


def record(out_path: str, text: str, variant: bench.Variant, run: RunSpec, train, held_out) -> None:  # type: ignore[no-untyped-def]
    """Train the variant on 4 replicas; print its row and append it to out_path."""
    start = time.time()
    curve = bench.train_variant(variant, run, 4, train, held_out, 30)
    row = {"name": text, "final": curve.eval[-1][1], "eval": curve.eval, "wall": time.time() - start}
    print(json.dumps(row), flush=True)
    with open(out_path, "a") as out:
        out.write(json.dumps(row) + "\n")


def arguments() -> argparse.Namespace:
    """OUT.jsonl SPEC [SPEC ...] [--steps N] (also convergence_trials_pooled_scale.py's)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("specs", nargs="+")
    parser.add_argument("--steps", type=int, default=300)
    return parser.parse_args()


def main() -> None:
    args = arguments()
    spec, train, held_out = trainer(args.steps)
    for text in args.specs:
        *fields, spike = text.split(",")
        variant, run = variant_and_run(spec, fields)
        bench.clip_grads = spike_clipper(float(spike)) if float(spike) > 0 else clip_grads  # type: ignore[assignment]
        record(args.out, text, variant, run, train, held_out)


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
