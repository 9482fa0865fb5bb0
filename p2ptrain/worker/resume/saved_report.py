"""What a worker tells its control process of the run's saved states, once it has the run spec
and before any plan: a restarted swarm's first plan waits, bounded, for the blocks of the run's
newest lineage that no member holds yet (control/planning/readiness.py), instead of starting
them from initial weights while their holder is still on its way.

Per stage (layers key) and lineage, the newest step the checkpoint directory holds of this run
only (run id, model shape and data digest, read from the file as adopt.py reads them: another
run's states in a shared directory are not named), the newest first, at most MAX_SAVED.
"""

from __future__ import annotations

from pathlib import Path

from p2ptrain.records import SavedReport, SavedStage
from p2ptrain.records.lineage import id_of_tag
from p2ptrain.records.peer import MAX_SAVED
from p2ptrain.records.run import RunSpec
from p2ptrain.train.checkpoint_folder import checkpoint_dir, list_states
from p2ptrain.train.checkpoint_read import other_run
from p2ptrain.worker.resume.covers import key_range


def saved_stages(directory: Path, spec: RunSpec) -> tuple[SavedStage, ...]:
    """The newest state of each stage and lineage in `directory` that is of `spec`'s run."""
    found: dict[tuple[str, str], SavedStage] = {}
    for state in sorted(list_states(directory), key=lambda s: -s.step):
        blocks = key_range(state.key)
        lineage = "root" if state.tag is None else id_of_tag(state.tag)
        if blocks is None or blocks.stop > spec.model.n_layer or lineage is None:
            continue
        if (state.key, lineage) in found or other_run(state.path, spec) is not None:
            continue
        found[(state.key, lineage)] = SavedStage(blocks.start, blocks.stop, state.step, lineage)
    return tuple(found.values())[:MAX_SAVED]


def saved_report(spec: RunSpec, node_dir: str | None) -> SavedReport:
    """The report for `spec`, of the node's own checkpoint directory if it set one."""
    directory = Path(node_dir) if node_dir else checkpoint_dir(spec)
    return SavedReport(spec.run_id, saved_stages(directory, spec))
