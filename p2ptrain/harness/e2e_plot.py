"""`bench e2e`'s plot: loss against seconds since training started, one line per run, with
axes, labels and a legend (matplotlib, the `bench` extra; the Agg backend: no display)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from p2ptrain.errors import UserError

COLORS = {  # colour-blind safe (Okabe-Ito)
    "scheduled": "#0072B2",
    "compute_blind": "#CC79A7",
    "random": "#D55E00",
    "hivemind_dp": "#009E73",
    "ideal": "#999999",
}
LABELS = {"random": "random (median seed)", "ideal": "ideal (1 Gbit/s, no delay)"}


def write_loss_plot(
    path: Path, series: dict[str, Sequence[Sequence[float]]], title: str = "bench e2e"
) -> None:
    """One line per run of (seconds, loss) points, to a PNG at path."""
    try:
        import matplotlib
    except ImportError:
        raise UserError("the plot needs matplotlib: pip install 'p2ptrain[bench]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
