"""The step a new plan starts from, agreed by all of its members.

A plan that moves peers interrupts the stages of a pipeline at slightly different moments: a
later stage may have applied step s while an earlier one was still waiting for its gradients. So
before training under a new plan, every member announces the stage states it holds (its
checkpoint directory: layers key -> steps, train/checkpoint.py keeps the last few) in the
data-plane DHT under a key of that plan, waits for every other member's announcement, and all
compute the same start step with `choose_start_step`: the newest step at which every stage of the
new plan has a saved state somewhere.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the choice itself is pure, so tests may import it beside libp2p
    from hivemind import DHT

log = logging.getLogger(__name__)

RESUME_TIMEOUT_S = 120.0
POLL_INTERVAL_S = 0.3
ANNOUNCEMENT_TTL_S = 600.0
MAX_KEYS = 256  # stage layer ranges one peer may announce
MAX_STEPS_PER_KEY = 64
MAX_KEY_CHARS = 32


@dataclass(frozen=True)
class StartPoint:
    """Where a new plan starts, and who said they hold what (to fetch a missing stage from)."""

    step: int
    note: str  # "" when every stage resumes exactly; otherwise what had to give
    held: dict[str, dict[str, list[int]]] = field(default_factory=dict, compare=False)

    def holders(self, key: str, step: int) -> list[str]:
        """The members that announced a state of layers `key` at `step`."""
        return sorted(peer for peer, held in self.held.items() if step in held.get(key, []))


def choose_start_step(needed: list[str], held: dict[str, dict[str, list[int]]]) -> StartPoint:
    """The newest step at which every needed stage (layers key) has a state in some member's
    announcement. Pure: every member computes the same answer from the same announcements.

    If no step is common (a stage has no saved state at all, e.g. the stage count changed, or the
    states are further apart than the history), the newest step common to the stages that do have
    states is used, and the rest start fresh there: said in `note`, never silent.
    """
    available: dict[str, set[int]] = {key: set() for key in needed}
    for announcement in held.values():
        for key, steps in announcement.items():
            if key in available:
                available[key].update(steps)
    if not any(available.values()):
        return StartPoint(0, "")  # a fresh run
    with_state = [steps for steps in available.values() if steps]
    common = set.intersection(*with_state)
    missing = sorted(key for key, steps in available.items() if not steps)
    if common:
        step = max(common)
        note = f"no saved state for {', '.join(missing)}: started fresh" if missing else ""
        return StartPoint(step, note)
    step = min(max(steps) for steps in with_state)
    return StartPoint(step, f"stage states share no step: each resumes from its newest <= {step}")


def check_announcement(value: Any, num_steps: int) -> dict[str, list[int]] | None:
    """A peer's announcement if it is well-formed and bounded, else None (it came off the wire).
    Steps outside the run are refused: a state at or past the run's last step would make every
    worker skip training as if the run were done."""
    if not isinstance(value, dict) or len(value) > MAX_KEYS:
        return None
    clean: dict[str, list[int]] = {}
    for key, steps in value.items():
        if not isinstance(key, str) or len(key) > MAX_KEY_CHARS or not isinstance(steps, list):
            return None
        if len(steps) > MAX_STEPS_PER_KEY or not all(
            isinstance(s, int) and not isinstance(s, bool) and 0 <= s < num_steps for s in steps
        ):
            return None
        clean[key] = sorted(set(steps))
    return clean


def agree_on_start(
    dht: DHT,
    key: str,
    peer_id: str,
    members: list[str],
    needed: list[str],
    mine: dict[str, list[int]],
    should_abort: Callable[[], bool],
    num_steps: int,
    timeout_s: float = RESUME_TIMEOUT_S,
) -> StartPoint | None:
    """Announce `mine` under `key`, wait for every member's announcement, choose the start.
    None if `should_abort()` turned true or a member stayed silent for `timeout_s`."""
    from hivemind.utils import get_dht_time

    others = sorted(set(members) - {peer_id})
    held = {peer_id: mine}
    if others:
        dht.store(key, mine, get_dht_time() + ANNOUNCEMENT_TTL_S, subkey=peer_id)
        deadline = time.monotonic() + timeout_s
        stored_again = time.monotonic()
        while True:
            found = dht.get(key, latest=True)
            entries = found.value if found is not None and isinstance(found.value, dict) else {}
            for member in others:
                entry = entries.get(member)
                announcement = check_announcement(getattr(entry, "value", None), num_steps)
                if announcement is not None:
                    held[member] = announcement
            if all(m in held for m in others):
                break
            if should_abort():
                return None
            if time.monotonic() > deadline:
                silent = [m for m in others if m not in held]
                log.warning(
                    "no resume announcement from %s in %.0f s", ", ".join(silent), timeout_s
                )
                return None
            if time.monotonic() - stored_again > 5.0:  # in case the first store missed a peer
                dht.store(key, mine, get_dht_time() + ANNOUNCEMENT_TTL_S, subkey=peer_id)
                stored_again = time.monotonic()
            time.sleep(POLL_INTERVAL_S)
    return replace(choose_start_step(needed, held), held=held)
