"""Robust averaging with real hivemind code (in a subprocess: hivemind is not imported beside
libp2p, tests/worker/averaging/robust_probe.py): the reducer ignores claimed weights and drops bad parts,
a planned group's retry matchmaking admits members only, and a groupmate that hides garbage
from the checksums cannot get it into the honest members' gradients."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.worker.averaging.probe_run import run_probe

PROBE = Path(__file__).with_name("robust_probe.py")


def _probe(case: str) -> dict[str, Any]:
    return run_probe(PROBE, case)


def test_the_reducer_uses_planned_weights_and_drops_a_non_finite_part() -> None:
    """Sender 1 claims a weight of 1e9 (hivemind's reducer took it); sender 2 sends an
    infinity in one part: every part comes out as the planned-weight mean of the finite ones."""
    result = _probe("reducer")
    assert result["max_error"] < 1e-6
    assert list(result["notes"]) == ["s2"] and "non-finite" in result["notes"]["s2"]


def test_each_part_of_a_reducer_knows_its_token_rows() -> None:
    """hivemind splits the flat tensor into parts for each reducer; every part's token-row
    spans (train/model.py: token_row_spans, made relative to the part) mark exactly the
    tensor's token rows, across part and reducer boundaries."""
    result = _probe("part_rows")
    assert result["exact"] and min(result["num_parts"]) >= 4


def test_a_planned_groups_retry_admits_members_only() -> None:
    result = _probe("router")
    assert result["join_codes"] == {"member": ["ACCEPTED"], "stranger": ["PROTOCOL_VIOLATION"]}
    assert result["found"] == {"members": True, "with_stranger": False}


@pytest.mark.integration
def test_orthogonal_garbage_from_a_groupmate_stays_out_of_honest_gradients() -> None:
    """Three replicas; the third gathers honest checksums and a weight of 1e9 but sends its
    gradient plus garbage 1000× its norm, orthogonal to both checksum directions (the old
    checks passed such a round, with a third of the garbage in everyone's gradient). The
    honest reducers clip it; the round then fails its checks and every honest member keeps
    its own gradient, or (the attacker not retrying) the retry averages the two honest ones;
    either way the outcome says whose part was clipped."""
    for member in _probe("poisoned")["results"]:
        assert member["finite"]
        assert abs(member["garbage_share"]) < 1e-3, member
        assert member["own_gradient"] if member["kind"] == "local" else member["group_size"] == 2
        assert "clipped" in member["detail"], member


@pytest.mark.integration
def test_a_reducer_whose_reply_stream_breaks_is_asked_again() -> None:
    """The first member's reducer combines both members' parts, but its reply stream to the
    second ends empty. The second asks that reducer again for its averages: both members end
    the round averaged, with the exact mean (before, the second kept its own values for that
    share: a partial round on one member, whose retry found nobody)."""
    result = _probe("lost_reply")
    assert result["dropped"]
    for member in result["results"]:
        assert member["kind"] == "averaged", member
        assert member["error"] < 1e-5, member
    asked_again = [m for m in result["results"] if "reducer asked again" in m["detail"]]
    assert len(asked_again) == 1 and "sent 0 parts" in asked_again[0]["detail"]
