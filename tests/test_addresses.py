"""Listen and announce addresses: `join`'s and `bootstrap`'s defaults, what a 0.0.0.0 listener
tells others to dial, and what `--announce` / `--announce-data` make of the data plane's."""

from __future__ import annotations

import argparse
import socket

import pytest

from p2ptrain import addresses
from p2ptrain.cli import bootstrap_cmd, join_cmd
from p2ptrain.errors import UserError
from p2ptrain.node.settings import NodeSettings
from p2ptrain.node.supervisor import Supervisor
from p2ptrain.records import PeerRecord

PEER = "12D3KooWK99VoVxNE7XzyBwXEzW7xhK7Gpv85r9F3V3fyKSUKPH5"


def parse(module: object, *argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)  # type: ignore[attr-defined]
    return parser.parse_args(list(argv))


def test_join_and_bootstrap_listen_on_every_interface_on_fixed_ports_by_default() -> None:
    join = parse(join_cmd, "--bootstrap", f"/ip4/1.2.3.4/tcp/7400/p2p/{PEER}")
    boot = parse(bootstrap_cmd, "--identity", "k")
    assert (boot.listen, join.listen, join.data_listen) == (
        "/ip4/0.0.0.0/tcp/7400",
        "/ip4/0.0.0.0/tcp/7401",
        "/ip4/0.0.0.0/tcp/7402",
    )  # three ports: a bootstrap and a join side by side on one machine
    assert join.announce == join.announce_data == boot.announce == []
    join = parse(
        join_cmd,
        "--bootstrap",
        "b",
        "--listen",
        "/ip4/0.0.0.0/tcp/9001",
        "--announce",
        "/ip4/203.0.113.7/tcp/9001",
        "/dns4/node.example.org/tcp/9001",
        "--announce-data",
        "/ip4/203.0.113.7/tcp/9002",
    )
    assert join.announce == ["/ip4/203.0.113.7/tcp/9001", "/dns4/node.example.org/tcp/9001"]
    assert join.announce_data == ["/ip4/203.0.113.7/tcp/9002"]


def test_a_wildcard_listener_announces_the_interfaces_never_0_0_0_0() -> None:
    wildcard = f"/ip4/0.0.0.0/tcp/7401/p2p/{PEER}"
    assert addresses.expand([wildcard], ["10.0.0.5", "192.168.1.9"]) == [
        f"/ip4/10.0.0.5/tcp/7401/p2p/{PEER}",
        f"/ip4/192.168.1.9/tcp/7401/p2p/{PEER}",
    ]
    # no other interface: loopback, so that a lone machine still works
    assert addresses.expand(["/ip4/0.0.0.0/tcp/7401"], []) == ["/ip4/127.0.0.1/tcp/7401"]
    # a loopback listener announces loopback (a local swarm); a specific host stays itself
    assert addresses.expand(["/ip4/127.0.0.1/tcp/5000"], ["10.0.0.5"]) == [
        "/ip4/127.0.0.1/tcp/5000"
    ]
    assert addresses.expand(["/ip4/10.0.0.5/tcp/5000"], ["10.0.0.6"]) == ["/ip4/10.0.0.5/tcp/5000"]


def test_what_p2pd_reports_for_a_wildcard_listener_loses_its_loopback() -> None:
    reported = ["/ip4/127.0.0.1/tcp/7402", "/ip4/10.77.0.3/tcp/7402"]
    assert addresses.expand(reported, ["10.77.0.3"]) == ["/ip4/10.77.0.3/tcp/7402"]


def test_expansion_stays_a_valid_peer_record() -> None:
    many = [f"10.0.{i}.1" for i in range(40)]
    announced = addresses.expand(["/ip4/0.0.0.0/tcp/7401"], many)
    record = PeerRecord(tuple(announced), "trainer", True, "1", {}, data_addrs=tuple(announced))
    assert PeerRecord.from_dict(record.to_dict()) == record  # at most MAX_ADDRS, each valid


def test_the_machines_interfaces_exclude_loopback_and_link_local() -> None:
    for ip in addresses.interface_ip4s():
        assert not ip.startswith(("127.", "169.254.", "0."))


def test_the_data_plane_announces_the_control_planes_hosts_on_its_own_port() -> None:
    announce = ("/ip4/203.0.113.7/tcp/7401", "/dns4/node.example.org/tcp/7401")
    assert addresses.data_announce(announce, (), 7402) == (
        "/ip4/203.0.113.7/tcp/7402",
        "/dns4/node.example.org/tcp/7402",
    )
    explicit = ("/ip4/198.51.100.1/tcp/9000",)
    assert addresses.data_announce(announce, explicit, 7402) == explicit
    assert addresses.data_announce((), (), 7402) == ()  # the worker expands what p2pd reports
    with pytest.raises(UserError, match="fixed --data-listen port"):
        addresses.data_announce(announce, (), 0)


@pytest.mark.parametrize(
    "announce",
    [["not-an-address"], ["/ip4/1.2.3.4/tcp/0"], ["/ip4/1.2.3.4/udp/5"], ["/ip4/999.1.1.1/tcp/1"]],
)
def test_addresses_nobody_could_dial_are_refused(announce: list[str]) -> None:
    with pytest.raises(UserError):
        addresses.check_announce(announce, "--announce")


def test_join_hands_its_addresses_to_both_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(addresses, "listen_problem", lambda host, port: None)  # whatever holds them
    supervisor = Supervisor(
        NodeSettings(
            bootstrap="b",
            identity="k",
            listen="/ip4/0.0.0.0/tcp/7401",
            control_only=False,
            data_listen="/ip4/0.0.0.0/tcp/7402",
            announce=("/ip4/203.0.113.7/tcp/7401",),
        )
    )
    assert (supervisor.data_host, supervisor.data_port) == ("0.0.0.0", 7402)
    assert supervisor.data_announce == ("/ip4/203.0.113.7/tcp/7402",)
    with pytest.raises(UserError, match="--data-listen"):
        Supervisor(NodeSettings("b", "/ip4/0.0.0.0/tcp/7401", data_listen="/ip6/::/tcp/1"))


def test_an_ip_literal_is_told_from_a_name() -> None:
    assert addresses.is_ip("10.0.0.1") and addresses.is_ip("::1")
    assert addresses.is_ip("10.0.0.1", 4) and not addresses.is_ip("::1", 4)
    assert not addresses.is_ip("localhost") and not addresses.is_ip("010.0.0.1")


def test_a_port_another_node_listens_on_is_refused_in_one_line() -> None:
    """py-libp2p and p2pd listen with SO_REUSEPORT: a second node on a taken port started
    beside the first, each getting some of its connections, and nothing said so."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as first:
        first.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)  # as py-libp2p's listener
        first.bind(("127.0.0.1", 0))
        first.listen()
        port = first.getsockname()[1]
        with pytest.raises(UserError, match=f"port {port} is in use.*its own port"):
            addresses.check_can_listen(f"/ip4/127.0.0.1/tcp/{port}", "--listen")
    addresses.check_can_listen(f"/ip4/127.0.0.1/tcp/{port}", "--listen")  # free again
    addresses.check_can_listen("/ip4/0.0.0.0/tcp/0", "--listen")  # any port: never taken
    with pytest.raises(UserError, match=r"192\.0\.2\.7 is not an address of this machine"):
        addresses.check_can_listen("/ip4/192.0.2.7/tcp/17500", "--listen")
