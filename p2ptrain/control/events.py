"""Changes the control process's tasks wait for, instead of polling shared state on a timer.

The view stays pure: it neither knows trio nor calls anyone. Whoever changes what a task acts on
says so here (intake, for what arrived from other peers; the election, for our own claims and
plans; NodeState.publish_soon, for what is due to publish), and the tasks that act on it (the
worker link, the election, the publisher) wake at once. A task waits for a change past the
count it last saw, so a change made while it was busy elsewhere is never missed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Literal

import trio

# plan: the view holds a new plan; run: a new run spec; members: who may be planned or plan
# (a new member, a changed record, a health verdict, a claim); publish: something is due to be
# published sooner than its interval (NodeState.publish_soon)
Change = Literal["plan", "run", "members", "publish"]


class Changes:
    """A counter per kind of change and the tasks waiting for one."""

    def __init__(self) -> None:
        self._counts: dict[Change, int] = {}
        self._wakeup = trio.Event()

    def count(self, *kinds: Change) -> int:
        """How many changes of these kinds so far: what a waiter passes as `seen`."""
        return sum(self._counts.get(kind, 0) for kind in kinds)

    def notify(self, kind: Change) -> None:
        """`kind` changed: wake every task waiting for it (callable from plain code)."""
        self._counts[kind] = self._counts.get(kind, 0) + 1
        self._wakeup.set()
        self._wakeup = trio.Event()

    async def wait(self, kinds: Iterable[Change], seen: int, timeout_s: float = math.inf) -> int:
        """Until the count of `kinds` passes `seen`, or for `timeout_s` at most (relative: the
        caller's clock need not be trio's); the count now (pass it as `seen` next time)."""
        kinds = tuple(kinds)
        with trio.move_on_after(max(0.0, timeout_s)):
            while self.count(*kinds) == seen:
                await self._wakeup.wait()
        return self.count(*kinds)
