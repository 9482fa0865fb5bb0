"""What a scheduler search may spend and has spent (evaluations, a wall-clock cap): one budget
that every search of a planning call shares."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass


@dataclass
class SearchStats:
    """Work done by a search, and its budget: every plan whose cost was computed counts as one
    evaluation. A search stops once `max_evaluations` are spent (the same inputs stop at the same
    point, whatever the machine's load) or at `deadline` (time.perf_counter), a wall-clock cap."""

    evaluations: int = 0
    max_evaluations: int | None = None
    deadline: float = math.inf

    def spent(self) -> bool:
        """Is the budget used up (either one)?"""
        over = self.max_evaluations is not None and self.evaluations >= self.max_evaluations
        return over or time.perf_counter() >= self.deadline

    def stop_reason(self) -> str:
        """Why a search that ran out of budget stopped: "evaluation_budget" or "time_budget"."""
        over = self.max_evaluations is not None and self.evaluations >= self.max_evaluations
        return "evaluation_budget" if over else "time_budget"
