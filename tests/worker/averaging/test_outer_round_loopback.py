"""Outer rounds over real p2pd streams on 127.0.0.1 (worker/averaging/outer_link.py; in a
subprocess: hivemind is not imported beside libp2p): three members complete fp16, int8 and
top-k rounds with identical results, the wire carries the codec's bytes, and a member whose
daemon dies mid-round (or before it) costs the others only the plan's timeouts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # about 60 s

PROBE = Path(__file__).with_name("outer_round_probe.py")


def test_three_members_agree_and_a_killed_one_does_not_block_the_others() -> None:
    done = subprocess.run([sys.executable, str(PROBE)], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    members, killed = result["members"], result["killed"]
    join_s, transfer_s, retry_s = result["timeouts"]
    for codec in ("fp16", "int8", "topk"):
        outcomes = result[codec]
        assert {o["kind"] for o in outcomes.values()} == {"averaged"}, outcomes
        assert {o["group_size"] for o in outcomes.values()} == {3}
        assert len({o["digest"] for o in outcomes.values()}) == 1  # identical parameters
    # bytes on the wire (payloads and headers, 3 members): int8 about half of fp16; top-k 3%
    # gathers each payload to both others, still over 20x fewer bytes than fp16 at 3 members
    assert 1.9 < result["fp16_bytes"] / result["int8_bytes"] < 2.0
    assert result["fp16_bytes"] / result["topk_bytes"] > 20
    # a groupmate's messages share the streams kept open to it (protocol v2): 3 members, 6
    # messages each in an fp16 or int8 round, 4 in a top-k one (48: a stream each before, v1),
    # at most 2 streams a pair in use (12)
    assert result["messages_sent"] >= 48
    assert set(result["streams_opened"]) == {"p2ptrain.outer-round.v2"}
    assert result["streams_opened"]["p2ptrain.outer-round.v2"] <= 12
    bound_s = join_s + 2 * transfer_s + retry_s + 2.0
    for case in ("killed_mid_round", "killed_before_round"):
        survivors = {p: o for p, o in result[case].items() if p != killed}
        assert set(survivors) == set(members) - {killed}
        assert {o["kind"] for o in survivors.values()} == {"averaged"}, survivors
        assert {o["group_size"] for o in survivors.values()} == {2}
        assert len({o["digest"] for o in survivors.values()}) == 1
        assert all(o["took_s"] < bound_s for o in survivors.values()), survivors
