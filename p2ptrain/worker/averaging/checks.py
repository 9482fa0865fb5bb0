"""Checks for averaging rounds: is a result the weighted mean of what the group put in?

hivemind's DecentralizedAverager reports a round as a success even when a groupmate died mid-way
and part of the tensor was left un-averaged (measured with hivemind 1.1.12). So each peer
gathers, with its gradient, two linear checksums of it (the plain sum and a ±1 random projection
seeded by the step) plus its weight and norm, in one `RoundGather` record that also names the
round's kind (a step's gradient round, or a re-sync round of parameter-sized state). A correct
weighted average reproduces the weighted average of the checksums; a half-averaged one almost
surely does not. Pure torch, so it is unit-testable.

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
from typing import Annotated, Any

import torch

from p2ptrain.errors import WireError
from p2ptrain.records import fields as f
from p2ptrain.records.codec import Int, Nullable, Num, OneOf, Record

# |checksum error| allowed, relative to the low median of the gathered gradient norms
EXACT_TOLERANCE = 1e-4
COMPRESSED_TOLERANCE = 3e-2
SUM_CHUNK = 1 << 16  # values a float64 pass holds at once: 512 KiB, within a core's L2
MAX_WEIGHT = 1e9  # rows of a batch: far below this
# a claimed norm over this × the group's low median fails the round (replicas' gradients on
# near-equal slices of one batch differ in norm by tens of percent)
MAX_NORM_RATIO = 4.0
SIGNED = Num(-math.inf)  # any finite number


GRAD, STATE = "grad", "state"  # a step's gradient round; a re-sync round of parameter-sized state
ROUND_KINDS = (GRAD, STATE)
MAX_DRIFT_BOUND = 1e6  # × our part's norm: far above robust.py's bounds (1 and below)


@dataclass(frozen=True)
class Checksums(Record, name="round checksums"):
    """What a member claims of the tensor it put into a round."""

    step: Annotated[int, Int(0, f.MAX_INT)]
    weight: Annotated[float, Num(1e-12, MAX_WEIGHT)]
    total: Annotated[float, SIGNED]
    projection: Annotated[float, SIGNED]
    norm: float
    # a digest of the stage's parameters before this step's update (replicas must agree on it)
    params: Annotated[float, SIGNED] = 0.0
    params_norm: float = 0.0


@dataclass(frozen=True)
class RoundGather(Record, name="round metadata"):
    """What a member gathers with a hivemind round (`DecentralizedAverager.step(gather=...)`):
    which round it is (its kind and step: both must match across the group), its checksums,
    and in a state round the drift bound its own reducer applies (worker/averaging/robust.py).
    Decoded from a groupmate: a valid record or WireError."""

    kind: Annotated[str, OneOf(ROUND_KINDS)]
    checksums: Checksums
    drift_bound: Annotated[float | None, Nullable(Num(0.0, MAX_DRIFT_BOUND))] = None

    def wire_problem(self) -> str | None:
        if (self.kind == STATE) != (self.drift_bound is not None):
            return "a drift_bound is set in state rounds, and only there"
        return None

    @property
    def round_key(self) -> str:
        """The round's name (its kind and step), the same on every member of its group."""
        return f"{self.kind}/{self.checksums.step}"

    @classmethod
    def from_hivemind(cls, data: object, serializer: Any) -> RoundGather:
        """A member's gathered bytes as hivemind passes them on (its serialized (bandwidth,
        mode, our bytes), our bytes serialized too): a valid record or WireError."""
        try:
            _bandwidth, _mode, user_bytes = serializer.loads(data)
            user = serializer.loads(user_bytes)
        except Exception as exc:  # whatever the codec raises on bytes that are not ours
            problem = f"not hivemind's gathered bytes ({type(exc).__name__})"
            raise f.malformed(cls.RECORD, problem) from None
        return cls.from_dict(user)


