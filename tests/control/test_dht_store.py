"""What our DHT server stores for others: only signed records under the two keys we put
(/p2ptrain/peer/<author>, /p2ptrain/run), and no provider records. A second live host on
loopback sends PUT_VALUE and ADD_PROVIDER through py-libp2p's own client calls, with the
library's lax default validator on its side: free identities must not turn every node into
storage (24 h values of up to 1 MiB, 48 h provider records with any number of addresses)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import pytest
import trio
from libp2p.kad_dht.kad_dht import DHTMode, KadDHT
from libp2p.peer.peerinfo import PeerInfo
from libp2p.tools.anyio_service import background_trio_service
from multiaddr import Multiaddr

from p2ptrain import identity
from p2ptrain.control import wire
from p2ptrain.control.dht_store import make_dht
from p2ptrain.net.host import make_host
from p2ptrain.records import RunSpec
from tests.net.trio_run import run
from tests.records.samples import peer_dict, telemetry_dict

LOOPBACK = Multiaddr("/ip4/127.0.0.1/tcp/0")
SEED = os.urandom(32)  # the signer of the records below (any identity: they are free)
AUTHOR = identity.peer_id_of(SEED)
RUN_KEY = "/p2ptrain/run"
_clock = wire.SeqClock()


def peer_key(peer: str) -> str:
    return f"/p2ptrain/peer/{peer}"


def signed(kind: str, body: dict[str, Any]) -> bytes:
    return wire.sign(SEED, kind, _clock.next(), body)


@asynccontextmanager
async def server_and_client() -> AsyncIterator[tuple[KadDHT, KadDHT]]:
    """Our DHT on a live host, and a stranger's plain py-libp2p DHT that routes to it."""
    ours, theirs = make_host(os.urandom(32)), make_host(os.urandom(32))
    async with AsyncExitStack() as stack:
        for host in (ours, theirs):
            await stack.enter_async_context(host.run(listen_addrs=[LOOPBACK]))
        server, client = make_dht(ours), KadDHT(theirs, DHTMode.SERVER)
        await stack.enter_async_context(background_trio_service(server))
        info = PeerInfo(ours.get_id(), ours.get_addrs())
        await theirs.connect(info)
        await client.routing_table.add_peer(info, skip_server_mode_check=True)
        yield server, client


def stored_at_server(puts: dict[str, bytes]) -> dict[str, bool]:
    """Each key: whether our server kept the client's PUT_VALUE of it."""

    async def scenario() -> dict[str, bool]:
        async with server_and_client() as (server, client):
            for key, value in puts.items():
                with trio.fail_after(10):
                    await client.put_value(key, value)
            return {key: server.value_store.get(key.encode()) is not None for key in puts}

    result: dict[str, bool] = run(scenario)
    return result


def test_only_our_two_keys_are_stored() -> None:
    record, spec = signed("peer", peer_dict()), signed("run", RunSpec().to_dict())
    stored = stored_at_server(
        {
            peer_key(AUTHOR): record,  # ours: kept
            RUN_KEY: spec,
            f"/zz/{os.urandom(8).hex()}": os.urandom(4096),  # no namespace of ours
            f"plain-{os.urandom(8).hex()}": os.urandom(4096),  # no namespace at all
            f"/p2ptrain/spam/{AUTHOR}": record,  # our namespace, a key we never put
            f"/p2ptrain/peer/{os.urandom(4).hex()}/{AUTHOR}": record,
            f"/p2ptrain/{os.urandom(4).hex()}/run": spec,
            f"/p2ptrain/peer/{AUTHOR}/x": record,
        }
    )
    assert stored == {key: key in (peer_key(AUTHOR), RUN_KEY) for key in stored}


def test_a_peer_key_holds_its_authors_peer_record_only() -> None:
    other = identity.peer_id_of(os.urandom(32))
    stored = stored_at_server(
        {
            peer_key(AUTHOR): signed("telemetry", telemetry_dict()),  # not a peer record
            peer_key(other): signed("peer", peer_dict()),  # someone else's key
        }
    )
    assert stored == {peer_key(AUTHOR): False, peer_key(other): False}


