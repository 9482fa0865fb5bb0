"""The `p2ptrain` command: the product's subcommands (p2ptrain/cli/) and the harness's
(p2ptrain/harness/cli/) in one table.

Neither product nor harness: it only says which module runs which subcommand; p2ptrain/cli/main.py
parses and dispatches, importing only the chosen module.
"""

from __future__ import annotations

from collections.abc import Sequence

from p2ptrain.cli.main import Subcommands, dispatch

SUBCOMMANDS: Subcommands = {
    "schedule": (
        "p2ptrain.cli.schedule_cmd",
        "plan pipelines and data-parallel groups for a topology",
    ),
    "bench": (
        "p2ptrain.harness.cli.bench_cmd",
        "run a benchmark and print a table (--json for machines)",
    ),
    "bootstrap": ("p2ptrain.cli.bootstrap_cmd", "run a long-lived bootstrap node"),
    "join": ("p2ptrain.cli.join_cmd", "join a swarm as a peer"),
    "status": ("p2ptrain.cli.status_cmd", "show a swarm's peers, links, planner and plan"),
    "doctor": (
        "p2ptrain.cli.doctor_cmd",
        "check that joining a swarm will work from this machine (reachability, NAT, ports, ...)",
    ),
    "id": ("p2ptrain.cli.id_cmd", "print this node's peer id (create its key if missing)"),
    "digest": (
        "p2ptrain.cli.digest_cmd",
        "print the sha256 of a run's data on this machine (the run spec's data_sha256)",
    ),
    "export": (
        "p2ptrain.cli.export_cmd",
        "merge a run's stage checkpoints into a Hugging Face model directory",
    ),
    "checkpoints": (
        "p2ptrain.cli.checkpoints_cmd",
        "list a run's saved stage states by lineage, or prune old ones (--dry-run)",
    ),
    "token": (
        "p2ptrain.cli.token_cmd",
        "issue or revoke a token that admits a peer (organiser's key)",
    ),
    "local": (
        "p2ptrain.harness.cli.local_cmd",
        "start a bootstrap and N peers on this machine and train",
    ),
    "testbed": (
        "p2ptrain.harness.cli.testbed_cmd",
        "emulate a WAN in network namespaces; inject faults (root)",
    ),
}


def main(argv: Sequence[str] | None = None) -> int:
    return dispatch(SUBCOMMANDS, argv)
