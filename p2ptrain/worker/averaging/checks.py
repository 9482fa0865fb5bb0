"""Checks for averaging rounds: is a result the weighted mean of what the group put in?

hivemind's DecentralizedAverager reports a round as a success even when a groupmate died mid-way
and part of the tensor was left un-averaged (measured with hivemind 1.1.12). So each peer
gathers, with its gradient, two linear checksums of it (the plain sum and a ±1 random projection seeded by the step)
plus its weight and norm. A correct weighted average reproduces the weighted average of the
checksums; a half-averaged one almost surely does not. Pure torch, so it is unit-testable.

What a groupmate gathers is only what it claims. The weights come from the plan (a claimed one
that differs fails the round); the tolerance scales with the low median of the claimed norms,
never the largest (a claimed norm of 1e300 would let anything pass), and a claimed norm far
above that median fails the round; the result may be no longer than the weighted mean of the
claimed norms (the triangle inequality), which bounds what a lying reducer can slip in along
directions the checksums do not see. What each sender really put in is checked by the reducers
(worker/averaging/robust.py).
"""

from __future__ import annotations

import contextlib
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from p2ptrain.errors import WireError
from p2ptrain.records import fields as f

# |checksum error| allowed, relative to the low median of the gathered gradient norms
EXACT_TOLERANCE = 1e-4
COMPRESSED_TOLERANCE = 3e-2
MAX_WEIGHT = 1e9  # rows of a batch: far below this
# a claimed norm over this × the group's low median fails the round (replicas' gradients on
# near-equal slices of one batch differ in norm by tens of percent)
MAX_NORM_RATIO = 4.0


@dataclass(frozen=True)
class Checksums:
    step: int
    weight: float
    total: float
    projection: float
    norm: float
    # a digest of the stage's parameters before this step's update (replicas must agree on it)
    params: float = 0.0
    params_norm: float = 0.0

    @classmethod
    def from_gather(cls, data: object) -> Checksums:
        """A groupmate's round metadata as it arrived from the network: a valid record (finite
        numbers, a positive weight) or WireError."""
        r = "round metadata"
        d = f.mapping(data, r)
        f.require_keys(d, r, ("step", "weight", "total", "projection", "norm"))
        signed = {
            name: f.number(d.get(name, 0.0), r, name, -math.inf)
            for name in ("total", "projection", "params")
        }
        return cls(
            step=f.integer(d["step"], r, "step", -f.MAX_INT),  # re-sync rounds are negative
            weight=f.number(d["weight"], r, "weight", 1e-12, MAX_WEIGHT),
            norm=f.number(d["norm"], r, "norm"),
            params_norm=f.number(d.get("params_norm", 0.0), r, "params_norm"),
            **signed,
        )

    def as_gather(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "weight": self.weight,
            "total": self.total,
            "projection": self.projection,
            "norm": self.norm,
            "params": self.params,
            "params_norm": self.params_norm,
        }


def checksums(flat: torch.Tensor, step: int, weight: float) -> Checksums:
    """Two linear checksums of a flat gradient, in float64."""
    values = flat.detach().double()
    generator = torch.Generator().manual_seed(1_000_003 * step + 17)
    signs = (
        torch.randint(0, 2, values.shape, generator=generator, dtype=torch.int8).double() * 2 - 1
    )
    return Checksums(
        step,
        float(weight),
        values.sum().item(),
        (values * signs).sum().item(),
        values.norm().item(),
    )


def check_round(
    result: torch.Tensor,
    mine: Checksums,
    gathered: dict[Any, Any],
    tolerance: float,
    weights: Mapping[str, float],
) -> str | None:
    """Why the averaged `result` is not the weighted mean of the gathered gradients, or None.
    `weights`: the plan's weight of every member (peer id in base58)."""
    parts: list[Checksums] = []
    for peer, data in gathered.items():
        try:
            part = Checksums.from_gather(data)
        except WireError as exc:
            return f"bad checksums from {peer}: {exc}"
        planned = weights.get(str(peer))
        if planned is None:
            return f"{peer} is not in the plan's group"
        if not math.isclose(part.weight, planned, rel_tol=1e-9):
            return f"{peer} claims weight {part.weight:g}, the plan gives it {planned:g}"
        parts.append(part)
    if len(parts) < 2:
        return "no groupmates"
    if any(p.step != mine.step for p in parts):
        return f"groupmates at steps {sorted(p.step for p in parts)}, not {mine.step}"
    norms = sorted(p.norm for p in parts)
    median = norms[(len(norms) - 1) // 2]  # the low median: of two, the smaller
    if norms[-1] > MAX_NORM_RATIO * median:
        return f"a claimed gradient norm {norms[-1]:.3g} is over {MAX_NORM_RATIO:g}x the median"
    scale = median + 1e-12
    total_weight = sum(p.weight for p in parts)
    got = checksums(result, mine.step, mine.weight)
    for name in ("total", "projection"):
        want = sum(p.weight * getattr(p, name) for p in parts) / total_weight
        error = abs(getattr(got, name) - want) / scale
        if not error <= tolerance:  # also catches NaN
            return (
                f"{name} checksum off by {error:.2e} of the gradient norm (a partial round, "
                "or a part a reducer dropped or clipped)"
            )
    longest = sum(p.weight * p.norm for p in parts) / total_weight
    if not got.norm <= longest * (1 + tolerance) + tolerance * scale:
        return f"result norm {got.norm:.3g} over the members' mean norm {longest:.3g}"
    return None


def params_digest(flat_params: torch.Tensor, signs: torch.Tensor) -> tuple[float, float]:
    """A ±1 projection of the parameters (fixed signs) and their norm, in float64."""
    values = flat_params.detach().double()
    return float((values * signs).sum().item()), float(values.norm().item())


def replicas_diverged(gathered: dict[Any, Any], tolerance: float) -> bool:
    """Did the group's members start this step from different parameters? Every member sees
    the same gathered data, so all of them reach the same answer."""
    digests = []
    for data in gathered.values():
        try:
            digests.append(Checksums.from_gather(data))
        except WireError:
            continue  # check_round refused the round already
    if len(digests) < 2:
        return False
    values = [d.params for d in digests]
    scale = max(d.params_norm for d in digests) + 1e-12
    return (max(values) - min(values)) / scale > tolerance


def median_claimed_norm(gathered: Sequence[bytes], serializer: Any) -> float:
    """The median of the gradient norms a round's members claim in their gathered metadata
    (hivemind's (bandwidth, mode, our bytes), each serialized): the liars among them cannot
    move it far. A reducer's scale below which a part's spread or norm is not an outlier."""
    norms = []
    for data in gathered:
        with contextlib.suppress(Exception):  # WireError, or bytes that are not ours
            _bandwidth, _mode, user_bytes = serializer.loads(data)
            norms.append(Checksums.from_gather(serializer.loads(user_bytes)).norm)
    return statistics.median(norms) if norms else 0.0
