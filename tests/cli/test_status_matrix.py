"""`p2ptrain status` prints its N x N link matrices for at most MAX_MATRIX_PEERS peers: a
hostile node's status of thousands of peers costs one line, not minutes and gigabytes."""

from __future__ import annotations

import dataclasses

from p2ptrain.cli.status_cmd import MAX_MATRIX_PEERS, format_status
from tests.web.synthetic import swarm


def test_a_small_swarm_s_matrices_are_printed() -> None:
    text = format_status(swarm(8))
    assert "RTT ms" in text
    assert "Mbit/s" in text
    assert "link matrices left out" not in text


def test_a_swarm_past_the_cap_gets_one_line_instead() -> None:
    status = dataclasses.replace(swarm(MAX_MATRIX_PEERS + 8), plan=None)
    text = format_status(status)
    assert "RTT ms" not in text
    assert "Mbit/s" not in text
    assert f"{MAX_MATRIX_PEERS + 8} peers: link matrices left out (see --json)" in text


def test_past_the_cap_a_small_plan_s_peers_are_shown() -> None:
    status = swarm(MAX_MATRIX_PEERS + 8)  # every peer in the plan: too many
    assert "link matrices left out" in format_status(status)
    assert status.plan is not None
    plan = dataclasses.replace(status.plan, pipelines=status.plan.pipelines[:2], spares=())
    text = format_status(dataclasses.replace(status, plan=plan))
    header = next(line for line in text.splitlines() if line.startswith("RTT ms"))
    assert len(header.split()) == 2 + 2 * status.plan.stages  # "RTT ms" and the planned peers
    assert "link matrices left out" not in text
