"""A leaving worker's outer round messages still on their way (worker/averaging/outer_link.py:
finish_sends): our own round can be done before our reduced shard reached a groupmate, and the
worker used to close its transport under it. A real TCP stream on 127.0.0.1 stands for p2pd's."""

from __future__ import annotations

import asyncio
import threading
import time
import types
from collections.abc import Coroutine
from typing import Any

import pytest
import torch

from p2ptrain.worker.averaging import outer_link
from p2ptrain.worker.averaging import outer_wire as wire
from p2ptrain.worker.traffic import Traffic
from tests.worker.averaging.test_outer_round_hostile import CLAIMS, PEERS, key


class _Groupmate:
    """A groupmate's end of the streams, on its own loop: it answers each message after
    `answer_after_s` (a loaded or far peer), or never (None)."""

    def __init__(self, answer_after_s: float | None) -> None:
        self.answer_after_s, self.received = answer_after_s, 0
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()
        self._started.wait(5)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._started.set()
        self._loop.run_forever()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1 << 16)
        if self.answer_after_s is None:
            await asyncio.sleep(3600)
        await asyncio.sleep(self.answer_after_s)
        self.received += 1
        writer.write(wire.ACCEPTED)
        await writer.drain()
        writer.close()


class _Transport:
    """What P2PRoundLink uses of a Transport; its streams go to one groupmate over TCP."""

    def __init__(self, groupmate: _Groupmate) -> None:
        self.peer_id, self.traffic, self._port = PEERS[2], Traffic(), groupmate.port
        self.p2p = types.SimpleNamespace(
            add_binary_stream_handler=self._register, call_binary_stream_handler=self._open
        )

    async def _register(self, protocol: str, handler: Any) -> None:
        pass

    async def _open(self, peer: Any, protocol: str) -> tuple[None, Any, Any]:
        reader, writer = await asyncio.open_connection("127.0.0.1", self._port)
        return None, reader, writer

    def call(self, coroutine: Coroutine[Any, Any, Any], timeout_s: float = 60.0) -> Any:
        return asyncio.run(coroutine)


def _send_one(link: outer_link.P2PRoundLink, timeout_s: float) -> None:
    header = wire.RoundHeader(key(5), wire.REDUCED, PEERS[2], 0, 16, CLAIMS)
    link.send(PEERS[0], header, torch.zeros(4), timeout_s)


def test_a_leaving_worker_waits_for_its_last_message_to_be_taken() -> None:
    groupmate = _Groupmate(answer_after_s=0.5)
    transport = _Transport(groupmate)
    link = outer_link.P2PRoundLink.of(transport)  # type: ignore[arg-type]
    _send_one(link, timeout_s=10.0)
    outer_link.finish_sends(transport)  # type: ignore[arg-type]
    assert groupmate.received == 1  # delivered and answered before we went on to close
    started = time.monotonic()
    outer_link.finish_sends(transport)  # type: ignore[arg-type]  # nothing left: at once
    assert time.monotonic() - started < 0.1


def test_a_groupmate_that_never_answers_holds_a_leaving_worker_a_bounded_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(outer_link, "LEAVING_SENDS_S", 0.3)
    transport = _Transport(_Groupmate(answer_after_s=None))
    link = outer_link.P2PRoundLink.of(transport)  # type: ignore[arg-type]
    _send_one(link, timeout_s=30.0)
    started = time.monotonic()
    outer_link.finish_sends(transport)  # type: ignore[arg-type]
    assert 0.25 < time.monotonic() - started < 2.0
