"""Trials of a pooled-batch outer scale (2026-12-03 evening): bench convergence's trainer
(p2ptrain/harness/convergence_bench.py: 4 replicas x 16 rows, 300 steps, held-out final loss)
with each coordinate of the group's mean pseudo-gradient scaled by what one AdamW on the pooled
batch would have moved there against what the replicas' AdamW moved.

Why: AdamW on 16 rows moves a coordinate by lr * s / sqrt(s^2 + sigma^2) a step (s the
gradient's mean, sigma its noise at 16 rows); on the pooled 4 x 16 rows by lr * s /
sqrt(s^2 + sigma^2 / 4): up to twice as far where noise dominates, as far where the signal does.
The mean pseudo-gradient over the lr summed since the last round, r, estimates s / sqrt(s^2 +
sigma^2) per coordinate, so the pooled step is the mean times 1 / sqrt(r^2 + (1 - r^2) / M)
(M the replicas; `m_eff` may set it lower). Every member computes it from the round's mean and
the lr schedule alone: no extra bytes, the replicas stay identical. Kept as the record of what
was run; not part of the package, its tests or its lint.

    .venv/bin/python docs/results/convergence_trials_pooled_scale.py OUT.jsonl SPEC [SPEC ...]

SPEC = name,H,codec,outer_lr,outer_momentum,inner_lr_x,grad_clip,m_eff
  name "step..." is every-step averaging; m_eff 0 = no scale (the plain outer step).
"""

from __future__ import annotations

import convergence_trials_2026_12_03 as trials  # beside this file: the trainer's set-up
import torch

from p2ptrain.harness import convergence_bench as bench
from p2ptrain.records.run import RunSpec
from p2ptrain.train.optim import lr_at


def pooled_scale(mean: torch.Tensor, lr_sum: float, m_eff: float) -> torch.Tensor:
    ratio = (mean / lr_sum).square().clamp(max=1.0)
    return torch.rsqrt(ratio + (1.0 - ratio) / m_eff)


def scaled_apply(spec: RunSpec, m_eff: float, plain):  # type: ignore[no-untyped-def]
    """bench.apply_round's stand-in: the mean scaled before the outer step. The lr summed over
    the inner steps the pseudo-gradient covers: those since the fragment's previous round."""
    last_start: dict[int, int] = {}

    def apply(replicas, pending):  # type: ignore[no-untyped-def]
        first = last_start.get(pending.fragment, -1) + 1
        last_start[pending.fragment] = pending.step
        lr_sum = sum(lr_at(s, spec) for s in range(first, pending.step + 1))
        pending.mean = pending.mean * pooled_scale(pending.mean, lr_sum, m_eff)
        plain(replicas, pending)

    return apply


def main() -> None:
    args = trials.arguments()
    spec, train, held_out = trials.trainer(args.steps)
    plain = bench.apply_round
    for text in args.specs:
        *fields, m_eff = text.split(",")
        variant, run = trials.variant_and_run(spec, fields)
        bench.apply_round = (  # type: ignore[assignment]
            scaled_apply(run, float(m_eff), plain) if float(m_eff) > 0 else plain
        )
        trials.record(args.out, text, variant, run, train, held_out)


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