def test_add_provider_stores_nothing() -> None:
    async def scenario() -> list[PeerInfo]:
        async with server_and_client() as (server, client):
            key = os.urandom(32)
            with trio.fail_after(10):
                await client.provider_store.provide(key)
            # ADD_PROVIDER is fire-and-forget: give the server the time to handle it
            with trio.move_on_after(2.0):
                while not server.provider_store.get_providers(key):  # noqa: ASYNC110 - no event
                    await trio.sleep(0.05)
            return server.provider_store.get_providers(key)

    assert run(scenario) == []


def test_a_value_is_refused_before_parsing_when_too_large_of_another_kind_or_past_budget() -> None:
    """A 1 MiB value of kind "plan" under a peer key was parsed and verified whole (125 ms of
    the loop a PUT, from one stream the library reads in a loop, past our stream caps)."""
    from p2ptrain.control.dht_store import (
        VALIDATE_BURST_BYTES,
        VALIDATE_BYTES_PER_S,
        _SignedRecordValidator,
    )

    now = [0.0]
    validator = _SignedRecordValidator(clock=lambda: now[0])
    record = signed("peer", peer_dict())
    validator.validate(peer_key(AUTHOR), record)  # honest: kept
    padded = record[:-1] + b"," + b'"pad":"' + b"x" * (wire.MAX_ENVELOPE_BYTES) + b'"}'
    with pytest.raises(wire.WireError, match="oversized"):
        validator.validate(peer_key(AUTHOR), padded)
    with pytest.raises(wire.WireError, match="kind"):
        validator.validate(RUN_KEY, record)  # a peer record under the run's key
    spent = len(record)  # the honest one above
    while spent + len(record) <= VALIDATE_BURST_BYTES:  # no time passes: the burst runs out
        validator.validate(peer_key(AUTHOR), record)
        spent += len(record)
    with pytest.raises(wire.WireError, match="budget"):
        validator.validate(peer_key(AUTHOR), record)
    now[0] += 2 * len(record) / VALIDATE_BYTES_PER_S  # refilled at the budget's rate
    validator.validate(peer_key(AUTHOR), record)


def test_our_own_puts_are_not_charged_to_a_spent_budget() -> None:
    """A flood that spent the budget failed our own puts too (the library validates them in the
    putting task); a task spawned meanwhile (a connection our put dialled starts its stream
    handlers, a stranger's PUTs among them, from our task) is charged as any stranger is."""

    from p2ptrain.control.dht_store import (
        VALIDATE_BURST_BYTES,
        _SignedRecordValidator,
        own_operation,
    )

    validator = _SignedRecordValidator(clock=lambda: 0.0)
    record = signed("peer", peer_dict())
    for _ in range(VALIDATE_BURST_BYTES // len(record)):  # a stranger's flood spends it all
        validator.validate(peer_key(AUTHOR), record)
    refused: list[str] = []

    def strangers_put() -> None:
        try:
            validator.validate(peer_key(AUTHOR), record)
        except wire.WireError as exc:
            refused.append(str(exc))

    async def main() -> None:
        with pytest.raises(wire.WireError, match="budget"):
            validator.validate(peer_key(AUTHOR), record)
        async with trio.open_nursery() as nursery:
            with own_operation():
                validator.validate(peer_key(AUTHOR), record)  # ours: validated, not charged
                nursery.start_soon(trio.to_thread.run_sync, strangers_put)
                nursery.start_soon(_as_task, strangers_put)
                with pytest.raises(wire.WireError, match="forged"):  # still checked whole
                    validator.validate(RUN_KEY.replace("run", "peer/x"), record)
        with pytest.raises(wire.WireError, match="budget"):  # outside it, charged again
            validator.validate(peer_key(AUTHOR), record)

    trio.run(main)
    assert len(refused) == 2 and all("budget" in why for why in refused)


async def _as_task(call: Callable[[], None]) -> None:
    call()
