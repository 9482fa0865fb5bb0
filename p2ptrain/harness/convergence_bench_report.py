"""The `p2ptrain bench convergence` report: the JSON that convergence_bench.py's `run_benchmark`
returns, as a table of each variant's final loss against every-step's and its reference's."""

from __future__ import annotations

from typing import Any


def render(result: dict[str, Any]) -> str:
    """The table: each variant's final loss against every-step's and against its reference."""
    seeds = result.get("seeds", [0])
    averaged = f"; means over seeds {', '.join(map(str, seeds))}" if len(seeds) > 1 else ""
    lines = [
        f"{result['replicas']} replicas, {result['steps']} steps, {result['tokens']:,} tokens "
        f"per variant; final loss = held-out loss of the final model{averaged}",
        f"{'variant':<18}{'final':>8}{'/ step':>8}{'reference':>12}{'/ ref':>8}{'target':>8}"
        f"{'ok':>5}{'B/value':>9}{'syncs/step':>11}{'wall s':>8}",
    ]
    for name, row in result["variants"].items():
        ratio = row["ratio_to_step"]
        ref_ratio = row["ratio_to_reference"]
        ok = {True: "yes", False: "NO", None: ""}[row["passed"]]
        lines.append(
            f"{name:<18}{row['final_loss']:>8.4f}{_num(ratio):>8}{row['reference']:>12}"
            f"{_num(ref_ratio):>8}{_num(row['limit']):>8}{ok:>5}{row['bytes_per_value']:>9.4f}"
            f"{row['syncs_per_step']:>11.3f}{row['wall_s']:>8.0f}"
        )
    if len(seeds) > 1:  # how far one seed's ratio strays from the mean
        lines.append("seed by seed: / step ; / ref")
        for name, row in result["variants"].items():
            by_step = " ".join(f"{r:.4f}" for r in row["ratio_to_step_by_seed"])
            by_ref = " ".join(f"{r:.4f}" for r in row["ratio_to_reference_by_seed"])
            lines.append(f"{name:<18}{by_step} ; {by_ref}")
    return "\n".join(lines)


def _num(value: float | None) -> str:
    return "" if value is None else f"{value:.4f}"
