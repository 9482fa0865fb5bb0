"""A node's own reachability verdict (issue 26, finding 10): "public" needs the bootstrap and a
second server on another network; one stranger saying "reached" flips nothing. Pure rules,
then a live round on loopback against a hostile dial-back server."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any

import pytest
import trio
from libp2p.abc import INetStream
from libp2p.peer.peerinfo import info_from_p2p_addr
from multiaddr import Multiaddr

from p2ptrain.control.membership import Member
from p2ptrain.control.reachability import (
    FIRST_RETRY_S,
    RECHECK_INTERVAL_S,
    RETRY_INTERVAL_S,
    Opinion,
    ReachabilityMonitor,
    retry_delay_s,
    verdict_of,
)
from p2ptrain.control.state import NodeState
from p2ptrain.control.view import SwarmView
from p2ptrain.net.framing import read_frame, write_frame
from p2ptrain.net.host import full_addrs, make_host
from p2ptrain.records import DialBackReply, DialResult, PeerRecord
from p2ptrain.traversal import dialback
from tests.net.trio_run import run
from tests.records.samples import peer_dict

BOOT = Opinion("boot", "198.51.0.0/24", True, is_bootstrap=True)
BOOT_NO = dataclasses.replace(BOOT, reached=False)
BOOT_SILENT = dataclasses.replace(BOOT, reached=None, network=None)
OTHER = Opinion("other", "8.8.8.0/24", True)
SAME_NET = Opinion("neighbour", "198.51.0.0/24", True)  # the bootstrap's /24
SPLICED = Opinion("routed", None, True)  # seen through one of our routes: whose, unknown
HOSTILE = Opinion("hostile", "9.9.9.0/24", True)
NO = Opinion("no", "8.8.8.0/24", False)
NO_ELSEWHERE = Opinion("no-elsewhere", "9.9.9.0/24", False)


@pytest.mark.parametrize(
    ("opinions", "verdict"),
    [
        ([BOOT, OTHER], "public"),
        ([BOOT], "unknown"),  # one opinion is not enough: wait for a second server
        ([BOOT, SAME_NET], "unknown"),  # two peers, one network
        ([BOOT, SPLICED], "unknown"),
        ([BOOT, NO], "unknown"),  # a stranger's "no" flips nothing either: the last verdict stays
        ([HOSTILE], "unknown"),  # one stranger's "reached"
        ([HOSTILE, OTHER], "unknown"),  # strangers only: the bootstrap never vouched
        ([BOOT_NO, HOSTILE], "private"),  # the bootstrap could not reach us: private stands
        ([BOOT_NO, HOSTILE, OTHER], "private"),
        ([BOOT_SILENT, HOSTILE], "unknown"),
        ([BOOT_NO], "private"),
        ([NO], "unknown"),  # one member's "no" without the bootstrap's: it may lie
        ([NO, NO_ELSEWHERE], "private"),  # two on independent networks, and none reached us
        ([NO, dataclasses.replace(NO, peer="no2")], "unknown"),  # two on one network
        ([NO, dataclasses.replace(NO_ELSEWHERE, network=None)], "unknown"),  # whose, unknown
        ([], "unknown"),
    ],
)
def test_verdicts_of_a_joined_node(opinions: list[Opinion], verdict: str) -> None:
    assert verdict_of(opinions, am_bootstrap=False, one_machine=False) == verdict


def test_verdicts_on_one_machine_and_of_the_bootstrap() -> None:
    loop = Opinion("boot", "127.0.0.1", True, is_bootstrap=True)
    assert verdict_of([loop], am_bootstrap=False, one_machine=True) == "public"
    assert verdict_of([HOSTILE], am_bootstrap=False, one_machine=True) == "unknown"
    # the bootstrap asks others only: two networks (one on one machine)
    assert verdict_of([OTHER], am_bootstrap=True, one_machine=False) == "unknown"
    assert verdict_of([OTHER, HOSTILE], am_bootstrap=True, one_machine=False) == "public"
    assert verdict_of([OTHER], am_bootstrap=True, one_machine=True) == "public"
    # and no member alone makes it private: two on independent networks (any two on one machine)
    assert verdict_of([NO], am_bootstrap=True, one_machine=False) == "unknown"
    assert verdict_of([NO, NO_ELSEWHERE], am_bootstrap=True, one_machine=False) == "private"
    two = [NO, dataclasses.replace(NO, peer="no2", network="127.0.0.1")]
    assert verdict_of(two, am_bootstrap=True, one_machine=True) == "private"
    assert verdict_of([NO], am_bootstrap=True, one_machine=True) == "unknown"


def test_inconclusive_rounds_come_back_sooner_then_every_thirty_seconds() -> None:
    delays = [retry_delay_s(n) for n in range(6)]
    assert delays == [RECHECK_INTERVAL_S, FIRST_RETRY_S, 10.0, 20.0, RETRY_INTERVAL_S, 30.0]


async def _always_reached(stream: INetStream) -> None:
    """A hostile dial-back server: "reached" without dialling anything."""
    request = json.loads(await read_frame(stream, dialback.MAX_REQUEST_BYTES))
    reply = DialBackReply(
        "/ip4/127.0.0.1/tcp/1", (DialResult(request["addrs"][0], True),), time.time()
    )
    await write_frame(stream, json.dumps(reply.to_dict()).encode())
    await stream.close()


def test_one_hostile_server_saying_reached_does_not_make_a_node_public() -> None:
    """The node claims a port nobody listens on: the bootstrap's dial-back fails, the hostile
    server says it reached us anyway (today's rule: any "reached" is public)."""

    async def scenario() -> Any:
        me, boot, hostile = (make_host(os.urandom(32)) for _ in range(3))
        loopback = [Multiaddr("/ip4/127.0.0.1/tcp/0")]
        async with (
            me.run(listen_addrs=loopback),
            boot.run(listen_addrs=loopback),
            hostile.run(listen_addrs=loopback),
        ):
            server = dialback.DialBackServer(lambda: full_addrs(boot))
            boot.set_stream_handler(dialback.DIALBACK_PROTOCOL, server.handle)
            hostile.set_stream_handler(dialback.DIALBACK_PROTOCOL, _always_reached)
            for other in (boot, hostile):
                await me.connect(info_from_p2p_addr(Multiaddr(full_addrs(other)[0])))
            my_id = me.get_id().to_base58()
            view = SwarmView(
                self_id=my_id,
                role="control-only",
                planner_capable=False,
                started_at=0.0,
                bootstrap_id=boot.get_id().to_base58(),
            )
            record = PeerRecord.from_dict({**peer_dict(), "reachability": "public"})
            view.members[hostile.get_id().to_base58()] = Member(record, 0.0)
            state = NodeState(b"\0" * 32, "control-only", my_id, me, view, {})
            with trio.socket.socket() as sock:  # a port with nothing listening: unreachable
                await sock.bind(("127.0.0.1", 0))
                state.addrs = [f"/ip4/127.0.0.1/tcp/{sock.getsockname()[1]}/p2p/{my_id}"]
            monitor = ReachabilityMonitor(state)
            return monitor.servers(), await monitor.check_once(), boot, hostile

    servers, verdict, boot, hostile = run(scenario)
    assert servers == [boot.get_id().to_base58(), hostile.get_id().to_base58()]
    assert verdict == "private"
