"""net/known_records.py: a sender's unchanged signed peer record is checked once, not per RPC;
anything else (other bytes, another sender, a record the peerstore no longer holds, a stale
entry) still takes py-libp2p's full check."""

from __future__ import annotations

import os
from typing import Any, cast

import trio
from libp2p.abc import IHost
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.envelope import seal_record
from libp2p.peer.id import ID
from libp2p.peer.peer_record import PeerRecord
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.peer.peerstore import PeerStore
from libp2p.pubsub.pb.rpc_pb2 import RPC
from libp2p.pubsub.utils import maybe_consume_signed_record
from libp2p.tools.anyio_service import background_trio_service
from multiaddr import Multiaddr

from p2ptrain.net import known_records
from p2ptrain.net.host import full_addrs, make_host
from p2ptrain.net.known_records import OWN_RECORD_S, REFRESH_S, KnownRecords, OwnRecord
from tests.net.test_safe_pubsub import make_pubsub
from tests.net.trio_run import run


class _Host:
    """What the record check uses of a host: its peerstore."""

    def __init__(self) -> None:
        self.peerstore = PeerStore()

    def get_peerstore(self) -> PeerStore:
        return self.peerstore


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _peer(seed: int) -> tuple[ID, Any]:
    key_pair = create_new_key_pair(bytes([seed]) * 32)
    return ID.from_pubkey(key_pair.public_key), key_pair.private_key


def _rpc(peer: ID, private_key: Any, port: int, seq: int) -> RPC:
    record = PeerRecord(peer, [Multiaddr(f"/ip4/127.0.0.1/tcp/{port}")], seq)
    return RPC(senderRecord=seal_record(record, private_key).marshal_envelope())


def _take(known: KnownRecords, rpc: RPC, host: object, peer: ID) -> bool:
    return known.consume(rpc, cast(IHost, host), peer)


def _counting() -> tuple[list[bytes], KnownRecords, _Clock]:
    checked: list[bytes] = []

    def consume(rpc: RPC, host: object, peer: ID) -> bool:
        checked.append(rpc.senderRecord)
        return maybe_consume_signed_record(rpc, cast(IHost, host), peer)

    clock = _Clock()
    return checked, KnownRecords(consume, clock), clock


def test_a_replayed_record_is_checked_once_and_a_modified_one_is_rejected() -> None:
    host, (peer, key) = _Host(), _peer(1)
    checked, known, _ = _counting()
    rpc = _rpc(peer, key, 4001, seq=1)
    for _ in range(5):
        assert _take(known, rpc, host, peer)
    assert len(checked) == 1 and known.skipped == 4
    assert [str(a) for a in host.peerstore.addrs(peer)] == ["/ip4/127.0.0.1/tcp/4001"]

    forged = bytearray(rpc.senderRecord)
    forged[-1] ^= 1  # the signature's last byte
    assert not _take(known, RPC(senderRecord=bytes(forged)), host, peer)
    assert len(checked) == 2
    # the forged bytes made us forget the known record: the next copy is checked again
    assert _take(known, rpc, host, peer)
    assert len(checked) == 3


def test_another_senders_copy_of_a_known_record_is_checked_and_refused() -> None:
    host, (peer, key), (other, _) = _Host(), _peer(1), _peer(2)
    checked, known, _ = _counting()
    rpc = _rpc(peer, key, 4001, seq=1)
    assert _take(known, rpc, host, peer)
    assert not _take(known, rpc, host, other)
    assert len(checked) == 2


def test_a_new_or_superseded_record_takes_the_full_check() -> None:
    host, (peer, key) = _Host(), _peer(1)
    checked, known, _ = _counting()
    old, new = _rpc(peer, key, 4001, seq=1), _rpc(peer, key, 4002, seq=2)
    assert _take(known, old, host, peer)
    assert _take(known, new, host, peer)
    # the older record is refused by the library (a lower seq), as it was without the table
    assert not _take(known, old, host, peer)
    assert len(checked) == 3
    assert [str(a) for a in host.peerstore.addrs(peer)] == ["/ip4/127.0.0.1/tcp/4002"]


def test_a_known_record_is_consumed_again_when_stale_or_lost_by_the_peerstore() -> None:
    host, (peer, key) = _Host(), _peer(1)
    checked, known, clock = _counting()
    rpc = _rpc(peer, key, 4001, seq=1)
    assert _take(known, rpc, host, peer)
    clock.now += REFRESH_S
    assert _take(known, rpc, host, peer)
    assert len(checked) == 2  # the refresh renews its addresses' TTL
    host.peerstore.clear_addrs(peer)  # the peerstore dropped them: the record is taken again
    assert _take(known, rpc, host, peer)
    assert len(checked) == 3
    assert host.peerstore.addrs(peer)


def test_an_rpc_without_a_record_passes_unchecked() -> None:
    checked, known, _ = _counting()
    assert _take(known, RPC(), _Host(), _peer(1)[0])
    assert checked == []


def test_our_own_record_is_issued_once_per_interval() -> None:
    issued: list[int] = []

    def issue(host: IHost) -> tuple[bytes, bool]:
        issued.append(1)
        return f"record {len(issued)}".encode(), True

    clock = _Clock()
    own = OwnRecord(issue, clock)
    assert own.bytes_for(cast(IHost, _Host())) == (b"record 1", True)
    assert own.bytes_for(cast(IHost, _Host())) == (b"record 1", False)
    clock.now += OWN_RECORD_S
    assert own.bytes_for(cast(IHost, _Host())) == (b"record 2", True)
    assert len(issued) == 2


def test_real_hosts_check_a_senders_record_once_for_many_messages() -> None:
    """Two hosts of make_host on loopback, GossipSub between them: every RPC carries the
    sender's record; all 10 messages arrive, and the receiver took the full check of the
    sender's record once (the first RPC), not once per RPC."""

    async def scenario() -> tuple[int, int]:
        a, b = make_host(os.urandom(32)), make_host(os.urandom(32))
        sender, receiver = make_pubsub(a), make_pubsub(b)
        listen = [Multiaddr("/ip4/127.0.0.1/tcp/0")]
        async with (
            a.run(listen_addrs=listen),
            b.run(listen_addrs=listen),
            background_trio_service(sender),
            background_trio_service(sender.router),  # type: ignore[arg-type]
            background_trio_service(receiver),
            background_trio_service(receiver.router),  # type: ignore[arg-type]
        ):
            await sender.wait_until_ready()
            await receiver.wait_until_ready()
            subscription = await receiver.subscribe("t")
            await sender.subscribe("t")
            await a.connect(info_from_p2p_addr(Multiaddr(full_addrs(b)[0])))
            known = known_records.of(b)
            assert known is not None
            with trio.fail_after(20):
                i = 0
                got: set[bytes] = set()
                while len(got) < 10:  # until the mesh forms, a publish may reach nobody
                    await sender.publish("t", f"message {i}".encode())
                    i += 1
                    with trio.move_on_after(0.2):
                        while len(got) < 10:
                            got.add((await subscription.get()).data)
            return len(got), known.skipped

    received, skipped = run(scenario)
    assert received == 10
    assert skipped >= 9  # the 10 RPCs carried a record known since the first RPC
