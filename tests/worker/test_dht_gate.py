"""The worker's DHT serves the plan's peers only (worker/dht_gate.py), with real hivemind DHT
processes on 127.0.0.1 (in a subprocess: hivemind is not imported beside libp2p): 5 stranger
nodes with ids next to a plan's announcement key hid every member's announcement from the
others (each stored it on them alone); behind the gate a member finds another's record, and a
stranger can store nothing on the members."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

PROBE = Path(__file__).with_name("dht_gate_probe.py")


def test_strangers_next_to_a_key_cannot_hide_a_members_record() -> None:
    done = subprocess.run([sys.executable, str(PROBE)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["stored"] is True
    assert result["found"] == {"a-record": "A's announcement"}
    assert result["stranger_stored"] is False
    assert sum(result["refused"]) >= 5  # each stranger's bootstrap ping, at least
    # a member's fresh keys past its quota of records: refused, record by record
    assert result["over_quota"] >= 20
    # its dictionary of 257 fresh items under one key, the dictionary's own expiry in the past
    assert result["dictionary_stored"] is False and result["dictionary_over_quota"] == 1
    # p2pd's own Kademlia served anyone (providers for any key), its AutoNAT dialled back
    args = result["p2pd_args"]
    assert "-dhtClient=1" in args and "-autonat=0" in args, args
    assert not any(a.startswith("-dhtServer") for a in args)
