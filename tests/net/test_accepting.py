"""Finding 2 of issue 26: a flood of idle connections to the relay port ended the node (EMFILE
escaped `accept`). Real sockets on 127.0.0.1; the out-of-descriptors case in a child process
whose soft open-file limit is lowered, as a service's usual 1,024 is, only smaller."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio

from p2ptrain.net.accepting import ConnectionCaps
from p2ptrain.traversal import relay
from tests.net.trio_run import run

REPO = Path(__file__).resolve().parents[2]

# the child: a relay port under a soft limit of 64 descriptors; prints its port, serves forever
CHILD = """
import resource, sys, trio
from p2ptrain.traversal import relay
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
async def main():
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    print(listeners[0].socket.getsockname()[1], flush=True)
    await relay.RelayServer(lambda peer: True).serve_raw(listeners[0])
trio.run(main)
"""


def test_caps_count_each_source_and_the_total() -> None:
    caps = ConnectionCaps(per_source=2, total=3)
    assert [caps.admit("a"), caps.admit("a"), caps.admit("a")] == [True, True, False]
    assert [caps.admit("b"), caps.admit("c")] == [True, False]
    caps.release("a")
    assert caps.admit("c") and caps.open == 3 and caps.refused == 2
    for source in ("a", "b", "c"):
        caps.release(source)
    assert caps.open == 0 and caps.open_by_source == {}


def test_connections_past_a_sources_cap_are_closed_at_once_and_idle_ones_soon(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(relay, "RAW_IDLE_S", 1.0)
    relay_server = relay.RelayServer(lambda peer: True)
    relay_server.caps = ConnectionCaps(per_source=4, total=8)

    async def main() -> tuple[list[bool], float, str]:
        async with trio.open_nursery() as nursery:
            listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
            await nursery.start(relay_server.serve_raw, listeners[0])
            address = ("127.0.0.1", int(listeners[0].socket.getsockname()[1]))
            opened = trio.current_time()
            streams = [await trio.open_tcp_stream(*address) for _ in range(6)]
            closed_after = [0.0] * len(streams)

            async def watch(index: int, stream: trio.SocketStream) -> None:
                with contextlib.suppress(trio.BrokenResourceError):
                    await stream.receive_some(1)  # the end (the relay never writes to them)
                closed_after[index] = trio.current_time() - opened

            # past the cap: closed at once; the held ones: dropped for want of a hello
            with trio.fail_after(5):
                async with trio.open_nursery() as watchers:
                    for index, stream in enumerate(streams):
                        watchers.start_soon(watch, index, stream)
            closed_at_once = [after < 0.5 for after in closed_after]
            idle_s = max(closed_after)
            seen, _ = await relay.observe(address)  # and an honest client is served
            for stream in streams:
                await stream.aclose()
            nursery.cancel_scope.cancel()
        return closed_at_once, idle_s, seen

    closed_at_once, idle_s, seen = run(main)
    assert closed_at_once.count(True) == 2 and closed_at_once[:4] == [False] * 4
    assert idle_s < 3.0 and seen.startswith("127.0.0.1:")


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_NOFILE as Linux has it")
def test_a_flood_past_the_descriptor_limit_leaves_the_relay_port_serving() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline())
        flood = []
        for _ in range(200):  # well past the child's 64 descriptors
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            flood.append(sock)
        time.sleep(1.0)  # its accept loop meets EMFILE again and again meanwhile
        assert child.poll() is None, "the relay port's process died of the flood"
        for sock in flood:
            sock.close()

        async def honest() -> tuple[str, int]:
            with trio.fail_after(20):
                while True:
                    try:
                        return await relay.observe(("127.0.0.1", port))
                    except Exception:
                        await trio.sleep(0.2)  # the backlog of the flood drains first

        seen, local_port = run(honest)
        assert seen == f"127.0.0.1:{local_port}"
        assert child.poll() is None
    finally:
        child.kill()
        child.wait()