def checksums(
    flat: torch.Tensor, step: int, weight: float, signs: torch.Tensor | None = None
) -> Checksums:
    """Two linear checksums of a flat gradient, in float64. `signs`: the projection's ±1
    vector, the same on every member of the round (default: seeded by the step). An outer
    round passes its stage's fixed_signs: drawing a stage-sized sign vector is most of the cost
    (7.6 of 16.6 ms at 1.78 M values), on a worker's small CPU quota."""
    values = flat.detach().reshape(-1)
    signed = step_signs(values.numel(), step) if signs is None else signs.reshape(-1)
    total, projection, squares = _float64_sums(values, signed)
    return Checksums(step, float(weight), total, projection, math.sqrt(squares))


def _float64_sums(values: torch.Tensor, signs: torch.Tensor) -> tuple[float, float, float]:
    """The sum, the ±1 projection and the sum of squares of `values`, in float64, a chunk at a
    time: no stage-sized float64 copy to stream through the cache the training thread shares."""
    total = projection = squares = 0.0
    for start in range(0, values.numel(), SUM_CHUNK):
        chunk = values[start : start + SUM_CHUNK].double()
        total += chunk.sum().item()
        projection += torch.dot(chunk, signs[start : start + SUM_CHUNK].double()).item()
        squares += torch.dot(chunk, chunk).item()
    return total, projection, squares


def step_signs(numel: int, step: int) -> torch.Tensor:
    """The ±1 (int8) projection a step's checksums use by default (seeded by the step)."""
    return _seeded_signs(numel, 1_000_003 * step + 17)


def _seeded_signs(numel: int, seed: int) -> torch.Tensor:
    bits = torch.randint(
        0, 2, (numel,), generator=torch.Generator().manual_seed(seed), dtype=torch.int8
    )
    return bits.mul_(2).sub_(1)  # int8: an eighth of float64's bytes to stream


def check_round(
    result: torch.Tensor,
    mine: Checksums,
    gathered: dict[Any, Any],
    tolerance: float,
    weights: Mapping[str, float],
    kind: str = GRAD,
    signs: torch.Tensor | None = None,
) -> str | None:
    """Why the averaged `result` is not the weighted mean of the gathered tensors (each
    member's RoundGather as a dict), or None. `mine`: our checksums of a round of `kind`;
    `weights`: the plan's weight of every member (peer id in base58); `signs`: the
    projection the claims were made with (checksums())."""
    parts, problem = _checked_claims(mine, gathered, weights, kind)
    if problem is not None:
        return problem
    median = low_median([p.norm for p in parts])
    scale = median + 1e-12
    total_weight = sum(p.weight for p in parts)
    got = checksums(result, mine.step, mine.weight, signs)
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


def claims_problem(
    mine: Checksums, gathered: dict[Any, Any], weights: Mapping[str, float], kind: str = GRAD
) -> str | None:
    """Why the members' gathered claims alone fail a round, whatever its result: a record that
    does not decode, a round of another kind, a member or weight the plan does not give, fewer
    than two members, members at other steps, or a claimed norm over MAX_NORM_RATIO x the low
    median; None if the claims pass. The same claims fail the same way again (an attempt that
    gathers them once more cannot pass)."""
    return _checked_claims(mine, gathered, weights, kind)[1]


def settled_by_claims(
    mine: Checksums, gathered: dict[Any, Any], weights: Mapping[str, float], kind: str
) -> bool:
    """Did the claims of the whole planned group, every member at our step, fail the round?
    Then a retry would gather the same claims from the same members and fail alike: every
    member sees them and gives the step up at once (a pair's honest gradients whose norms differ
    over MAX_NORM_RATIO spent a second attempt of 3-6 s, both pipelines waiting: bench
    scaleout, 2026-12-03). A partial group, or one at other steps, is still retried."""
    if {str(peer) for peer in gathered} != set(weights):
        return False
    parts, problem = _checked_claims(mine, gathered, weights, kind)
    return problem is not None and all(part.step == mine.step for part in parts)


