"""`local`'s lines before the first step (harness/start_notes.py): the nodes' newest waiting
line as it changes, at most every MIN_GAP_S, else a generic one every QUIET_NOTE_S."""

from __future__ import annotations

from pathlib import Path

import pytest

from p2ptrain.harness.start_notes import MIN_GAP_S, QUIET_NOTE_S, StartNotes

PEER = "12D3KooWDzahFbdmjWTAn647dkPz9KyA5GQmHUUnWK5CMaf5DyhC"


def test_the_nodes_newest_reason_is_said_as_it_changes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    logs = [tmp_path / "peer-0.log", tmp_path / "peer-1.log"]  # peer-1 not started yet
    notes = StartNotes(logs, started_s=0.0)
    logs[0].write_text(
        "2026-12-01 INFO p2ptrain.control.run_watch: waiting for the planner election\n"
        "waiting for the planner election\n"
        "waiting for the first plan's measurements: 6 of 6 links still missing\n"
        "waiting for the first plan's measure"  # a line still being written: not read
    )
    notes.tick(None, now=1.0)  # too soon after the start
    assert capsys.readouterr().err == ""
    notes.tick(None, now=MIN_GAP_S + 1)
    said = capsys.readouterr().err
    assert said == "waiting for the first plan's measurements: 6 of 6 links still missing (3 s)\n"
    notes.tick(None, now=MIN_GAP_S + 5)  # unchanged: not said again
    assert capsys.readouterr().err == ""
    with logs[1].open("a") as f:
        f.write(f"waiting for the first plan ({PEER} is making it)\n")
    notes.tick(None, now=MIN_GAP_S + 6)
    assert capsys.readouterr().err == "waiting for the first plan (…f5DyhC is making it) (8 s)\n"
    with logs[1].open("a") as f:
        f.write("waiting for nothing: run r is finished\n")  # not a wait
    notes.tick(None, now=MIN_GAP_S + 8)
    assert capsys.readouterr().err == ""


def test_without_a_reason_a_generic_line_comes_every_quiet_note(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    notes = StartNotes([tmp_path / "peer-0.log"], started_s=0.0)
    notes.tick(None, now=QUIET_NOTE_S - 1)
    assert capsys.readouterr().err == ""
    notes.tick(None, now=QUIET_NOTE_S)
    assert "waiting 20 s for the first plan" in capsys.readouterr().err
