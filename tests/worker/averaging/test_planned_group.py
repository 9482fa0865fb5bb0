"""Averaging in the group the plan fixes (worker/averaging/planned_group.py), with real hivemind peers on
127.0.0.1 (in a subprocess: hivemind is not imported beside libp2p): the round runs without the
DHT matchmaking, and a round whose planned group is incomplete still averages the peers that
came, through hivemind's matchmaking on the retry."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.worker.averaging.probe_run import run_probe

pytestmark = pytest.mark.integration

PROBE = Path(__file__).with_name("planned_group_probe.py")


def _probe(case: str) -> dict[str, Any]:
    return run_probe(PROBE, case)


def test_the_planned_group_averages_without_dht_matchmaking() -> None:
    result = _probe("full")
    # gradients 1, 2 and 3 with equal weights: every member gets 2
    assert [r["kind"] for r in result["results"]] == ["averaged"] * 3
    assert [r["group_size"] for r in result["results"]] == [3] * 3
    assert [r["mean"] for r in result["results"]] == pytest.approx([2.0] * 3)
    assert result["dht_matchmaking_used"] is False
    # a peer outside the group downloads nothing of the averager's buffer (it got all 4,000
    # bytes of the round's gradient)
    assert result["stranger_downloaded_bytes"] == 0 and result["state_sharing"] is False
    # the worker's byte counters: every member swapped metadata with each groupmate and got at
    # least its whole float32 gradient's worth (each member reduces a third in parts: it gets
    # the others' pieces of its third and sends each the average back, and gets the others'
    # averages of their thirds); at least two sent it whole too (a reducer's replies may be
    # counted with the next round: they can leave after its own round is done)
    gradient_bytes = 4 * 1000
    sent_whole = 0
    for i, r in enumerate(result["results"]):
        links = {int(peer): counts for peer, counts in r["link_bytes"].items()}
        assert set(links) == {0, 1, 2} - {i}, links
        assert all(sent > 0 and received > 0 for sent, received in links.values()), links
        assert sum(received for _, received in links.values()) >= gradient_bytes, links
        sent_whole += sum(sent for sent, _ in links.values()) >= gradient_bytes
    assert sent_whole >= 2, result
    # each member's round moved parts both ways: the process tree's CPU clock was read when its
    # first part left and when its last part arrived (worker/cpu_clock.py's WireMarks)
    for r in result["results"]:
        first_sent, last_received = r["wire_cpu"]
        assert 0 < first_sent <= last_received, r


def test_a_missing_member_leaves_the_others_to_average_on_the_retry() -> None:
    result = _probe("missing")
    # the third member never came: the first attempt timed out, the retry found the two others
    # through the DHT; gradients 1 and 2 average to 1.5
    assert [r["kind"] for r in result["results"]] == ["averaged"] * 2
    assert [r["group_size"] for r in result["results"]] == [2] * 2
    assert [r["mean"] for r in result["results"]] == pytest.approx([1.5] * 2)
    assert result["dht_matchmaking_used"] is True


def test_a_member_leaving_after_its_last_round_first_serves_its_late_replies() -> None:
    """At a run's last step a member's own round can be done while its reducer's averages are
    still on their way to a groupmate (a loaded machine). Leaving at once broke that groupmate's
    round: it kept its local gradient, and the stage's replicas ended the run apart."""
    result = _probe("late_reply")
    assert [r["kind"] for r in result["results"]] == ["averaged"] * 2, result["results"]
    assert [r["mean"] for r in result["results"]] == pytest.approx([1.5] * 2)
    # it stayed for its replies (held 1.5 s), and no longer than its bound
    (left_after_s,) = result["left_after_s"]
    assert 1.0 < left_after_s < 10.0, left_after_s
