"""The outer-Adam trials behind docs/benchmarks.md's 2026-12-02 bullet under "`bench
convergence`" (FedAdam-style): the outer step's direction is Adam's over the rounds' mean
pseudo-gradients, its length the current mean's (rms-matched); the spec's outer momentum must be
0 (the direction carries the momentum). Kept as the record of what was run; not part of the
package, its tests or its lint.

    .venv/bin/python docs/results/convergence_trials_outer_adam.py OUT.jsonl BETA1 BETA2 SPEC...

SPEC as convergence_trials_2026_11_29.py's."""
import sys
from pathlib import Path
import torch
from p2ptrain.train import outer as outer_mod

b1, b2 = float(sys.argv.pop(2)), float(sys.argv.pop(2))
orig_step = outer_mod.OuterOptimizer.step

def adam_step(self, mean, span=None):
    key = span if span is not None else (0, self.numel)
    st = self.__dict__.setdefault("_adam", {})
    m, v, t = st.get(key, (torch.zeros_like(mean), torch.zeros_like(mean), 0))
    t += 1
    m = b1 * m + (1 - b1) * mean
    v = b2 * v + (1 - b2) * mean * mean
    mh, vh = m / (1 - b1 ** t), v / (1 - b2 ** t)
    rms = mean.pow(2).mean().sqrt()
    u = mh / (vh.sqrt() + 1e-3 * rms + 1e-12)
    u = u * (rms / u.pow(2).mean().sqrt().clamp_min(1e-12))
    st[key] = (m, v, t)
    return orig_step(self, u, span)

outer_mod.OuterOptimizer.step = adam_step
sys.path.insert(0, str(Path(__file__).parent))
import convergence_trials_2026_11_29 as ct  # noqa: E402
ct.main()
