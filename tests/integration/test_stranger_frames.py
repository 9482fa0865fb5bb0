"""Issue 26, finding 0: one garbage frame from a stranger ends nothing but its stream; and a
node raises its soft open-file limit to the hard one at start (finding 2's node side).

A CLI-started bootstrap (a real process) gets, from an identity it never admitted, one frame of
64 bytes of 0xff on every protocol it speaks (GossipSub, identify, identify push, Kademlia, ping,
ours) and a GossipSub publish whose key is garbage. It must stay up and keep answering status.
Before the fix the first frame on /meshsub/1.1.0 ended the process at once.
"""

from __future__ import annotations

import os
import resource
import shlex
from pathlib import Path

import pytest
import trio
from libp2p.custom_types import TProtocol
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.pubsub.pb import rpc_pb2
from libp2p.utils.varint import encode_uvarint
from multiaddr import Multiaddr

from p2ptrain.control.gossip import CONTROL_TOPIC
from p2ptrain.control.rpcs import STATUS_PROTOCOL
from p2ptrain.control.sync import SYNC_PROTOCOL
from p2ptrain.net.host import make_host
from tests.control.swarm_helpers import (
    STARTUP_TIMEOUT_S,
    bootstrap_argv,
    get_status,
    start_bootstrap,
)

pytestmark = pytest.mark.integration

GARBAGE = b"\xff" * 64
PROTOCOLS = (
    "/meshsub/1.1.0",
    "/meshsub/1.0.0",
    "/ipfs/id/1.0.0",
    "/ipfs/id/push/1.0.0",
    "/ipfs/kad/1.0.0",
    "/ipfs/ping/1.0.0",
    str(STATUS_PROTOCOL),
    str(SYNC_PROTOCOL),
)


def garbage_key_publish() -> bytes:
    """A publish on our control topic whose key and sender are garbage: the library's
    signature check re-raises protobuf's DecodeError on it."""
    rpc = rpc_pb2.RPC()
    rpc.publish.add(
        from_id=b"\x00\x01garbage",
        key=b"garbage key",
        signature=b"sig",
        data=b"x",
        seqno=b"12345678",
        topicIDs=[CONTROL_TOPIC],
    )
    return rpc.SerializeToString()


async def send_garbage(addr: str) -> list[str]:
    """Each frame on its own stream of one connection; the protocols the victim refused."""
    frames = [(p, GARBAGE) for p in PROTOCOLS] + [("/meshsub/1.1.0", garbage_key_publish())]
    refused = []
    host = make_host(os.urandom(32))
    async with host.run(listen_addrs=[Multiaddr("/ip4/127.0.0.1/tcp/0")]):
        victim = info_from_p2p_addr(Multiaddr(addr))
        await host.connect(victim)
        for protocol, payload in frames:
            try:
                stream = await host.new_stream(victim.peer_id, [TProtocol(protocol)])
                await stream.write(encode_uvarint(len(payload)) + payload)
            except Exception:
                refused.append(protocol)
            await trio.sleep(0.3)
        await trio.sleep(1.0)
    return refused


@pytest.mark.timeout(120)
def test_garbage_frames_leave_the_bootstrap_serving(tmp_path, reaper):
    boot, addr = start_bootstrap(reaper, tmp_path)
    refused = trio.run(send_garbage, addr)
    assert refused == [], f"the bootstrap refused {refused}"
    assert boot.poll() is None, (tmp_path / "boot.log").read_text()[-3000:]
    status = get_status(addr)  # a second, honest connection is served
    assert status is not None and boot.poll() is None


def open_file_limits(pid: int) -> tuple[int, int]:
    """(soft, hard) RLIMIT_NOFILE of a running process, as /proc shows it."""
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise AssertionError("no open-file limit in /proc")


@pytest.mark.timeout(120)
@pytest.mark.skipif(
    resource.getrlimit(resource.RLIMIT_NOFILE)[1] <= 256, reason="the hard limit is already low"
)
def test_a_node_raises_its_open_file_limit(tmp_path, reaper):
    """Started as services usually are, with a low soft limit, the control process lifts it."""
    run = tmp_path / "control-run.toml"
    run.write_text("[run]\n")
    command = bootstrap_argv(tmp_path, "--run", str(run))
    boot = reaper.start(["sh", "-c", f"ulimit -Sn 256 && exec {shlex.join(command)}"])
    reaper.read_line(boot, STARTUP_TIMEOUT_S)
    soft, hard = open_file_limits(boot.pid)
    assert soft == hard > 256
