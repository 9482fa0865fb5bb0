"""A trainer waiting for a neighbour's frame says so (worker/pipeline/frame_inbox.py)."""

from __future__ import annotations

import logging

import pytest

from p2ptrain.worker.pipeline import frame_inbox
from p2ptrain.worker.pipeline.frame_inbox import FrameInbox
from p2ptrain.worker.pipeline.frames import PeerLost


def test_a_long_wait_says_what_it_waits_for_and_from_whom(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A trainer waiting for its neighbour's frame said nothing until it gave up (120 s)."""
    monkeypatch.setattr(frame_inbox, "WAIT_NOTE_S", 0.1)
    monkeypatch.setattr(frame_inbox, "POLL_S", 0.02)
    inbox = FrameInbox()
    caplog.set_level(logging.INFO, logger=frame_inbox.__name__)
    with pytest.raises(PeerLost, match="from prev-peer"):
        inbox.take((1, 1), "activation", 5, 0, 0.5, lambda: False, "prev-peer")
    notes = [r.getMessage() for r in caplog.records if "waiting" in r.getMessage()]
    assert len(notes) >= 2
    assert notes[0].startswith("step 5: waiting 0 s so far for activation 0 from prev-peer")
