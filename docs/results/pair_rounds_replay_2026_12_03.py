"""The replay behind docs/benchmarks.md's "Honest pairs, replayed (2026-12-03)": bench scaleout's
`step` run (the default run spec, 16 rows a step) trained in one process as every-step averaging
of R replicas, each replica's gradient computed on its own rows (train/data.py: replica_rows).
Each step it counts what a stage group's rules would see of those honest gradients: one norm
over 3x the other (robust.py's pair rule, for R = 2) and one over 4x the low median (checks.py's
claims rule), per stage; optionally each replica first clips each stage's gradient to C x the
median of that stage's last 16 norms of its own (a per-member spike clip), and the averaged
gradient is clipped to CLIP (the run spec's `grad_clip`, here over the whole model). Not part of the package, its tests or its lint.

    .venv/bin/python docs/results/pair_rounds_replay_2026_12_03.py ROWS REPLICAS C STEPS [CLIP]
"""

from __future__ import annotations

import math
import statistics
import sys

import torch

from p2ptrain.records.run import RunSpec
from p2ptrain.train.data import get_batch, load_corpus, replica_rows
from p2ptrain.train.model import build_model, loss_fn, stage_layer_ranges
from p2ptrain.train.optim import lr_at, make_optimizer, set_lr

STAGES = 4  # bench scaleout's 2 x 4 plan
WINDOW = 16


def stage_of(name: str, spec: RunSpec) -> int:
    """Which of STAGES near-equal stages holds the whole model's parameter `name`."""
    if name.startswith("embed."):
        return 0
    if name.startswith("head."):
        return STAGES - 1
    layer = int(name.split(".")[1])
    ranges = stage_layer_ranges(spec.model.n_layer, STAGES)
    return next(s for s, layers in enumerate(ranges) if layer in layers)


def main(rows: int, replicas: int, spike: float, steps: int, clip: float) -> None:
    spec = RunSpec().replace(batch_size=rows, steps=steps)
    torch.manual_seed(spec.optim.seed)
    model = build_model(spec)
    optimizer = make_optimizer(model, spec)
    corpus = load_corpus(spec)
    stages = [stage_of(name, spec) for name, _ in model.named_parameters()]
    history: list[list[float]] = [[] for _ in range(replicas * STAGES)]
    over3 = [0] * STAGES
    over4 = [0] * STAGES
    clipped, losses = 0, []
    for step in range(steps):
        set_lr(optimizer, lr_at(step, spec))
        grads, norms, step_losses = [], [], []
        for replica in range(replicas):
            x, y = get_batch(corpus, spec, step, replica_rows(rows, replicas, replica))
            model.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            step_losses.append(loss.item())
            grad = [p.grad.clone() for p in model.parameters()]
            for k in range(STAGES):  # each stage's worker clips its own part, by its own norms
                mine = [i for i, s in enumerate(stages) if s == k]
                norm = math.sqrt(sum(float(grad[i].norm()) ** 2 for i in mine))
                seen = history[replica * STAGES + k]
                if spike and len(seen) >= 4:
                    bound = spike * statistics.median(seen[-WINDOW:])
                    if norm > bound:
                        for i in mine:
                            grad[i] = grad[i] * (bound / norm)
                        clipped += 1
                    seen.append(min(norm, bound))  # a spike sets no reference
                else:
                    seen.append(norm)
            grads.append(grad)
            norms.append(
                [
                    math.sqrt(sum(float(t.norm()) ** 2 for t, s in zip(grad, stages) if s == k))
                    for k in range(STAGES)
                ]
            )
        for k in range(STAGES):
            ordered = sorted(n[k] for n in norms)
            over3[k] += replicas == 2 and ordered[-1] > 3 * ordered[0]
            over4[k] += ordered[-1] > 4 * ordered[(replicas - 1) // 2]
        for param, *parts in zip(model.parameters(), *grads):
            param.grad = sum(parts) / replicas
        if clip:
            torch.nn.utils.clip_grad_norm_(list(model.parameters()), clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(sum(step_losses) / replicas)
    print(
        f"rows {rows} replicas {replicas} spike clip {spike} grad clip {clip}: "
        f"rounds over 3x (pair rule) by stage {over3}, over 4x (claims) {over4}, "
        f"{clipped} of {steps * replicas * STAGES} stage gradients spike-clipped, "
        f"last 10 steps' loss {statistics.fmean(losses[-10:]):.4f}"
    )


if __name__ == "__main__":
    args = sys.argv[1:]
    main(int(args[0]), int(args[1]), float(args[2]), int(args[3]), float(args[4]) if len(args) > 4 else 0.0)
