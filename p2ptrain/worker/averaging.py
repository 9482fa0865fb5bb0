"""Data-parallel gradient averaging for one stage, with every round verified (worker/checks.py).

A failed or partial round is retried once with whoever is still there; if that fails too, the
peer keeps its own (local) gradient: never a silently half-averaged one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from hivemind import DHT
from hivemind.averaging import DecentralizedAverager
from hivemind.compression import CompressionBase, Float16Compression, NoCompression

from p2ptrain.worker.checks import COMPRESSED_TOLERANCE, EXACT_TOLERANCE, check_round, checksums

log = logging.getLogger(__name__)

RETRY_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Outcome:
    """How a step's gradient was combined: 'averaged' over group_size peers, or 'local'."""

    kind: str
    group_size: int
    detail: str = ""


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
