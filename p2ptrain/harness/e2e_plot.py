"""`bench e2e`'s plot: loss against seconds since training started, one line per run, with
axes, labels and a legend (matplotlib, the `bench` extra; the Agg backend: no display); and
`bench scaleout`'s: loss against seconds and against tokens, side by side."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from p2ptrain.errors import UserError

COLORS = {  # colour-blind safe (Okabe-Ito)
    "scheduled": "#0072B2",
    "compute_blind": "#CC79A7",
    "random": "#D55E00",
    "hivemind_dp": "#009E73",
    "ideal": "#999999",
    "step": "#0072B2",
    "diloco": "#D55E00",
    "diloco_int8": "#009E73",
}
SPARE_COLORS = ("#E69F00", "#CC79A7", "#56B4E9", "#F0E442", "#000000")
LABELS = {"random": "random (median seed)", "ideal": "ideal (1 Gbit/s, no delay)"}


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise UserError("the plot needs matplotlib: pip install 'p2ptrain[bench]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_scaleout_plot(
    path: Path,
    runs: dict[str, tuple[Sequence[float], Sequence[float], Sequence[float]]],
    title: str = "bench scaleout",
) -> None:
    """Per run (seconds, tokens, loss) per step: loss against seconds since the first plan on
    the left, against tokens trained on the right; a PNG at path."""
    plt = _pyplot()
    fig, (by_time, by_tokens) = plt.subplots(1, 2, figsize=(12, 5), dpi=100, sharey=True)
    spare = iter(SPARE_COLORS)  # runs without a colour of their own (diloco_hN)
    for name, (seconds, tokens, losses) in runs.items():
        color = COLORS.get(name) or next(spare, None)
        if losses:
            thousands = [t / 1000 for t in tokens]
            for ax, xs in ((by_time, seconds), (by_tokens, thousands)):
                ax.plot(xs, losses, marker=".", markersize=3, label=name, color=color)
    by_time.set_xlabel("seconds since the first plan")
    by_tokens.set_xlabel("thousands of tokens trained")
    by_time.set_ylabel("training loss (mean over replicas)")
    for ax in (by_time, by_tokens):
        ax.set_xlim(left=0)
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def write_loss_plot(
    path: Path, series: dict[str, Sequence[Sequence[float]]], title: str = "bench e2e"
) -> None:
    """One line per run of (seconds, loss) points, to a PNG at path."""
    plt = _pyplot()

    fig, ax = plt.subplots(figsize=(8, 5), dpi=100)
    for name, points in series.items():
        if points:
            xs, ys = zip(*((p[0], p[1]) for p in points), strict=True)
            ax.plot(xs, ys, marker=".", label=LABELS.get(name, name), color=COLORS.get(name))
    ax.set_xlabel("seconds since the first plan")
    ax.set_ylabel("training loss (global batch)")
    ax.set_title(title)
    ax.set_xlim(left=0)
    ax.grid(True, alpha=0.3)
    ax.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
