"""Data-parallel gradient averaging for one stage, with every round verified.

hivemind's DecentralizedAverager reports a round as a success even when a groupmate died mid-way
and part of the tensor was left un-averaged (libs-measured.md §2.4). So each peer gathers, with its
gradient, two linear checksums of it (the plain sum and a ±1 random projection seeded by the step)
plus its weight and norm. A correct weighted average must reproduce the weighted average of the
checksums; a half-averaged one almost surely does not. A failed or partial round is retried once
with whoever is still there; if that fails too, the peer keeps its own (local) gradient: never a
silently half-averaged one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
from hivemind import DHT
from hivemind.averaging import DecentralizedAverager
from hivemind.compression import CompressionBase, Float16Compression, NoCompression

log = logging.getLogger(__name__)

RETRY_TIMEOUT_S = 5.0
# |checksum error| allowed, relative to the largest gathered gradient norm
EXACT_TOLERANCE = 1e-4
COMPRESSED_TOLERANCE = 3e-2


@dataclass(frozen=True)
class Checksums:
    step: int
    weight: float
    total: float
    projection: float
    norm: float

    def as_gather(self) -> dict[str, Any]:
        return {"step": self.step, "weight": self.weight, "total": self.total,
                "projection": self.projection, "norm": self.norm}  # fmt: skip


@dataclass(frozen=True)
class Outcome:
    """How a step's gradient was combined: 'averaged' over group_size peers, or 'local'."""

    kind: str
    group_size: int
    detail: str = ""


def checksums(flat: torch.Tensor, step: int, weight: float) -> Checksums:
    """Two linear checksums of a flat gradient, in float64."""
    values = flat.detach().double()
    generator = torch.Generator().manual_seed(1_000_003 * step + 17)
    signs = (
        torch.randint(0, 2, values.shape, generator=generator, dtype=torch.int8).double() * 2 - 1
    )
    return Checksums(step, float(weight), values.sum().item(), (values * signs).sum().item(),
                     values.norm().item())  # fmt: skip


def check_round(
    result: torch.Tensor, mine: Checksums, gathered: dict[Any, Any], tolerance: float
) -> str | None:
    """Why the averaged `result` is not the weighted mean of the gathered gradients, or None."""
    parts: list[Checksums] = []
    for peer, data in gathered.items():
        try:
            parts.append(Checksums(**data))
        except TypeError:
            return f"malformed checksums from {peer}"
    if len(parts) < 2:
        return "no groupmates"
    if any(p.step != mine.step for p in parts):
        return f"groupmates at steps {sorted(p.step for p in parts)}, not {mine.step}"
    if any(not p.weight > 0 for p in parts):
        return "a groupmate sent a non-positive weight"
    total_weight = sum(p.weight for p in parts)
    got = checksums(result, mine.step, mine.weight)
    scale = max(p.norm for p in parts) + 1e-12
    for name in ("total", "projection"):
        want = sum(p.weight * getattr(p, name) for p in parts) / total_weight
        error = abs(getattr(got, name) - want) / scale
        if not error <= tolerance:  # also catches NaN
            return f"{name} checksum off by {error:.2e} of the gradient norm (partial round?)"
    return None


class StageAverager:
    """Averages one stage's flat gradient with the other replicas of that stage."""

    def __init__(
        self,
        dht: DHT,
        num_params: int,
        prefix: str,
        num_replicas: int,
        compression: str,
        timeout_s: float,
    ) -> None:
        self._buffer = torch.zeros(num_params)
        self.timeout_s = timeout_s
        self.tolerance = EXACT_TOLERANCE if compression == "none" else COMPRESSED_TOLERANCE
        # bf16 activations still average in fp16: hivemind has no bf16 codec, fp16 is closer anyway
        codec: CompressionBase = NoCompression() if compression == "none" else Float16Compression()
        self._averager = DecentralizedAverager(
            [self._buffer], dht, start=True, prefix=prefix,
            target_group_size=num_replicas, min_group_size=2,
            min_matchmaking_time=1.0, request_timeout=0.5,
            compression=codec, sender_timeout=5.0, reducer_timeout=10.0, allreduce_timeout=30.0,
        )  # fmt: skip

    def average(
        self, flat_grad: torch.Tensor, weight: float, step: int
    ) -> tuple[torch.Tensor, Outcome]:
        """The verified weighted average of `flat_grad` over the group, or flat_grad itself."""
        mine = checksums(flat_grad, step, weight)
        problem = ""
        for attempt, timeout_s in enumerate((self.timeout_s, min(self.timeout_s, RETRY_TIMEOUT_S))):
            with self._averager.get_tensors() as (buffer,):
                buffer.copy_(flat_grad)
            try:
                gathered = self._averager.step(
                    gather=mine.as_gather(), weight=weight, timeout=timeout_s
                )
            except Exception as exc:  # hivemind raises a few kinds on a broken round
                gathered, problem = None, f"averaging raised {exc!r}"
            if gathered is None:
                problem = problem or "no group formed"
            else:
                with self._averager.get_tensors() as (buffer,):
                    result = buffer.clone()
                problem = check_round(result, mine, gathered, self.tolerance) or ""
                if not problem:
                    return result, Outcome("averaged", len(gathered))
            log.warning("step %d averaging attempt %d failed: %s", step, attempt + 1, problem)
        return flat_grad, Outcome("local", 1, problem)

    def shutdown(self) -> None:
        self._averager.shutdown()
