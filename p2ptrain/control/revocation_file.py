"""The bootstrap's `--revoked` file: `p2ptrain token revoke` lines, appended to while it runs,
re-read by the publishing loop (control/publishing.py) every 10 s."""

from __future__ import annotations

import logging

from p2ptrain.control.state import NodeState
from p2ptrain.records.token import read_revocations, revocation_problem

log = logging.getLogger(__name__)


def reload_revocations(state: NodeState) -> None:
    """Apply the revocations in the bootstrap's --revoked file (appended to while it runs). Each
    line counts on its own: a torn append or another key's line is skipped and named, and the
    organiser's revocations before and after it still apply (all or nothing, one bad line
    dropped every revocation, at a restart the earlier ones too). Warned once per change."""
    if state.revocations_path is None:
        return
    problems: list[str] = []
    try:
        entries = read_revocations(state.revocations_path, problems)
    except OSError as exc:
        entries, problems = (), [str(exc)]
    organiser, good = state.view.bootstrap_id, []
    for revocation in entries:
        if (problem := revocation_problem(revocation, organiser)) is not None:
            problems.append(f"revocation of {revocation.peer}: {problem}")
        else:
            good.append(revocation)
    if (problem := state.view.revoke(tuple(good))) is not None:
        problems.append(problem)
    said = "; ".join(problems)
    if said and said != state.revocations_warned:
        log.warning("skipped in %s: %s", state.revocations_path, said)
    state.revocations_warned = said
