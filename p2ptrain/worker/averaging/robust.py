"""The rule a reducer combines the senders' copies of one part of the tensor with (pure torch).

In hivemind's butterfly all-reduce every member reduces one share of the tensor: it receives
every sender's copy of each part of that share and returns the combination. That is the one
place that sees what each sender really put in (the gathered checksums and norms are only what
it claims), so the checks live here (worker/averaging/robust_allreduce.py feeds this rule):

- a part holding a NaN or an infinity is dropped;
- each sender counts with its planned weight (its rows of the batch), never the weight it sends;
- with 3 or more senders, a centred clip around the coordinate-wise median: no sender moves the
  result by more than CLIP_FACTOR times the median distance of the parts to their median. In
  the rows of the token embedding and the head (the stage's `token_rows`) the bound is at
  least CLIP_FACTOR times the scale the members' claimed norms give them: there honest copies
  are outliers by nature (a batch has rows only for its own tokens, far larger for those it
  repeats), while everywhere else a gradient sums over every token of the batch;
- with 2 senders a median cannot tell who lies: a part whose norm is over PAIR_NORM_FACTOR times
  the other's is dropped;
- in a state re-sync round (parameters, optimizer moments: replicas that differ only by a few
  local updates), a part farther from ours than the round's drift bound times our part's norm
  is refused: a forced re-sync cannot pull crafted parameters in.

When nothing is dropped or clipped the result is the plain weighted mean, so honest rounds are
unchanged (and pass worker/averaging/checks.py's checksum test). When something is, the result is no
longer the mean of what was claimed and the round fails on every member: each keeps its own
gradient, and nothing of the liar's is applied.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

CLIP_FACTOR = 4.0  # tau = this × the median distance to the coordinate-wise median
# outside the token rows tau is at least this × CLIP_FACTOR × the floor (the claims' scale of
# the part): a guard against a zero median distance (identical copies), not the clip radius.
# At the full floor a part 4x an honest part's norm away passed: -2.4x a member's own gradient
# turned a 3-member round's mean against the true gradient (docs/security.md, 29.9)
SPREAD_FLOOR = 1e-2
CLIP_ITERATIONS = 3  # centred-clip iterations (each moves the centre toward the clipped mean)
# up to this many rows the median is taken by a compare-exchange network of elementwise
# min/max (n^2 / 2 of them), not torch.sort along the rows: 9x less CPU at 8 rows, and an
# outer round's combine runs on a training worker's small CPU quota (docs/benchmarks.md)
NETWORK_MAX_ROWS = 16
PAIR_NORM_FACTOR = 3.0  # of two parts, one over this × the other's norm is dropped
# a drifted replica's parameters differ by ~1e-2 of their norm, its Adam moments by up to about
# as much as they are (a local update changes exp_avg by a tenth of a whole gradient)
PARAMS_DRIFT_BOUND = 0.1
MOMENTS_DRIFT_BOUND = 1.0


@dataclass(frozen=True)
class Combined:
    """A reduced part, and the senders (indices into the parts given) that did not count fully."""

    value: torch.Tensor
    dropped: dict[int, str]  # sender -> why its part was left out
    clipped: tuple[int, ...] = ()  # senders whose part was pulled toward the others'


def robust_mean(
    parts: Sequence[torch.Tensor],
    weights: Sequence[float],
    own: int | None = None,
    drift_bound: float | None = None,
    floor: float = 0.0,
    token_rows: Sequence[tuple[int, int]] = (),
) -> Combined:
    """Combine one part from every sender (`weights` from the plan; `own`: our index, if we
    sent; `drift_bound`: set in state rounds; `floor`: the part's scale from the members'
    claimed norms, the smallest norm the pair and drift rules use, so a part that is all zeros
    in most copies does not make every other copy an outlier; `token_rows`: the [start, stop)
    spans of the flattened part that are rows of the token embedding or the head)."""
    assert len(parts) == len(weights) and parts
    dropped: dict[int, str] = {}
    for i, part in enumerate(parts):
        if not _all_finite(part):
            dropped[i] = "non-finite values"
    if drift_bound is not None and own is not None and own not in dropped:
        mine = parts[own].double()
        bound = drift_bound * max(float(mine.norm()), floor)
        for i, part in enumerate(parts):
            distance = float((part.double() - mine).norm())
            if i not in dropped and not distance <= bound:
                dropped[i] = f"{distance:.3g} from our state (bound {bound:.3g})"
    kept = [i for i in range(len(parts)) if i not in dropped]
    if not kept:  # nothing usable: our own part (the round fails its checks anyway)
        fallback = parts[own] if own is not None else torch.zeros_like(parts[0])
        return Combined(torch.nan_to_num(fallback, 0.0, 0.0, 0.0), dropped)
    if len(kept) == 2 and drift_bound is None:
        norms = {i: float(parts[i].double().norm()) for i in kept}
        small, large = sorted(kept, key=lambda i: norms[i])
        if norms[large] > PAIR_NORM_FACTOR * max(norms[small], floor):
            dropped[large] = f"norm {norms[large]:.3g} against {norms[small]:.3g}"
            kept = [small]
    screened = torch.stack([parts[i] for i in kept])  # the parts' own precision
    stacked = screened.double()
    w = torch.tensor([float(weights[i]) for i in kept], dtype=torch.float64)
    # the weighted mean as one product (no temporary of the stack's size)
    mean = torch.tensordot(w, stacked, dims=1) / w.sum()
    w = w.view(-1, *([1] * (stacked.dim() - 1)))
    if len(kept) < 3 or drift_bound is not None:
        return Combined(mean.to(parts[0].dtype), dropped)
    # who is an outlier is decided in the parts' own precision (half the memory traffic of
    # float64: the median is most of a combine's CPU); the result stays float64 math
    value, clipped = _centred_clip(stacked, screened, w, floor, token_rows)
    if not clipped:
        value = mean
    return Combined(value.to(parts[0].dtype), dropped, tuple(kept[i] for i in clipped))


def combine_members(
    parts: Mapping[str, torch.Tensor], weights: Mapping[str, float], me: str, floor: float
) -> tuple[torch.Tensor, list[str]]:
    """robust_mean of the members' parts (by peer id) in member order, with the plan's
    weights; the problems, one line per member dropped or clipped."""
    order = sorted(parts)
    combined = robust_mean(
        [parts[p] for p in order], [weights[p] for p in order], own=order.index(me), floor=floor
    )
    notes = [f"{order[i]}: {why}" for i, why in combined.dropped.items()]
    notes += [f"{order[i]}: clipped" for i in combined.clipped]
    return combined.value, notes


def _all_finite(part: torch.Tensor) -> bool:
    """No NaN or infinity in `part`: its float64 sum is finite exactly then (a NaN or an
    infinity carries through a sum; finite float32 or float16 values cannot overflow float64),
    and a sum reads the part once without a mask of its size."""
    return bool(torch.isfinite(part.sum(dtype=torch.float64)))


def _centred_clip(
    stacked: torch.Tensor,
    screened: torch.Tensor,
    w: torch.Tensor,
    floor: float,
    token_rows: Sequence[tuple[int, int]],
) -> tuple[torch.Tensor, list[int]]:
    """Centred clip (Karimireddy et al. 2021) from the coordinate-wise median; the senders
    (rows) farther than tau from it, where tau = CLIP_FACTOR × the median distance: at least
    SPREAD_FLOOR of the floor's share of the coordinates outside `token_rows`, and the whole
    floor's share of those inside, each measured apart. `screened`: the rows in their own
    precision, for the outlier test; `stacked`: in float64."""
    median = coordinate_median(screened)
    numel = median.numel()
    outside = _complement(token_rows, numel)
    inside = _complement(outside, numel)  # the token rows, sorted, merged and in range
    split = [_norms((row - median).reshape(-1), outside, inside) for row in screened]
    per_value = floor / math.sqrt(max(numel, 1))  # a span's floor: this × its size's root
    tau = CLIP_FACTOR * max(
        _low_median([d for d, _ in split]), SPREAD_FLOOR * per_value * math.sqrt(_size(outside))
    )
    tau_rows = CLIP_FACTOR * max(
        _low_median([d for _, d in split]), per_value * math.sqrt(_size(inside))
    )
    clipped = [i for i, (d, d_rows) in enumerate(split) if d > tau or d_rows > tau_rows]
    if not clipped:
        return median, []
    radius = math.hypot(tau, tau_rows)
    centre = median.double()
    for _ in range(CLIP_ITERATIONS):
        offsets = stacked - centre
        norms = offsets.flatten(1).norm(dim=1)
        scale = torch.clamp(radius / (norms + 1e-300), max=1.0).view_as(w)
        centre = centre + (w * scale * offsets).sum(0) / w.sum()
    return centre, clipped


def _norms(
    offset: torch.Tensor, outside: list[tuple[int, int]], inside: list[tuple[int, int]]
) -> tuple[float, float]:
    """The norm of the flat `offset` over the `outside` spans and over the `inside` ones."""
    if not inside:  # the usual part: no token rows, one pass
        return float(torch.linalg.vector_norm(offset)), 0.0
    return _span_norm(offset, outside), _span_norm(offset, inside)


def _span_norm(flat: torch.Tensor, spans: list[tuple[int, int]]) -> float:
    """The norm of `flat` over `spans` (slices: no mask of the part's size)."""
    return math.sqrt(sum(float(torch.linalg.vector_norm(flat[a:b])) ** 2 for a, b in spans))


def _complement(spans: Sequence[tuple[int, int]], numel: int) -> list[tuple[int, int]]:
    """The spans of range(numel) outside `spans` (sorted or not, clipped to the range)."""
    gaps, at = [], 0
    for a, b in sorted(spans):
        if a > at:
            gaps.append((at, min(a, numel)))
        at = max(at, b)
    if at < numel:
        gaps.append((at, numel))
    return [(a, b) for a, b in gaps if b > a]


def _size(spans: list[tuple[int, int]]) -> int:
    return sum(b - a for a, b in spans)


def _low_median(values: list[float]) -> float:
    """torch.median's choice: of an even count, the lower of the middle two."""
    return sorted(values)[(len(values) - 1) // 2]


def coordinate_median(stacked: torch.Tensor) -> torch.Tensor:
    """The coordinate-wise median of the rows (the mean of the middle two for an even count),
    exactly what sorting each column gives."""
    n = len(stacked)
    if n > NETWORK_MAX_ROWS:
        ordered = stacked.sort(dim=0).values
        return (ordered[(n - 1) // 2] + ordered[n // 2]) / 2
    rows = list(stacked.unbind(0))
    for sweep in range(n):  # odd-even transposition sort: n sweeps sort any n rows
        for i in range(sweep % 2, n - 1, 2):
            rows[i], rows[i + 1] = (
                torch.minimum(rows[i], rows[i + 1]),
                torch.maximum(rows[i], rows[i + 1]),
            )
    return (rows[(n - 1) // 2] + rows[n // 2]) / 2
