"""Pipeline frames on kept streams (protocol pipe.v4: worker/kept_streams.py, the Transport's
`_send_once`, frame_intake.py's `handle_kept_stream`), over real sockets on 127.0.0.1 standing
in for p2pd's, in a subprocess (kept_frames_probe.py: the transport imports hivemind, which this
process must not). A neighbour's frames share a stream, each checked, answered and filed; a
copy of a filed frame is read and dropped so the stream goes on; BUSY, a stranger, a bad or
spoofed frame, a peer gone from the plan and an idle stream each end theirs; a v3 neighbour
gets a stream a frame."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="module")
def seen() -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "tests.worker.pipeline.kept_frames_probe"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        cwd=Path(__file__).parents[3],
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_a_neighbours_frames_share_one_stream_each_filed(seen: dict[str, Any]) -> None:
    accepted = seen["codes"]["ACCEPTED"]
    assert seen["ten"] == [accepted] * 10
    assert seen["ten_opened"] == ["v4"]
    assert seen["ten_filed"] == 10
    assert seen["ten_received"] == 10 * seen["frame_bytes"]


def test_a_copy_of_a_filed_frame_is_read_and_the_stream_goes_on(seen: dict[str, Any]) -> None:
    assert seen["copy"] == [seen["codes"]["ACCEPTED"]] * 2
    assert seen["copy_opened"] == ["v4"]


def test_frames_at_once_open_as_many_streams_and_reuse_them(seen: dict[str, Any]) -> None:
    assert seen["four"] == [seen["codes"]["ACCEPTED"]] * 4
    assert seen["four_idle"] == 4 and seen["four_then_opened"] == 4
    assert seen["four_again_opened"] == 4  # the next four went on the idle ones


def test_busy_leaves_the_payload_unread_and_ends_the_stream(seen: dict[str, Any]) -> None:
    codes = seen["codes"]
    assert seen["busy"] == [codes["ACCEPTED"], codes["BUSY"], codes["BUSY"]]
    assert seen["busy_opened"] == ["v4"] * 2  # 4 and 5 on the first: BUSY ended it


def test_a_neighbour_of_the_last_version_gets_a_stream_a_frame(seen: dict[str, Any]) -> None:
    assert seen["v3"] == [seen["codes"]["ACCEPTED"]] * 3
    assert seen["v3_opened"] == ["v3"] * 3  # the first v4 open failed: v3 from then on
    assert seen["v3_filed"] == 3


def test_hostile_or_gone_peers_streams_end(seen: dict[str, Any]) -> None:
    codes = seen["codes"]
    assert seen["stranger"] == {"answers": codes["BUSY"], "ended": True}
    assert seen["stranger_received"] == 0
    assert seen["bad"] == {"answers": codes["ACCEPTED"] * 2 + codes["REJECTED"], "ended": True}
    assert seen["spoofed"] == {"answers": codes["ACCEPTED"] + codes["REJECTED"], "ended": True}
    assert seen["left"] == codes["ACCEPTED"] + codes["BUSY"]


def test_an_idle_stream_is_closed_without_a_rejection(seen: dict[str, Any]) -> None:
    assert seen["idle"] == {"answers": seen["codes"]["ACCEPTED"], "ended": True}
    assert seen["idle_streams_left"] == 0
