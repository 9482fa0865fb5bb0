"""Log lines for what a peer can make happen at will (a refused stream, dial or connection, a bad
request, a failed stream, a blamed throwaway author): the 1st of each kind, then every 100th
with the count so far, so a peer opening streams in a loop cannot flood the log. Used by
net/rpc.py, net/guard.py, net/dial_gate.py, net/accepting.py, worker/inbound.py,
traversal/relay.py and control/intake.py."""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

LOG_ONE_IN = 100


class SampledLog:
    """Counts events per kind and logs one line per LOG_ONE_IN of each. A kind is one of the
    caller's fixed words, never a peer's, so the counter stays as small as the code."""

    def __init__(self, logger: logging.Logger, level: int = logging.INFO) -> None:
        self.logger = logger
        self.level = level
        self.counts: Counter[str] = Counter()

    def event(self, kind: str, message: str, *args: Any) -> None:
        """Count one event of `kind`; log `message % args` with the count if it is the kind's
        1st, or a LOG_ONE_IN-th after it."""
        self.counts[kind] += 1
        count = self.counts[kind]
        if (count - 1) % LOG_ONE_IN == 0:
            self.logger.log(self.level, message + " (%d so far)", *args, count)
