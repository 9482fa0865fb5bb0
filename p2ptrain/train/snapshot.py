"""A stage's state at one step boundary, copied to host memory (train/checkpoint.py writes it).

A worker in a multi-stage pipeline (or a lockstep replica) takes one every step: the state one
step back, which the session's end saves beside the current one (worker/resume/start_step.py).
That copy is three times the stage's weights (weights and AdamW's two moments). Made afresh each
step, a multi-GB stage allocates and faults in its whole copy now and then (steps slower than the
others), so the step's copy reuses the buffers of the one before (`reuse`): the worker's mean
`update_s` 13-25% lower at 50M-101M parameters on a CPU, medians within noise
(docs/benchmarks.md). On a GPU those buffers are pinned and filled without blocking the step;
the copy is waited for when the snapshot is read (`settled`) or its buffers are reused (the next
step's copy).
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from p2ptrain.train.model import Stage


@dataclass(frozen=True)
class StageSnapshot:
    """A stage's state at one step boundary, copied out of the live model and optimizer (and
    under diloco the outer state, worker/averaging/outer_rounds.py's "outer/..." tensors)."""

    step: int
    model_state: dict[str, Any]
    optimizer_state: dict[str, Any]
    outer_state: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)
    # a GPU's copies into pinned buffers run on its stream: done once this event is
    copied: torch.cuda.Event | None = None

    @classmethod
    def take(
        cls,
        model: Stage,
        optimizer: torch.optim.Optimizer,
        step: int,
        outer_state: dict[str, torch.Tensor] | None = None,
        reuse: StageSnapshot | None = None,
        lasting: bool = False,
    ) -> StageSnapshot:
        """Copies in host memory: on a GPU the snapshot would otherwise double the device memory
        of the weights and AdamW state (the planner's memory estimate counts them once).
        `reuse`: a snapshot nobody reads any more; its host tensors are overwritten where the
        new state has a tensor of the same shape and type, and it must not be read after this.
        `lasting`: the buffers will be reused step after step (pinned, if the stage is on a GPU)."""
        if reuse is not None:
            reuse.settled()  # its buffers may still be filling from the step before
        copier = _HostCopier(pinned=lasting)
        old = reuse or cls(step, {}, {})
        snapshot = cls(
            step,
            copier.copy(model.state_dict(), old.model_state),
            copier.copy(optimizer.state_dict(), old.optimizer_state),
            copier.copy(outer_state or {}, old.outer_state),
            copier.done(),
        )
        return snapshot

    def settled(self) -> StageSnapshot:
        """This snapshot, once its tensors hold their values (a GPU's copies have landed)."""
        if self.copied is not None:
            self.copied.synchronize()
        return self


class _HostCopier:
    """Copies nested state (dicts, lists, tuples of tensors and plain values) to the CPU, into an
    older copy's tensors where they fit. `pinned`: a GPU tensor's new buffer is pinned and its
    copy asynchronous (a buffer that lives for the session's steps: pinning costs more than a
    copy, so one-off snapshots are made pageable and copied at once)."""

    def __init__(self, pinned: bool) -> None:
        self.pinned = pinned
        self.stream_of: torch.device | None = None  # the GPU an asynchronous copy was made on

    def copy(self, value: Any, old: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return self._tensor(value.detach(), old)
        if isinstance(value, dict):
            keyed = old if isinstance(old, dict) else {}
            return {key: self.copy(item, keyed.get(key)) for key, item in value.items()}
        if isinstance(value, list | tuple):
            same = isinstance(old, list | tuple) and len(old) == len(value)
            items = [self.copy(item, old[i] if same else None) for i, item in enumerate(value)]
            return type(value)(items)
        return copy.deepcopy(value)

    def _tensor(self, value: torch.Tensor, old: Any) -> torch.Tensor:
        on_gpu = value.device.type == "cuda"
        fits = (
            isinstance(old, torch.Tensor)
            and old.shape == value.shape
            and old.dtype == value.dtype
            and old.device.type == "cpu"
            and (not (on_gpu and self.pinned) or old.is_pinned())
        )
        if fits:
            target = old
        else:
            pin = on_gpu and self.pinned
            target = torch.empty(value.shape, dtype=value.dtype, pin_memory=pin)
        asynchronous = on_gpu and target.is_pinned()
        target.copy_(value, non_blocking=asynchronous)
        if asynchronous:
            self.stream_of = value.device
        return target

    def done(self) -> torch.cuda.Event | None:
        """An event after the asynchronous copies on the current stream, if any were made."""
        if self.stream_of is None:
            return None
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.stream_of))
        return event
