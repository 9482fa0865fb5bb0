"""What `p2ptrain local` says while its swarm has trained no step yet.

Each `join` node prints what it waits for on its stdout ("waiting for the first plan's
measurements: 2 of 6 links still missing": control/run_watch.py), which `local` keeps in the
node's log. Until the first step, `local` repeats the newest such line on its own stderr as it
changes, with the time since start: the terminal stayed silent for the 12-20 s a swarm of four
takes to measure its links and plan. Without a reason yet (nodes still starting), a line every
QUIET_NOTE_S says what the start is waiting for in general. Stdlib only.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

from p2ptrain.harness.local_progress import short_id
from p2ptrain.records import Plan

QUIET_NOTE_S = 20.0  # without a node's reason: a generic line this often
MIN_GAP_S = 2.0  # reasons that change faster are said at this pace (their newest)
_PREFIXES = ("waiting for ", "still waiting")
_PEER_ID = re.compile(
    r"\b12D3KooW[1-9A-HJ-NP-Za-km-z]{38,46}\b"
)  # shown as …LAST6, as `local` does


class StartNotes:
    """Follows the nodes' logs (`peer-I.log` in the work directory) for their waiting lines."""

    def __init__(self, logs: list[Path], started_s: float) -> None:
        self.logs = logs
        self.offsets = [0] * len(logs)
        self.started_s = started_s
        self.reason = ""  # the newest reason read
        self.said = ""
        self.said_at = started_s

    def tick(self, plan: Plan | None, now: float | None = None) -> None:
        """Read the logs' new lines; say the newest reason if it changed (at most every
        MIN_GAP_S), else the generic line every QUIET_NOTE_S."""
        now = time.monotonic() if now is None else now
        for i, path in enumerate(self.logs):
            for line in self._new_lines(i, path):
                if line.startswith(_PREFIXES) and not line.startswith("waiting for nothing"):
                    self.reason = _PEER_ID.sub(lambda m: short_id(m.group()), line)
        waited_s = now - self.started_s
        if self.reason and self.reason != self.said and now - self.said_at >= MIN_GAP_S:
            self._say(f"{self.reason} ({waited_s:.0f} s)", now)
            self.said = self.reason
        elif now - self.said_at >= QUIET_NOTE_S:
            self._say(f"waiting {waited_s:.0f} s for {_generic(plan)}", now)

    def _say(self, line: str, now: float) -> None:
        self.said_at = now
        print(line, file=sys.stderr, flush=True)

    def _new_lines(self, index: int, path: Path) -> list[str]:
        try:
            with open(path, "rb") as f:
                f.seek(self.offsets[index])
                data = f.read(1 << 20)
        except FileNotFoundError:
            return []
        complete = data[: data.rfind(b"\n") + 1]
        self.offsets[index] += len(complete)
        return complete.decode(errors="replace").splitlines()


def _generic(plan: Plan | None) -> str:
    if plan is None:
        return "the first plan (the nodes join, measure their links and elect a planner)"
    return "the first step (the placed peers connect, agree on a start and fetch states)"
