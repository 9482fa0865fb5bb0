"""Frame streams are capped (worker/pipeline/frame_intake.py), with real p2pd streams on
127.0.0.1 (in a subprocess: hivemind is not imported beside libp2p): a stranger to the plan gets
nothing read, a neighbour holds at most MAX_INBOUND_PER_PEER streams at once, and an idle stream
is closed once its header is overdue. A neighbour's frames go on streams kept open (pipe.v4):
16 frames, two at a time, on two streams."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

PROBE = Path(__file__).with_name("transport_probe.py")


def test_frame_streams_are_capped_and_strangers_get_nothing_read() -> None:
    done = subprocess.run([sys.executable, str(PROBE)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    # the intake's caps, as the probe read them (worker/pipeline/transport.py imports hivemind, which
    # this process must not: it imports libp2p)
    per_peer, header_timeout_s = result["max_inbound_per_peer"], result["header_timeout_s"]
    neighbour = result["neighbour"]
    # the first per_peer idle streams are held open (waiting for a header), the
    # rest of the flood is refused at once
    assert neighbour[:per_peer] == ["held"] * per_peer
    assert set(neighbour[per_peer:]) == {"rejected"}
    assert result["refused_counted"] == len(neighbour) - per_peer
    # a peer outside the plan is told to come back later (BUSY), without a read
    assert set(result["stranger"]) == {"busy"}
    # held streams whose header never came are refused once it is overdue
    assert set(result["neighbour_later"][:per_peer]) == {"rejected"}
    assert result["released_after_s"] <= header_timeout_s + 5
    # frames on kept streams: the two micro-batches of a step took one stream each, and the
    # next steps reused them; every frame was filed
    v4 = result["stream_protocols"][1]
    assert result["frames_opened"] == [v4, v4], result["frames_opened"]
    assert result["frames_filed"] == 16
