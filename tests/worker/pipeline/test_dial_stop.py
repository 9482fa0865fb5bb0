"""The plan's dials (worker/pipeline/transport.py: connect_all) end as soon as a newer plan or a
stop arrives: a long link's window (up to 200 s) held up Session.__init__, and with it the
session of the next plan. In a subprocess: the transport imports hivemind, which this process
must not (it imports libp2p)."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import asyncio, json, threading, types
from p2ptrain.worker.pipeline.transport import Transport

PEER = "QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"
ADDRS = ["/ip4/127.0.0.1/tcp/1"]
cancelled = threading.Event()

class Client:
    hang = True
    async def connect(self, peer_id, addrs):
        if not self.hang:
            return
        try:
            await asyncio.Event().wait()  # a dial that never ends on its own
        except asyncio.CancelledError:
            cancelled.set()
            raise

class P2P:
    _client = Client()
    async def list_peers(self):
        return []

loop = asyncio.new_event_loop()
threading.Thread(target=loop.run_forever, daemon=True).start()
transport = object.__new__(Transport)  # the dial's state only, no p2pd
transport._loop, transport._p2p, transport.peer_id = loop, P2P(), ""  # "": we dial first
transport.intake = types.SimpleNamespace()  # whose frames it reads: set by connect_all
asked = []

def should_stop():
    asked.append(1)
    return len(asked) >= 3

stopped = transport.connect_all({PEER: ADDRS}, {PEER: 3600.0}, should_stop)
P2P._client.hang = False
reached = transport.connect_all({PEER: ADDRS}, {PEER: 3600.0}, lambda: False)
print(json.dumps({"stopped": stopped, "reached": reached, "asked": len(asked),
                  "cancelled": cancelled.wait(60)}))
"""


def test_a_stop_ends_the_dials_and_cancels_them() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=120
    )
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["stopped"] == ["QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"]
    assert seen["asked"] == 3 and seen["cancelled"]  # the dial itself ended, not just the wait
    assert seen["reached"] == []
