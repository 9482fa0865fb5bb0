"""The operator's /dns addresses are resolved as this machine resolves names (net/resolve.py):
py-libp2p's dnspython never read /etc/hosts. Only `localhost` is used here: /etc/hosts answers
it, so no DNS query leaves the machine."""

from __future__ import annotations

import os
import socket

import pytest
import trio
from libp2p.peer.peerinfo import info_from_p2p_addr
from multiaddr import Multiaddr

from p2ptrain.net.host import full_addrs, make_host
from p2ptrain.net.resolve import (
    CannotResolve,
    addresses_of,
    connect_operator_peer,
    resolve_address,
)
from tests.net.trio_run import run

PEER = "12D3KooWGRUVh7mYxoGnY4ZyURVi7brDTbQpyXQ2emsyeUyyULQY"
LISTEN = [Multiaddr("/ip4/127.0.0.1/tcp/0")]


def test_a_name_in_the_hosts_file_resolves_and_an_ip_stays_as_it_is() -> None:
    resolved = run(lambda: resolve_address(f"/dns4/localhost/tcp/7400/p2p/{PEER}"))
    assert resolved == [f"/ip4/127.0.0.1/tcp/7400/p2p/{PEER}"]
    assert run(lambda: resolve_address("/ip4/10.0.0.1/tcp/1")) == ["/ip4/10.0.0.1/tcp/1"]


def test_a_name_that_cannot_resolve_says_so_without_asking_anyone() -> None:
    # a label past 63 characters is no host name: refused before any query is made
    name = "a" * 64 + ".example"
    with pytest.raises(CannotResolve, match=f"cannot resolve '{name}'"):
        run(lambda: resolve_address(f"/dns4/{name}/tcp/7400"))


def test_a_peer_named_by_a_hosts_file_name_is_reached() -> None:
    async def scenario() -> bool:
        server, client = make_host(os.urandom(32)), make_host(os.urandom(32))
        async with server.run(listen_addrs=LISTEN), client.run(listen_addrs=LISTEN):
            port = full_addrs(server)[0].split("/")[4]
            named = f"/dns4/localhost/tcp/{port}/p2p/{server.get_id().to_base58()}"
            with trio.fail_after(10):
                await connect_operator_peer(client, info_from_p2p_addr(Multiaddr(named)))
            return server.get_id() in client.get_network().connections

    assert run(scenario)


def test_both_families_are_kept_and_a_scoped_address_is_skipped() -> None:
    v4, v6 = socket.AF_INET, socket.AF_INET6
    infos = [
        *((v6, 1, 6, "", (f"2001:db8::{i}", 7400, 0, 0)) for i in range(1, 6)),
        (v6, 1, 6, "", ("fe80::1%eth0", 7400, 0, 2)),  # link-local: no multiaddr has a scope
        (v4, 1, 6, "", ("192.0.2.1", 7400)),
        (v4, 1, 6, "", ("192.0.2.1", 7400)),  # once
    ]
    assert addresses_of(infos, "tcp/7400") == [
        "/ip4/192.0.2.1/tcp/7400",
        "/ip6/2001:db8::1/tcp/7400",
        "/ip6/2001:db8::2/tcp/7400",
        "/ip6/2001:db8::3/tcp/7400",
    ]
