"""The wait for a step's sent frames (worker/pipeline/stage_step.py: wait_sends) ends as soon
as the worker is stopped or re-planned: it sat out the whole send deadline (a minute) on a
busy neighbour, and held up the next plan's start agreement."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future

import pytest

from p2ptrain.worker.pipeline.frames import PeerLost, Stopped
from p2ptrain.worker.pipeline.stage_step import wait_sends


def test_a_stop_ends_the_wait_at_once() -> None:
    pending: Future[None] = Future()  # a frame a busy neighbour never takes
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    started = time.monotonic()
    with pytest.raises(Stopped):
        wait_sends([pending], 60.0, stop.is_set)
    assert time.monotonic() - started < 30.0  # the deadline was 60 s


def test_frames_accepted_end_it_and_a_failed_or_overdue_one_is_a_lost_peer() -> None:
    done: Future[None] = Future()
    done.set_result(None)
    wait_sends([done], 1.0, lambda: False)
    failed: Future[None] = Future()
    failed.set_exception(ConnectionError("p2pd: stream reset"))
    with pytest.raises(PeerLost, match="stream reset"):
        wait_sends([done, failed], 1.0, lambda: False)
    with pytest.raises(PeerLost, match="did not finish in 0 s"):
        wait_sends([Future()], 0.2, lambda: False)
