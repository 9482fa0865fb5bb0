"""The robust all-reduce's reducer (worker/averaging/robust_allreduce.py runs it): every
sender's copy of a part, combined with worker/averaging/robust.py's rule.

`RobustPartReducer` holds every sender's copy of the part being reduced and combines them with
`robust_mean` (planned weights, finite check, centred clip, drift bound) instead of adding each
as it comes with the weight its sender claims. It keeps every part's combination and whose
copies are in it: worker/averaging/kept_reductions.py serves them again to a sender whose reply
stream broke.

hivemind at module level: imported only in the averager (worker/averaging/planned_group.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import torch
from hivemind.averaging.partition import AllreduceException, BannedException, TensorPartReducer

from p2ptrain.worker.averaging.robust import robust_mean

# the name it logged under before the split: operators grep it
log = logging.getLogger("p2ptrain.worker.averaging.robust_allreduce")


class RobustPartReducer(TensorPartReducer):
    """A TensorPartReducer that waits for every sender's copy of a part, then combines them.

    weights: each sender's planned weight (by sender index); own: our sender index, if we send;
    drift_bound: set in state rounds; floor_per_element: the parts' scale floor is this times
    the square root of a part's size; names: how the log calls each sender; token_rows: for
    each part, its spans that are rows of the token embedding or the head."""

    def __init__(
        self,
        part_shapes: Sequence[torch.Size],
        num_senders: int,
        *,
        weights: Sequence[float],
        own: int | None,
        drift_bound: float | None,
        floor_per_element: float,
        names: Sequence[str],
        token_rows: Sequence[Sequence[tuple[int, int]]] = (),
    ) -> None:
        assert len(weights) == len(names) == num_senders
        assert not token_rows or len(token_rows) == len(part_shapes)
        self._token_rows = tuple(token_rows) or tuple(() for _ in part_shapes)
        self._weights, self._own, self._drift_bound = tuple(weights), own, drift_bound
        self._floor_per_element, self._names = floor_per_element, tuple(names)
        # the current part's copies by sender; None: a copy left out (wrong shape or dtype)
        self._held: dict[int, torch.Tensor | None] = {}
        self.notes: dict[str, str] = {}  # sender -> what was done to its parts (first reason)
        # every part's combination and the senders whose copy is in it, kept for a sender whose
        # reply stream broke (see robust_allreduce.py's doc); `done` is set once every part is combined
        # or the reducer is finalized
        self.outputs: list[torch.Tensor] = []
        self.contributors: list[frozenset[int]] = []
        self.done = asyncio.Event()
        super().__init__(part_shapes, num_senders)

    def finalize(self) -> None:
        super().finalize()
        self.done.set()

    def averaged_for(self, name: str) -> list[torch.Tensor] | None:
        """Every part's combination if all are done and sender `name`'s copy is in each of them
        (else the sender would take an average it is not part of), else None."""
        if name not in self._names or len(self.outputs) != self.num_parts:
            return None
        sender = self._names.index(name)
        return self.outputs if all(sender in c for c in self.contributors) else None

    def reset_accumulators(self) -> None:
        self._held = {}
        super().reset_accumulators()

    async def accumulate_part(
        self, sender_index: int, part_index: int, tensor_part: torch.Tensor, weight: float = 1.0
    ) -> torch.Tensor:
        """Hold this sender's copy (its own `weight` is ignored), wait for the others' and the
        combination, and return it. A copy not of the part's shape, or not floating point, is
        left out of the combination (as a non-finite one is): holding it failed the whole
        combination, and every member waited for the part until its timeout."""
        assert 0 <= sender_index < self.num_senders, "invalid sender index"
        assert 0 <= part_index < self.num_parts, "invalid part index"
        self.num_parts_received[sender_index] += 1
        while part_index > self.current_part_index:  # earlier parts are still being reduced
            await asyncio.wait(
                {self.current_part_future, asyncio.create_task(self.finished.wait())},
                return_when=asyncio.FIRST_COMPLETED,
            )
            if self.finished.is_set():
                raise AllreduceException("attempted to aggregate part in a finalized reducer")
        if self.sender_failed_after[sender_index] != float("inf"):
            raise BannedException(f"sender {sender_index} was banned in background")
        if part_index != self.current_part_index or sender_index in self._held:
            raise AllreduceException(f"sender {sender_index} sent part {part_index} out of turn")
        current_part_future = self.current_part_future
        problem = _part_problem(tensor_part, self.part_shapes[part_index])
        if problem is not None:
            self._note(sender_index, f"part dropped: {problem}")
        self._held[sender_index] = None if problem is not None else tensor_part
        self.current_part_accumulated_from += 1
        self.check_current_part_finished()
        result: torch.Tensor = await current_part_future
        return result

    def check_current_part_finished(self) -> None:
        assert self.current_part_accumulated_from <= self.num_current_senders
        if self.current_part_accumulated_from == self.num_current_senders:
            self.current_part_future.set_result(self._combine())
            self.reset_accumulators()

    def _combine(self) -> torch.Tensor:
        held = {i: part for i, part in self._held.items() if part is not None}
        senders = sorted(held)
        if not senders:  # every sender failed: hivemind's round fails on its own
            return self._kept(torch.zeros(self.part_shapes[self.current_part_index]), ())
        parts = [held[i] for i in senders]
        own = senders.index(self._own) if self._own in senders else None
        numel = parts[0].numel()
        combined = robust_mean(
            parts,
            [self._weights[i] for i in senders],
            own,
            self._drift_bound,
            floor=self._floor_per_element * numel**0.5,
            token_rows=self._token_rows[self.current_part_index],
        )
        for position, why in combined.dropped.items():
            self._note(senders[position], f"part dropped: {why}")
        for position in combined.clipped:
            self._note(senders[position], "part clipped toward the others'")
        kept = [
            sender for position, sender in enumerate(senders) if position not in combined.dropped
        ]
        return self._kept(combined.value, kept)

    def _kept(self, value: torch.Tensor, senders: Sequence[int]) -> torch.Tensor:
        self.outputs.append(value)
        self.contributors.append(frozenset(senders))
        if len(self.outputs) == self.num_parts:
            self.done.set()
        return value

    def _note(self, sender: int, what: str) -> None:
        name = self._names[sender]
        if name not in self.notes:  # once per sender and round: the log stays readable
            self.notes[name] = what
            log.warning("reducer part %d: %s's %s", self.current_part_index, name, what)


def _part_problem(part: torch.Tensor, shape: torch.Size) -> str | None:
    """Why a sender's copy of a part cannot be combined with the others', or None."""
    if part.shape != shape:
        return f"shape {tuple(part.shape)}, not {tuple(shape)}"
    if not part.is_floating_point():
        return f"dtype {part.dtype}"
    return None
