"""A hostile groupmate against a planned group's rounds, with real hivemind code (in a subprocess:
hivemind is not imported beside libp2p, tests/worker/averaging/hostile_groupmate_probe.py): a
made-up far-future round key cannot make the later rounds local, and a part of the wrong shape or dtype is dropped without stalling the
reducer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.worker.averaging.probe_run import run_probe

PROBE = Path(__file__).with_name("hostile_groupmate_probe.py")


def _probe(case: str) -> dict[str, Any]:
    return run_probe(PROBE, case)


def test_one_far_future_round_key_does_not_make_later_rounds_local() -> None:
    """A groupmate sent "grad/9007199254740991" once: it was held for ever and every later
    planned round saw a "later round" (GroupmatesAhead), so every step of the plan was local."""
    result = _probe("far_key")
    rounds, codes = result["rounds"], result["codes"]
    # before our first round any step may come; that round drops what is out of its window
    assert codes["far before any round"] == "ACCEPTED"
    assert [rounds[f"grad/{n}"] for n in range(5, 9)] == ["group"] * 4
    assert codes["far during grad/5"] == codes["far"] == "NOT_LOOKING_FOR_GROUP"
    # a groupmate really a step ahead still ends our planned attempt at once
    assert codes["grad/10 during grad/9"] == "ACCEPTED"
    assert rounds["grad/9"] == "groupmates ahead"
    # our latest round is 9: 11 is within the window, 12 is not, 3 is past
    assert codes["grad/11"] == "ACCEPTED"
    assert codes["grad/12"] == "NOT_LOOKING_FOR_GROUP"
    assert codes["grad/3"] == "BAD_GROUP_KEY"
    for malformed in ("grad/09", "grad/²", "x/9", "5000 digits"):
        assert codes[malformed] == "PROTOCOL_VIOLATION", malformed
    # re-sync rounds are numbered from a step, not one by one: no window
    assert codes["state/900"] == "ACCEPTED"
    assert result["held"] == ["grad/10", "grad/11", "state/900"]


def test_a_part_of_the_wrong_shape_or_dtype_is_dropped_promptly() -> None:
    """Held unchecked, such a part made torch.stack raise in the combination: the part's
    future was never set and every member waited for its timeout."""
    result = _probe("bad_part")
    assert result["error"] < 1e-6  # the honest senders' mean, on every sender
    assert result["contributors"] == [[0, 1], [0, 1]]
    assert "shape (5,), not (4,)" in result["notes"]["s2"]
    assert "dtype torch.int64" in result["notes"]["s3"]
