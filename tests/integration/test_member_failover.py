"""A community run's planner failover as a member without a planner token sees it: outside
telemetry's audience a member hears only the planner's telemetry (control/gossip.py), and the
other candidates live by their records. When the planner is SIGKILLed, the candidates (who hear
each other's telemetry) elect another, and the member follows its claim and its plan, made
without the dead one."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.conftest import ProcessReaper
from tests.control.swarm_helpers import (
    alive_ids,
    peer_id,
    plan_peers,
    start_bootstrap,
    start_peer,
    wait_for_status,
)

pytestmark = pytest.mark.integration

NUM_CANDIDATES = 2
NUM_MEMBERS = 2
FAILOVER_WITHIN_S = 60.0  # DEAD_AFTER_S, the claim, the plan, and `status` on a shared box


@pytest.mark.timeout(300)
def test_a_member_follows_the_next_planner_when_the_planner_dies(
    reaper: ProcessReaper, tmp_path: Path
) -> None:
    _, boot_addr = start_bootstrap(reaper, tmp_path)
    candidates = [
        start_peer(reaper, tmp_path, boot_addr, f"cand{i}", planner=True)
        for i in range(NUM_CANDIDATES)
    ]
    members = [
        start_peer(reaper, tmp_path, boot_addr, f"member{i}", planner=False)
        for i in range(NUM_MEMBERS)
    ]
    candidate_ids = {peer_id(addr) for _, addr in candidates}
    everyone = candidate_ids | {peer_id(addr) for _, addr in members}
    member_addr = members[0][1]

    def planned_by_a_candidate(status: dict[str, object]) -> bool:
        return (
            status.get("planner") in candidate_ids
            and status.get("plan") is not None
            and alive_ids(status) >= everyone  # type: ignore[arg-type]
        )

    # the member's own view (status asks the node it is pointed at)
    status, ok = wait_for_status(member_addr, planned_by_a_candidate, 120)
    assert ok, f"the member never saw a plan by a candidate: {status}"
    assert status is not None
    planner = str(status["planner"])
    (other,) = candidate_ids - {planner}
    (proc,) = [p for p, addr in candidates if peer_id(addr) == planner]
    proc.send_signal(signal.SIGKILL)  # its control process dies with it (PDEATHSIG)

    def follows_the_other(status: dict[str, object]) -> bool:
        plan = status.get("plan")
        return (
            status.get("planner") == other
            and isinstance(plan, dict)
            and plan.get("planner") == other
            and planner not in plan_peers(plan)  # the candidates know it dead: planned out
        )

    status, ok = wait_for_status(member_addr, follows_the_other, FAILOVER_WITHIN_S)
    assert ok, f"the member did not follow {other} after {planner} died: {status}"
