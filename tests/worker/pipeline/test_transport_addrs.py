"""A plan's data address that hivemind's multiaddr parser refuses (`/ip6/::::/tcp/1`, which the
records' check once passed) raised out of the transport's dial and ended every worker of the
plan; now it is left out, and a peer with no address left is one the dial could not reach.
In a subprocess: the transport imports hivemind, which this process must not (it imports
libp2p)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.records.samples import A, B

PROBE = """
import asyncio, json, sys
from types import SimpleNamespace

from p2ptrain.worker.pipeline import dialing
from p2ptrain.worker.pipeline.transport import Transport, transport_addrs

A, B = sys.argv[1:3]
kept = transport_addrs(["/ip6/::::/tcp/1", f"/ip4/127.0.0.1/tcp/4001/p2p/{A}", "/ip4/8.8.8.8/tcp/1/ipfs/1"])
loop = asyncio.new_event_loop()
ours = SimpleNamespace(to_base58=lambda: "1")  # below any peer id: we dial first, no wait
transport = Transport(loop, SimpleNamespace(peer_id=ours), lambda header: None)
connected = loop.run_until_complete(dialing.connect(transport.p2p, "1", B, ["/ip6/::::/tcp/1"], 1.0))
transport.keep_routes({B: ["/ip6/::::/tcp/1"]})
loop.run_until_complete(asyncio.sleep(0))
print(json.dumps({"kept": [str(a) for a in kept], "connected": connected,
                  "routes": list(transport._routes)}))
"""


def test_an_address_hivemind_cannot_parse_is_left_out_not_raised() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, A, B], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"kept": ["/ip4/127.0.0.1/tcp/4001"], "connected": False, "routes": []}
