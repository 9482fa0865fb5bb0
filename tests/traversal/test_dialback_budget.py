"""The dial-back server's budgets (traversal/dialback.py): strangers cannot spend the members'
minute, a /24 of addresses is one budget, requests with nothing to dial cost nothing, and one
IP dials one request at a time. Dials are faked: no socket is opened."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID

from p2ptrain.records import DialBackRequest
from p2ptrain.traversal import dialback
from tests.net.trio_run import run

MEMBER = ID.from_pubkey(create_new_key_pair().public_key)
STRANGER = ID.from_pubkey(create_new_key_pair().public_key)
PUBLIC = ["/ip4/81.2.69.1/tcp/7400"]  # the server's own address: not on loopback


@pytest.fixture(autouse=True)
def no_dials(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Every dial fails at once (the requester is not there); the list says what was dialled."""
    dialled: list[tuple[str, int]] = []

    async def fake_dial(upgrader: Any, ip: str, port: int, peer: ID) -> str:
        dialled.append((ip, port))
        return "connect failed"

    monkeypatch.setattr(dialback, "dial_back", fake_dial)
    return dialled


def server(own: list[str] = PUBLIC) -> dialback.DialBackServer:
    return dialback.DialBackServer(lambda: own, lambda peer: peer == MEMBER.to_base58())


async def ask(s: dialback.DialBackServer, ip: str, peer: ID, port: int = 7401) -> str:
    reply = await s.answer(DialBackRequest((f"/ip4/{ip}/tcp/{port}",)), (ip, 40000), peer)
    return reply.error


def test_strangers_spend_their_own_small_budget_not_the_members() -> None:
    """The audit's attack: 8 IPv4 addresses x 8 requests spent the whole minute, and a member's
    request (the bootstrap's answer a `public` verdict needs) was `rate limited`."""
    s = server()

    async def scenario() -> tuple[list[str], str]:
        flood = [
            await ask(s, f"81.2.{70 + n}.{k + 1}", STRANGER) for n in range(8) for k in range(8)
        ]
        return flood, await ask(s, "81.2.90.1", MEMBER)

    flood, member = run(scenario)
    assert flood.count("") == dialback.STRANGER_REQUESTS_TOTAL
    assert set(flood) == {"", "rate limited"}
    assert member == ""


def test_requests_with_nothing_to_dial_are_answered_and_not_counted(
    no_dials: list[tuple[str, int]],
) -> None:
    s = server()

    async def scenario() -> tuple[list[Any], str]:
        replies = [
            await s.answer(DialBackRequest(("/ip4/81.2.69.9/tcp/80",)), ("81.2.69.9", 4000), MEMBER)
            for _ in range(3 * dialback.REQUESTS_TOTAL)
        ]
        return replies, await ask(s, "81.2.69.9", MEMBER)

    replies, error = run(scenario)
    assert all(r.error == "" and r.results == () for r in replies)
    assert error == "" and no_dials == [("81.2.69.9", 7401)]  # only the real one dialled


def test_a_slash_24_is_one_budget_and_other_prefixes_keep_theirs() -> None:
    s = server()

    async def scenario() -> tuple[list[str], str]:
        same_24 = [await ask(s, f"81.2.69.{ip}", MEMBER) for ip in range(1, 7) for _ in range(8)]
        return same_24, await ask(s, "81.2.100.1", MEMBER)

    same_24, other = run(scenario)
    assert same_24.count("") == dialback.REQUESTS_PER_PREFIX
    assert same_24[dialback.REQUESTS_PER_PREFIX :] == ["rate limited"] * (
        len(same_24) - dialback.REQUESTS_PER_PREFIX
    )
    assert other == ""


def slow_dials(monkeypatch: pytest.MonkeyPatch) -> tuple[trio.Event, list[str]]:
    """Dials that wait until the event is set (a requester whose handshake stalls)."""
    release, started = trio.Event(), []

    async def fake_dial(upgrader: Any, ip: str, port: int, peer: ID) -> str:
        started.append(ip)
        await release.wait()
        return "timed out"

    monkeypatch.setattr(dialback, "dial_back", fake_dial)
    return release, started


def test_one_ip_dials_one_request_at_a_time_except_on_loopback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def scenario() -> tuple[list[str], list[str]]:
        release, started = slow_dials(monkeypatch)
        s = server()
        local = server(own=["/ip4/127.0.0.1/tcp/7400"])
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask, s, "81.2.69.1", MEMBER)
            nursery.start_soon(ask, local, "127.0.0.1", MEMBER)
            await trio.testing.wait_all_tasks_blocked()  # every dial is waiting
            public = [await ask(s, "81.2.69.1", MEMBER)]
            nursery.start_soon(ask, s, "81.2.69.2", MEMBER)  # another IP of the /24 dials
            # a swarm on one machine: every node is 127.0.0.1, each dials
            nursery.start_soon(ask, local, "127.0.0.1", MEMBER)
            await trio.testing.wait_all_tasks_blocked()  # every dial is waiting
            release.set()
        return public, started

    public, started = run(scenario)
    assert public == ["busy"]
    assert sorted(started) == ["127.0.0.1", "127.0.0.1", "81.2.69.1", "81.2.69.2"]


def test_slow_strangers_never_hold_the_members_last_dialling_slots(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def scenario() -> tuple[str, str, str]:
        release, started = slow_dials(monkeypatch)
        s = server()
        async with trio.open_nursery() as nursery:
            for n in range(dialback.MAX_CONCURRENT_STRANGERS):
                nursery.start_soon(ask, s, f"81.2.{70 + n}.1", STRANGER)
            await trio.testing.wait_all_tasks_blocked()  # every dial is waiting
            stranger = await ask(s, "81.2.99.1", STRANGER)
            nursery.start_soon(ask, s, "81.2.98.1", MEMBER)
            await trio.testing.wait_all_tasks_blocked()  # every dial is waiting
            member_dialled = started[-1]
            release.set()
        after = await ask(s, "81.2.99.1", STRANGER)
        return stranger, member_dialled, after

    stranger, member_dialled, after = run(scenario)
    assert stranger == "busy" and member_dialled == "81.2.98.1"
    assert after == ""  # the slots came back
