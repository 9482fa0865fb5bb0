"""The trials behind docs/benchmarks.md's 2026-11-29 bullet under "`bench convergence`": bench
convergence's trainer (p2ptrain/harness/convergence_bench.py: 4 replicas x 16 rows, 300 steps,
the held-out final loss) with settings the product does not ship. The afternoon's rows (beta2,
top-k fractions, inner lr x2 at small H, every-step at a larger lr) are in
convergence-trials-2026-11-29-pm.jsonl. Kept as the record of what was
run; not part of the package, its tests or its lint.

    .venv/bin/python docs/results/convergence_trials_2026_11_29.py OUT.jsonl SPEC [SPEC ...]

SPEC = name,H,codec,outer_lr,outer_momentum,overlap[,inner_lr_x[,beta1[,pooled[,beta2[,topk]]]]]
  name "step..." is every-step averaging (H and the outer fields are then ignored);
  pooled (an int M) swaps the inner AdamW for PooledAdam below (M = 1: plain Adam, no decay;
  0: AdamW); beta2 (0: the run spec's) is AdamW's; topk is the run spec's topk_fraction;
  --agree scales each coordinate of the group's mean pseudo-gradient by (2 - a),
  a = |mean| / mean(|delta_i|) (1 where the replicas agree, up to 2 where they cancel);
  --denoised (with pooled): PooledAdam's numerator denoised as well (2026-11-29 evening);
  --big trains a 6-layer, n_embd 256 model (4.9M parameters) instead of the default.
  --fragments F: Streaming DiLoCo's fragments (2026-12-02: a round's staleness, F 1 and 2 at
  overlap 15 and 29).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from p2ptrain.harness import convergence_bench as bench
from p2ptrain.records.run import RunSpec
from p2ptrain.train.data import get_batch, load_corpus


class PooledAdam(torch.optim.Optimizer):
    """Adam whose normalizer estimates what the M replicas' pooled batch would see: the noise part
    of v over M, v_pooled = a^2 + (v - a^2) / M with a the gradient's EMA at beta2."""

    def __init__(
        self,
        params: list[torch.Tensor],
        lr: float,
        betas: tuple[float, float],
        m: int,
        denoised: bool = False,
    ):
        super().__init__(params, {"lr": lr, "betas": betas, "eps": 1e-8})
        self.replicas = m
        # --denoised: the numerator too, m_pooled = a + (m - a) / sqrt(M) (the pooled batch's
        # gradient noise is sqrt(M) smaller), so the step is the pooled batch's in expectation
        self.denoised = denoised

    @torch.no_grad()
    def step(self, closure: object = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state[param]
                if not state:
                    state.update(t=0, m=torch.zeros_like(param), v=torch.zeros_like(param))
                    state["a"] = torch.zeros_like(param)
                state["t"] += 1
                t, grad = state["t"], param.grad
                state["m"].mul_(beta1).add_(grad, alpha=1 - beta1)
                state["v"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                state["a"].mul_(beta2).add_(grad, alpha=1 - beta2)
                m_hat = state["m"] / (1 - beta1**t)
                v_hat = state["v"] / (1 - beta2**t)
                a_sq = (state["a"] / (1 - beta2**t)) ** 2
                pooled = a_sq + (v_hat - a_sq).clamp_min(0) / self.replicas
                pooled = torch.maximum(pooled, v_hat / self.replicas)
                if self.denoised:
                    a_hat = state["a"] / (1 - beta2**t)
                    m_hat = a_hat + (m_hat - a_hat) / self.replicas**0.5
                param.addcdiv_(m_hat, pooled.sqrt().add_(group["eps"]), value=-group["lr"])


def agreement_round(replicas, codec, step, apply_at):  # type: ignore[no-untyped-def]
    deltas = torch.stack([r.sent_pseudo_gradient(codec) for r in replicas])
    mean = deltas.mean(0)
    agreement = mean.abs() / deltas.abs().mean(0).clamp_min(1e-12)
    started = [r.outer.flat_params() for r in replicas]
    return bench.PendingRound(step, apply_at, mean * (2 - agreement), started)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("specs", nargs="+")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--agree", action="store_true")
    parser.add_argument("--big", action="store_true")
    parser.add_argument("--denoised", action="store_true")
    parser.add_argument("--fragments", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(1)
    base = RunSpec()
    if args.big:
        base = base.replace(n_layer=6, n_embd=256, n_head=8)
    steps = args.steps
    spec = base.replace(
        steps=steps,
        batch_size=64,
        micro_batches=1,
        warmup_steps=max(base.optim.warmup_steps, steps // 20),
    )
    corpus = load_corpus(spec)
    split = int(corpus.numel() * (1 - bench.HELD_OUT_FRACTION))
    held_out = get_batch(corpus[split:], spec.replace(batch_size=bench.EVAL_SEQUENCES), 0)
    if args.agree:
        bench.start_round = agreement_round  # type: ignore[assignment]
    product_optimizer = bench.make_optimizer
    for text in args.specs:
        fields = text.split(",")
        name, h, codec = fields[0], int(fields[1]), fields[2]
        lr, momentum, overlap = float(fields[3]), float(fields[4]), int(fields[5])
        sync = "step" if name.startswith("step") else "diloco"
        variant = bench.Variant(
            name, sync, h, codec, outer_lr=lr, outer_momentum=momentum, overlap=overlap, fragments=args.fragments
        )
        run = spec
        if len(fields) > 6 and float(fields[6]) != 1:
            scale = float(fields[6])
            run = run.replace(lr=spec.optim.lr * scale, min_lr=spec.optim.min_lr * scale)
        if len(fields) > 7:
            run = run.replace(beta1=float(fields[7]))
        bench.make_optimizer = product_optimizer
        if len(fields) > 9 and float(fields[9]) > 0:
            run = run.replace(beta2=float(fields[9]))
        if len(fields) > 10:
            run = run.replace(topk_fraction=float(fields[10]))
        if len(fields) > 8 and int(fields[8]) > 0:
            pooled = int(fields[8])
            bench.make_optimizer = lambda model, s, m=pooled: PooledAdam(  # type: ignore[misc]
                [p for p in model.parameters() if p.requires_grad],
                s.optim.lr,
                (s.optim.beta1, s.optim.beta2),
                m,
                args.denoised,
            )
        start = time.time()
        curve = bench.train_variant(variant, run, 4, corpus[:split], held_out, 30)
        row = {
            "name": text,
            "final": curve.eval[-1][1],
            "eval": curve.eval,
            "wall": time.time() - start,
            "agree": args.agree,
            "big": args.big,
        }
        print(json.dumps(row), flush=True)
        with open(args.out, "a") as out:
            out.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