def _checked_claims(
    mine: Checksums, gathered: dict[Any, Any], weights: Mapping[str, float], kind: str
) -> tuple[list[Checksums], str | None]:
    """Every member's checksums, and claims_problem's answer."""
    parts: list[Checksums] = []
    for peer, data in gathered.items():
        try:
            gather = RoundGather.from_dict(data)
        except WireError as exc:
            return parts, f"bad checksums from {peer}: {exc}"
        if gather.kind != kind:
            return parts, f"{peer} gathered a {gather.kind} round, not a {kind} round"
        part = gather.checksums
        planned = weights.get(str(peer))
        if planned is None:
            return parts, f"{peer} is not in the plan's group"
        if not math.isclose(part.weight, planned, rel_tol=1e-9):
            return parts, f"{peer} claims weight {part.weight:g}, the plan gives it {planned:g}"
        parts.append(part)
    if len(parts) < 2:
        return parts, "no groupmates"
    if any(p.step != mine.step for p in parts):
        return parts, f"groupmates at steps {sorted(p.step for p in parts)}, not {mine.step}"
    norms = [p.norm for p in parts]
    if max(norms) > MAX_NORM_RATIO * low_median(norms):
        return parts, (
            f"a claimed gradient norm {max(norms):.3g} is over {MAX_NORM_RATIO:g}x the median"
        )
    return parts, None


def fixed_signs(numel: int) -> torch.Tensor:
    """The ±1 (int8) signs of params_digest (seeded alike on every member)."""
    return _seeded_signs(numel, 7)


def params_digest(flat_params: torch.Tensor, signs: torch.Tensor) -> tuple[float, float]:
    """A ±1 projection of the parameters (fixed signs) and their norm, in float64."""
    values = flat_params.detach().reshape(-1)
    _total, projection, squares = _float64_sums(values, signs.reshape(-1))
    return projection, math.sqrt(squares)


def replicas_diverged(gathered: dict[Any, Any], tolerance: float) -> bool:
    """Did the group's members start this step from different parameters: do their parameter
    digests, or their parameter norms, spread by more than `tolerance` × the low median of the
    claimed norms? Every member sees the same gathered data, so all of them reach the same
    answer (our own norm as the scale would not: a member alone in a re-sync waits it out).

    The scale is a median, never the largest claim: a claimed norm of 1e300 made every spread
    look small, and replicas that a failed round had set apart were never re-synced. A claimed
    norm far from the others' is itself a spread (honest norms differ by less than the
    parameters do, |‖a‖ - ‖b‖| ≤ ‖a - b‖): a re-sync, as a false digest already forces, whose
    crafted state the drift bound refuses (worker/averaging/robust.py)."""
    digests = []
    for data in gathered.values():
        try:
            digests.append(RoundGather.from_dict(data).checksums)
        except WireError:
            continue  # check_round refused the round already
    if len(digests) < 2:
        return False
    values = [d.params for d in digests]
    norms = [d.params_norm for d in digests]
    scale = low_median(norms) + 1e-12
    spread = max(max(values) - min(values), max(norms) - min(norms))
    return not spread <= tolerance * scale  # an overflowing spread (inf) counts too


def low_median(values: Sequence[float]) -> float:
    """The lower of the middle two of `values` (of two, the smaller; 0 for none): one liar
    among 2 members cannot raise it, where the mean of the middle two moves with its claim."""
    ordered = sorted(values)
    return ordered[(len(ordered) - 1) // 2] if ordered else 0.0


def median_claimed_norm(gathered: Sequence[bytes], serializer: Any) -> float:
    """The median of the gradient norms a round's members claim in their gathered metadata
    (RoundGather.from_hivemind): a reducer's scale floor (worker/averaging/robust.py). Of two,
    their mean, not the smaller: honest pairs' parts differ by more than the pair bound where
    a part is mostly token rows (1.92 against 0.513 in a 2 x 2 fp16 run), and the floor is
    what keeps them; a liar's claim moves it, within check_round's 4x (security.md, "Not
    defended yet")."""
    norms = []
    for data in gathered:
        with contextlib.suppress(WireError):
            norms.append(RoundGather.from_hivemind(data, serializer).checksums.norm)
    return statistics.median(norms) if norms else 0.0


def is_later_round(key: str, than: str) -> bool:
    """Is gradient round `key` (RoundGather.round_key) past gradient round `than`? (State
    rounds are run by all members together and never compared.)"""
    kind, _, step = key.partition("/")
    than_kind, _, than_step = than.partition("/")
    if kind != GRAD or than_kind != GRAD:
        return False
    try:  # a groupmate's key: any text
        return int(step) > int(than_step) >= 0
    except ValueError:
        return False
