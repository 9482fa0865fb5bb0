"""How long the first plan waits for what it should be made on (control/planning/readiness.py):
the measurements (addresses, links, timed stages, each trainer's word on its saved states) for at
most FIRST_PLAN_WAIT_S from their first gap, and, in a restarted run, the holders of saved states
no node present holds for at most the run's `resume_wait_s` from theirs (volunteers come back at
their own pace; a plan made without a holder starts its blocks from initial weights). A plan
made before either would restart every session when what it lacked arrives. Says what it waits
for in the log, once per change, and what it planned without.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from p2ptrain.records import RunSpec

log = logging.getLogger("p2ptrain.control.planning.plan_maker")

FIRST_PLAN_WAIT_S = 90.0  # 8 peers over 4 cities measured their 28 links' rates in 60-90 s


class FirstPlanWait:
    """One planner's wait for its first plan (a new term starts a new one)."""

    def __init__(self) -> None:
        self._since: dict[str, float] = {}  # "measurements", "holders" -> its first gap's time
        self._logged: list[str] = []
        self._expired: set[str] = set()

    def awaits(self, now: float, gaps: Sequence[str], holders: Sequence[str], run: RunSpec) -> bool:
        """Should the first plan wait, `gaps` missing of the measurements and `holders` of the
        saved states' holders? Each kind within its own bound from its first gap."""
        bounds = {
            "measurements": (gaps, FIRST_PLAN_WAIT_S),
            "holders": (holders, run.checkpoint.resume_wait_s),
        }
        waiting: list[str] = []
        for kind, (missing, bound_s) in bounds.items():
            if not missing:
                continue
            if now - self._since.setdefault(kind, now) < bound_s:
                waiting += missing
            elif kind not in self._expired:
                self._expired.add(kind)
                log.info("planning without %s after %.0f s", ", ".join(missing), bound_s)
        if waiting and waiting != self._logged:
            self._logged = waiting
            log.info("the first plan waits for %s", ", ".join(waiting))
        return bool(waiting)
