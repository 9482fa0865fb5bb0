"""A peer opening streams in a loop cannot flood the log: refused, overdue and failed streams and
bad requests log the 1st, then every 100th, with the count (net/rpc.py, net/guard.py, through
sampled_log.py)."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest
import trio

from p2ptrain.net import guard, rpc
from p2ptrain.net.ratelimit import StreamRates
from p2ptrain.sampled_log import SampledLog
from tests.net.trio_run import run

FLOOD = 250  # lines on the old code; 3 now (the 1st, the 101st, the 201st)


class HostileStream:
    """What the handlers see of a stream whose peer sends garbage and hangs up."""

    def __init__(self, peer: str = "QmFlooder") -> None:
        self.muxed_conn = SimpleNamespace(peer_id=SimpleNamespace(to_base58=lambda: peer))

    def get_protocol(self) -> str:
        return "/test/flood/1.0.0"

    async def read(self, n: int | None = None) -> bytes:
        raise ConnectionResetError("reset by peer")

    async def reset(self) -> None:
        pass

    async def close(self) -> None:
        pass


def _lines(caplog: pytest.LogCaptureFixture, logger: str, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == logger and text in r.getMessage()]


def _flood(handler: Any) -> None:
    async def scenario() -> None:
        for _ in range(FLOOD):
            await handler(HostileStream())

    run(scenario)


def test_refused_streams_log_one_line_in_a_hundred(caplog: pytest.LogCaptureFixture) -> None:
    limits = rpc.InboundLimits(per_peer=0)  # every stream refused

    async def never_called(stream: Any) -> None:
        raise AssertionError("a refused stream was handled")

    with caplog.at_level(logging.INFO, logger=rpc.__name__):
        _flood(limits.guard(never_called))
    lines = _lines(caplog, rpc.__name__, "refused a")
    assert limits.num_refused == FLOOD
    assert len(lines) == 3 and lines[-1].endswith("(201 so far)")


def test_overdue_streams_log_one_line_in_a_hundred(caplog: pytest.LogCaptureFixture) -> None:
    limits = rpc.InboundLimits(deadline_s=0, rates=StreamRates(burst=FLOOD))  # one peer's flood

    async def idle(stream: Any) -> None:
        await trio.sleep_forever()

    with caplog.at_level(logging.INFO, logger=rpc.__name__):
        _flood(limits.guard(idle))
    assert len(_lines(caplog, rpc.__name__, "open past")) == 3


def test_bad_requests_log_one_line_in_a_hundred(caplog: pytest.LogCaptureFixture) -> None:
    async def respond(request: bytes) -> dict[str, Any]:
        raise AssertionError("a request that never arrived was answered")

    with caplog.at_level(logging.INFO, logger=rpc.__name__):
        _flood(rpc.make_handler(respond))
    assert len(_lines(caplog, rpc.__name__, "dropped a bad")) == 3


def test_failed_streams_log_one_line_in_a_hundred(caplog: pytest.LogCaptureFixture) -> None:
    async def failing(stream: Any) -> None:
        await stream.read(4)

    with caplog.at_level(logging.INFO, logger=guard.__name__):
        _flood(guard.guard_stream_handler("flood test", failing))
    assert len(_lines(caplog, guard.__name__, "flood test stream")) == 3


def test_failed_tasks_log_one_line_in_a_hundred_per_kind(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def failing(stream: Any) -> None:
        await stream.read(4)

    async def scenario() -> None:
        for _ in range(FLOOD):
            await guard.contained("flood test task", failing, HostileStream())
        await guard.contained("other test task", failing, HostileStream())

    with caplog.at_level(logging.INFO, logger=guard.__name__):
        run(scenario)
    assert len(_lines(caplog, guard.__name__, "flood test task failed")) == 3
    assert len(_lines(caplog, guard.__name__, "other test task failed")) == 1  # its own count


def test_a_sampled_log_counts_each_kind_apart(caplog: pytest.LogCaptureFixture) -> None:
    sampled = SampledLog(logging.getLogger("test.sampled"), logging.WARNING)
    with caplog.at_level(logging.WARNING, logger="test.sampled"):
        for index in range(201):
            sampled.event("a", "event a %d", index)
        sampled.event("b", "event b")
    assert [r.getMessage() for r in caplog.records] == [
        "event a 0 (1 so far)",
        "event a 100 (101 so far)",
        "event a 200 (201 so far)",
        "event b (1 so far)",
    ]


def test_a_failed_dial_is_not_four_bare_library_lines() -> None:
    """py-libp2p's TCP transport logged every failed attempt at ERROR (four a dial of a peer
    that left), printed bare by Python's last-resort handler on every node's console."""
    import logging

    from p2ptrain.net.host import quiet_library_logs

    quiet_library_logs()
    assert not logging.getLogger("libp2p.transport.tcp.tcp").isEnabledFor(logging.ERROR)
    assert logging.getLogger("p2ptrain.control.node").isEnabledFor(logging.ERROR)


def test_a_stream_a_peer_will_not_open_logs_no_library_error() -> None:
    """GossipSub opens /meshsub to every peer that connects: on a bootstrap, each `p2ptrain
    status` observer refused it, and py-libp2p logged a 7-line ERROR for each one. The caller
    gets StreamFailure and handles it; the library's own line is now below the level."""
    import logging
    import os

    import trio
    from libp2p.custom_types import TProtocol
    from libp2p.peer.peerinfo import info_from_p2p_addr
    from multiaddr import Multiaddr

    from p2ptrain.net.host import full_addrs, make_host, quiet_library_logs
    from tests.net.trio_run import run

    quiet_library_logs()
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    library = logging.getLogger("libp2p.host.basic_host")
    library.addHandler(handler)
    listen = [Multiaddr("/ip4/127.0.0.1/tcp/0")]

    async def scenario() -> bool:
        a, b = make_host(os.urandom(32)), make_host(os.urandom(32))
        async with a.run(listen_addrs=listen), b.run(listen_addrs=listen):
            with trio.fail_after(10):
                await a.connect(info_from_p2p_addr(Multiaddr(full_addrs(b)[0])))
            try:
                with trio.fail_after(30):
                    await a.new_stream(b.get_id(), [TProtocol("/not-spoken/1.0.0")])
            except Exception:
                return True
            return False

    try:
        assert run(scenario), "the stream opened"
    finally:
        library.removeHandler(handler)
    assert [r for r in records if r.levelno >= logging.ERROR] == []
