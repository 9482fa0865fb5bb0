"""A leaving worker's outer round messages still on their way (worker/averaging/outer_link.py:
finish_sends): our own round can be done before our reduced shard reached a groupmate, and the
worker used to close its transport under it. The groupmate's end is a coroutine that answers
late (or never); the link's own send loop, pool and retries are real."""

from __future__ import annotations

import asyncio
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


class _Transport:
    """What P2PRoundLink uses of a Transport (hivemind's p2pd is not imported here: it cannot
    share a process with libp2p, which other tests import)."""

    def __init__(self) -> None:
        self.peer_id, self.traffic = PEERS[2], Traffic()
        self.p2p = types.SimpleNamespace(add_binary_stream_handler=self._register)

    async def _register(self, protocol: str, handler: Any) -> None:
        pass

    def call(self, coroutine: Coroutine[Any, Any, Any], timeout_s: float = 60.0) -> Any:
        return asyncio.run(coroutine)


def _link(answer_after_s: float | None) -> tuple[outer_link.P2PRoundLink, list[str]]:
    """A link whose groupmate takes each message after `answer_after_s` (a loaded or far
    peer), or never (None); the list of the peers that took one."""
    link = outer_link.P2PRoundLink.of(_Transport())  # type: ignore[arg-type]
    taken: list[str] = []

    async def send_once(peer: str, data: bytes) -> bytes:
        await asyncio.sleep(3600 if answer_after_s is None else answer_after_s)
        taken.append(peer)
        return wire.ACCEPTED

    link._send_once = send_once  # type: ignore[method-assign]
    return link, taken


def _send_one(link: outer_link.P2PRoundLink, timeout_s: float) -> None:
    header = wire.RoundHeader(key(5), wire.REDUCED, PEERS[2], 0, 16, CLAIMS)
    link.send(PEERS[0], header, torch.zeros(4), timeout_s)


def test_a_leaving_worker_waits_for_its_last_message_to_be_taken() -> None:
    link, taken = _link(answer_after_s=0.5)
    _send_one(link, timeout_s=10.0)
    outer_link.finish_sends(link.transport)
    assert taken == [PEERS[0]]  # delivered and answered before we went on to close
    started = time.monotonic()
    outer_link.finish_sends(link.transport)  # nothing left: at once
    assert time.monotonic() - started < 0.1


def test_a_groupmate_that_never_answers_holds_a_leaving_worker_a_bounded_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(outer_link, "LEAVING_SENDS_S", 0.3)
    link, taken = _link(answer_after_s=None)
    _send_one(link, timeout_s=30.0)
    started = time.monotonic()
    outer_link.finish_sends(link.transport)
    assert 0.25 < time.monotonic() - started < 2.0 and taken == []
