"""What a server builds for a request, kept for a second: sync (control/sync.py) and plan pulls
(control/plan_pull.py) answer strangers too, and only the streams they hold at once are capped
(net/rpc.InboundLimits), not how often they ask. Each `{"cursor": 0}` made a node sort and
decode every envelope it held and sign fresh copies of its own messages (a planner's: its whole
plan, up to 1 MiB, ~17 ms at 700 kB); built at most once per SERVE_CACHE_S for the same key, a
repeated request costs a lookup, as the status document's pages do (control/status.StatusPages).
Honest askers lose nothing: an answer is at most a second old, and a key that names what the
answer depends on (a new plan, a new term) is built afresh at once.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

SERVE_CACHE_S = 1.0  # as the status document's (control/status.py: STATUS_CACHE_S)

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Recent(Generic[K, V]):
    """`build(key)`, reused for SERVE_CACHE_S after it was built; at most `size` keys are kept
    (the one built first is dropped first), so requests that vary cost memory for `size`."""

    def __init__(
        self,
        build: Callable[[K], V],
        size: int,
        fresh_s: float = SERVE_CACHE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._build = build
        self._size = size
        self.fresh_s = fresh_s
        self._clock = clock
        self._built: OrderedDict[K, tuple[float, V]] = OrderedDict()
        self.num_built = 0  # tests read it

    def get(self, key: K) -> V:
        now = self._clock()
        held = self._built.get(key)
        if held is not None and now - held[0] < self.fresh_s:
            return held[1]
        value = self._build(key)
        self.num_built += 1
        self._built.pop(key, None)
        self._built[key] = (now, value)
        while len(self._built) > self._size:
            self._built.popitem(last=False)
        return value
