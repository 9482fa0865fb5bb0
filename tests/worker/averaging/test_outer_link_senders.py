"""Our outer-round sends against a groupmate that reads every message but never writes the
answer byte (worker/averaging/outer_link.py): it held a sender thread a message for the round's
whole timeout, and once it held all MAX_SENDERS, messages to honest groupmates waited behind it
until the rounds failed and blamed the honest ones. The groupmates' ends are coroutines; the
link's queues, pool and send loop are real. Timeouts here are hang guards only."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import Future, wait

import pytest
import torch

from p2ptrain.worker.averaging import outer_link
from p2ptrain.worker.averaging import outer_wire as wire
from tests.worker.averaging.test_outer_link_leaving import _Transport
from tests.worker.averaging.test_outer_round_hostile import CLAIMS, PEERS, key

HANG_S = 30.0
HONEST = PEERS[0]
WITHHOLDERS = [f"withholder-{n}" for n in range(outer_link.MAX_SENDERS)]


class _Groupmates:
    """A link whose withholders take each message and answer only once `release` is set (a
    real one never does); anyone else answers at once. `calls`: whom a send reached."""

    def __init__(self) -> None:
        self.link = outer_link.P2PRoundLink.of(_Transport())  # type: ignore[arg-type]
        self.release = threading.Event()
        self.calls: list[str] = []
        self.link._send_once = self._send_once  # type: ignore[method-assign]

    async def _send_once(self, peer: str, data: bytes) -> bytes:
        self.calls.append(peer)
        if peer in WITHHOLDERS:
            await asyncio.to_thread(self.release.wait, HANG_S)
        return wire.ACCEPTED

    def send(self, peer: str, timeout_s: float) -> Future[None]:
        header = wire.RoundHeader(key(5), wire.PART, PEERS[2], 0, 16, CLAIMS)
        return self.link.send(peer, header, torch.zeros(4), timeout_s)


@pytest.fixture
def mates() -> Iterator[_Groupmates]:
    mates = _Groupmates()
    yield mates
    mates.release.set()  # no sender thread outlives the test
    outer_link.finish_sends(mates.link.transport)


def test_a_groupmate_that_never_answers_cannot_hold_back_an_honest_ones_messages(
    mates: _Groupmates,
) -> None:
    withholder = WITHHOLDERS[0]
    held = [mates.send(withholder, HANG_S) for _ in range(outer_link.MAX_SENDERS)]
    honest = mates.send(HONEST, HANG_S)
    honest.result(HANG_S)  # was: queued behind 8 held senders until their timeouts
    assert not any(sent.done() for sent in held)
    assert mates.link._sending[withholder] == outer_link.MAX_SENDS_PER_PEER
    assert len(mates.link._waiting[withholder]) == len(held) - outer_link.MAX_SENDS_PER_PEER
    # a peer that answers late (a slow honest one) still gets every message, in turn
    mates.release.set()
    done, _ = wait(held, HANG_S)
    assert len(done) == len(held) and all(sent.exception() is None for sent in held)
    assert mates.calls.count(withholder) == len(held)


def test_a_message_whose_time_ran_out_in_its_peers_queue_goes_unsent(
    mates: _Groupmates,
) -> None:
    withholder = WITHHOLDERS[0]
    held = [mates.send(withholder, HANG_S) for _ in range(outer_link.MAX_SENDS_PER_PEER)]
    queued = [mates.send(withholder, 0.05) for _ in range(3)]
    threading.Event().wait(0.2)  # their time passes while the withholder holds its senders
    mates.release.set()
    wait(held + queued, HANG_S)
    assert all(sent.exception() is None for sent in held)
    assert all(isinstance(sent.exception(), TimeoutError) for sent in queued)
    assert mates.calls.count(withholder) == len(held)  # the queued payloads never went out
    assert withholder not in mates.link._waiting


def test_a_messages_time_counts_from_its_send_not_from_when_a_sender_took_it(
    mates: _Groupmates,
) -> None:
    # enough withholders to hold every sender, 2 each: the honest message waits for a thread
    per_peer = outer_link.MAX_SENDS_PER_PEER
    withholders = WITHHOLDERS[: outer_link.MAX_SENDERS // per_peer]
    held = [mates.send(peer, HANG_S) for peer in withholders for _ in range(per_peer)]
    late = mates.send(HONEST, 0.05)
    threading.Event().wait(0.2)  # its time passes in the pool's queue
    mates.release.set()
    wait([*held, late], HANG_S)
    assert isinstance(late.exception(), TimeoutError)
    assert HONEST not in mates.calls  # dropped when a sender took it, not sent then
    assert mates.send(HONEST, HANG_S).result(HANG_S) is None  # the pool is free again


def test_four_colluding_withholders_do_not_hold_back_an_honest_message(
    mates: _Groupmates,
) -> None:
    """4 withholders, 2 senders each, held the whole pool of 8 that every send shared."""
    per_peer = outer_link.MAX_SENDS_PER_PEER
    held = [mates.send(peer, HANG_S) for peer in WITHHOLDERS[:4] for _ in range(2 * per_peer)]
    mates.send(HONEST, HANG_S).result(HANG_S)  # was: queued until their senders timed out
    assert not any(sent.done() for sent in held)
