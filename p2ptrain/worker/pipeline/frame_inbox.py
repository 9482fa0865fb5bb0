"""Frames a worker accepted, waiting for its trainer: filed under the plan they were sent for.

The transport's stream handler files every frame it accepted; the trainer takes the one it needs,
by (kind, step, micro-batch) of its own plan (term, epoch). A frame sent under another plan is
never handed out. After a re-plan the swarm re-runs steps from the agreed start step, so a frame
that a neighbour of the old plan sent for step s (a previous stage runs a step ahead, and a
session can still be answering frames when it ends) would otherwise stand in for the new
neighbour's frame of step s: another stage's outputs as our input, and a gradient sent back for
a step the new neighbour has not even started (it refuses it, and that replica's pipeline stalls).

Pure (torch and threading only), so the rules are unit-testable without a network.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import torch

from p2ptrain.worker.pipeline.frames import FrameHeader, PeerLost, Stopped

log = logging.getLogger(__name__)

PlanKey = tuple[int, int]  # (term, epoch)
Key = tuple[int, int, str, int, int]  # (term, epoch, kind, step, micro)
POLL_S = 0.2  # how often a waiting trainer looks at should_stop
WAIT_NOTE_S = 15.0  # a trainer waiting this long for a frame says so, and again as often


class FrameInbox:
    """Accepted frames by (term, epoch, kind, step, micro); the trainer blocks in `take`."""

    def __init__(self) -> None:
        self._frames: dict[Key, torch.Tensor] = {}
        self._arrived = threading.Condition()

    @staticmethod
    def key_of(header: FrameHeader) -> Key:
        return (header.term, header.epoch, header.kind, header.step, header.micro)

    def holds(self, header: FrameHeader) -> bool:
        """Is a copy of this frame here already (filed, not yet taken)?"""
        with self._arrived:
            return self.key_of(header) in self._frames

    def put(self, header: FrameHeader, tensor: torch.Tensor) -> None:
        """File an accepted frame. A retried copy of one already here (its first answer got
        lost) leaves the first in place."""
        with self._arrived:
            self._frames.setdefault(self.key_of(header), tensor)
            self._arrived.notify_all()

    def take(
        self,
        plan: PlanKey,
        kind: str,
        step: int,
        micro: int,
        timeout_s: float,
        should_stop: Callable[[], bool],
        sender: str = "",
    ) -> torch.Tensor:
        """Block until frame (kind, step, micro) sent under `plan` is here, and hand it over;
        PeerLost after timeout_s, Stopped as soon as should_stop() says so. A wait past
        WAIT_NOTE_S is logged (what, from whom, until when), and again every WAIT_NOTE_S."""
        key = (*plan, kind, step, micro)
        started = time.monotonic()
        deadline, note_at = started + timeout_s, started + WAIT_NOTE_S
        source = f" from {sender}" if sender else ""
        with self._arrived:
            while key not in self._frames:
                if should_stop():
                    raise Stopped()
                now = time.monotonic()
                if now >= deadline:
                    raise PeerLost(
                        f"no {kind} for step {step} micro-batch {micro}{source} in "
                        f"{timeout_s:.0f} s"
                    )
                if now >= note_at:
                    note_at += WAIT_NOTE_S
                    log.info(
                        "step %d: waiting %.0f s so far for %s %d%s (gives up at %.0f s)",
                        step,
                        now - started,
                        kind,
                        micro,
                        source,
                        timeout_s,
                    )
                self._arrived.wait(min(deadline - now, POLL_S))
            return self._frames.pop(key)

    def forget(self, plan: PlanKey, before_step: int) -> None:
        """Drop every frame of another plan, and this plan's frames of steps before
        `before_step` (late duplicates from a slow sender)."""
        with self._arrived:
            for key in [k for k in self._frames if k[:2] != plan or k[3] < before_step]:
                del self._frames[key]

    def __len__(self) -> int:
        with self._arrived:
            return len(self._frames)
