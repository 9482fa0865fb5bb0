"""The step a new plan starts from, agreed by all of its members.

A plan that moves peers interrupts the stages of a pipeline at slightly different moments: a
later stage may have applied step s while an earlier one was still waiting for its gradients. So
before training under a new plan, every member announces the stage states it holds (its
checkpoint directory: layers key -> step -> sha256 of the file, train/checkpoint.py keeps the
last few) in the data-plane DHT under a key of that plan, signed by its identity key, waits for
every other member's announcement (worker/resume/announcement.py), and all compute the same
start from them with one pure rule (worker/resume/start_choice.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from p2ptrain.records import Plan, StartReport
from p2ptrain.records.lineage import may_adopt
from p2ptrain.records.peer import MAX_SILENT
from p2ptrain.records.run import RunSpec
from p2ptrain.worker.resume.announcement import (
    SUBKEY_PREFIX,
    Announced,
    check_announcement,
    sign_announcement,
)
from p2ptrain.worker.resume.copy_sources import without_live_sources
from p2ptrain.worker.resume.own_states import StateRank, own_announcement
from p2ptrain.worker.resume.start_choice import StartPoint, choose_start, placement

if TYPE_CHECKING:  # hivemind is imported only when agreeing: importing this module loads none
    from hivemind import DHT

log = logging.getLogger(__name__)

RESUME_TIMEOUT_S = 120.0
POLL_INTERVAL_S = 0.3
ANNOUNCEMENT_TTL_S = 600.0


def resume_key(run_id: str, plan: Plan) -> str:
    """The DHT key of one plan's start-step announcements."""
    return f"p2ptrain_{run_id}_resume_t{plan.term}_e{plan.epoch}"


def agree_on_start(
    dht: DHT,
    key: str,
    seed: bytes,
    peer_id: str,
    members: list[str],
    placed: Mapping[str, Collection[str]],
    mine: Announced,
    rank: StateRank,
    should_abort: Callable[[], bool],
    num_steps: int,
    timeout_s: float = RESUME_TIMEOUT_S,
    adopting: bool = False,
    donors: Mapping[str, range] | None = None,
    on_silent: Callable[[list[str]], None] | None = None,
) -> StartPoint | None:
    """Announce `mine` under `key` (signed with `seed`, this peer's identity key), wait for every
    member's announcement (`members`: the plan's peers in its order), choose the start for the
    stages of `placed` (layers key -> the members placed there) among the states of the plan's
    lineage (`rank`: its Plan.state_rank), or, `adopting`, an earlier lineage's (choose_start).
    None if `should_abort()` turned true or a member stayed silent for `timeout_s` (then told to
    `on_silent`, those members)."""
    from hivemind.utils import get_dht_time

    others = sorted(set(members) - {peer_id})
    held: dict[str, Announced] = {peer_id: mine}
    if others:
        value = sign_announcement(seed, key, peer_id, mine)
        subkey = SUBKEY_PREFIX + peer_id
        dht.store(key, value, get_dht_time() + ANNOUNCEMENT_TTL_S, subkey=subkey)
        deadline = time.monotonic() + timeout_s
        stored_again = time.monotonic()
        while True:
            found = dht.get(key, latest=True)
            entries = found.value if found is not None and isinstance(found.value, dict) else {}
            for member in others:
                entry = entries.get(SUBKEY_PREFIX + member)
                announcement = check_announcement(
                    getattr(entry, "value", None), key, member, num_steps
                )
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
                if on_silent is not None:
                    on_silent(silent)
                return None
            if time.monotonic() - stored_again > 5.0:  # in case the first store missed a peer
                dht.store(key, value, get_dht_time() + ANNOUNCEMENT_TTL_S, subkey=subkey)
                stored_again = time.monotonic()
            time.sleep(POLL_INTERVAL_S)
    return choose_start(placed, held, rank, members, adopting, donors)


def agree_on_plan_start(
    dht: DHT,
    spec: RunSpec,
    plan: Plan,
    directory: Path,
    seed: bytes,
    peer_id: str,
    should_abort: Callable[[], bool],
    report: Callable[[StartReport], None] | None = None,
) -> StartPoint | None:
    """agree_on_start for this peer under `plan`, announcing its states in `directory`; a
    restarted swarm's first lineage adopts the run's newest state (worker/resume/adopt.py) unless the
    run says resume = "never". Members silent past its time are told to `report`."""

    def silent(peers: list[str]) -> None:
        if report is not None:
            report(StartReport(plan.term, plan.epoch, tuple(peers[:MAX_SILENT])))

    members, placed = placement(plan, spec.model.n_layer)
    adopting = spec.checkpoint.resume == "latest" and may_adopt(plan.lineage)
    rank = plan.state_rank
    mine = own_announcement(directory, rank, spec if adopting else None, run=spec)
    mine = without_live_sources(mine, directory, plan.peers())
    started_s = time.monotonic()
    start = agree_on_start(
        dht,
        resume_key(spec.run_id, plan),
        seed,
        peer_id,
        members,
        placed,
        mine,
        rank,
        should_abort,
        spec.optim.steps,
        adopting=adopting,
        donors=plan.donor_ranges(),  # heard first on the blocks they hand over (covers.py)
        on_silent=silent,
    )
    if start is not None:
        log.info(
            "the plan's %d peers agreed to start at step %d in %.1f s",
            len(members),
            start.step,
            time.monotonic() - started_s,
        )
    return start
