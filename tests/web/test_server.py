"""The dashboard's HTTP server on a real socket: its JSON, its Prometheus text, its limits."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import socket
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from p2ptrain.errors import UserError
from p2ptrain.records import SwarmStatus
from p2ptrain.web.server import Dashboard, DashboardServer, parse_http_address
from tests.web.synthetic import swarm


def _get(url: str, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, dict(reply.headers), reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), b""


def _get_within(url: str, timeout_s: float) -> int:
    """The status of a GET of `url`, tried until one is answered or timeout_s passed (a reset
    connection: every slot still held)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return _get(url)[0]
        except (urllib.error.URLError, ConnectionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_status_is_the_status_record_and_history_follows(
    served: tuple[DashboardServer, Dashboard],
) -> None:
    server, dashboard = served
    assert _get(server.url + "api/status")[2] == b"null"  # nothing yet
    status = swarm(8)
    dashboard.update(status, 1000.0)
    code, headers, body = _get(server.url + "api/status")
    assert code == 200 and headers["Content-Type"] == "application/json"
    assert SwarmStatus.from_dict(json.loads(body)) == status
    history = json.loads(_get(server.url + "api/history")[2])
    assert [e["kind"] for e in history["events"]][-2:] == ["election", "plan"]
    assert history["points"][0]["step"] == 10


def test_the_page_and_its_assets_come_from_the_node(
    served: tuple[DashboardServer, Dashboard],
) -> None:
    server, _ = served
    code, headers, page = _get(server.url)
    assert code == 200 and headers["Content-Type"].startswith("text/html")
    assert b'src="/app.js"' in page and b"http" not in page.replace(b"http-equiv", b"")
    assert "default-src 'self'" in headers["Content-Security-Policy"]
    for asset in ("app.js", "style.css"):
        assert _get(server.url + asset)[0] == 200


def test_metrics_parse_with_prometheus_own_parser(
    served: tuple[DashboardServer, Dashboard],
) -> None:
    server, dashboard = served
    status = swarm(8)
    dashboard.update(status, 1000.0)
    code, headers, body = _get(server.url + "metrics")
    assert code == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    value = {
        f: {tuple(sorted(s.labels.items())): s.value for s in families[f].samples} for f in families
    }
    assert value["p2ptrain_peers"][(("state", "alive"),)] == 8
    assert value["p2ptrain_planner_term"][()] == 1 and value["p2ptrain_plan_epoch"][()] == 1
    assert value["p2ptrain_finished"][()] == 0  # the run trains
    assert value["p2ptrain_step"][()] == 10 and value["p2ptrain_loss"][()] == pytest.approx(4.9)
    assert value["p2ptrain_plan_step_seconds"] == {
        (("kind", "measured"),): 0.5,
        (("kind", "predicted"),): 0.55,
    }
    peer = status.peers[5].id
    rounds = families["p2ptrain_averaging_rounds"].samples
    assert {
        (s.labels["peer"], s.labels["outcome"], s.value) for s in rounds if s.labels["peer"] == peer
    } == {(peer, "averaged", 10.0)}
    sent = {
        (s.labels["peer"], s.labels["plane"]): s.value
        for s in families["p2ptrain_sent_bytes"].samples
    }
    assert sent[(peer, "data")] == 5000 and sent[(peer, "control")] == 50
    assert len(families["p2ptrain_link_rtt_seconds"].samples) == 28
    dashboard.update(dataclasses.replace(status, finished=True), 1001.0)
    finished = _get(server.url + "metrics")[2].decode()
    assert "\np2ptrain_finished 1.0\n" in finished
    assert len(families["p2ptrain_link_rate_bits_per_second"].samples) == 28


def test_read_only_and_nothing_else(served: tuple[DashboardServer, Dashboard]) -> None:
    server, _ = served
    assert _get(server.url + "nope")[0] == 404
    assert _get(server.url + "../../etc/passwd")[0] == 404
    assert _get(server.url + "api/status", method="POST")[0] == 501
    assert _get(server.url + "api/status", method="DELETE")[0] == 501
    code, _headers, body = _get(server.url + "api/status", method="HEAD")
    assert code == 200 and body == b""


def test_idle_connections_are_capped(served: tuple[DashboardServer, Dashboard]) -> None:
    from p2ptrain.web import server as module

    server, _ = served
    idle = [
        socket.create_connection(server.address, timeout=5) for _ in range(module.MAX_CONNECTIONS)
    ]
    try:
        extra = socket.create_connection(server.address, timeout=5)
        extra.sendall(b"GET /api/status HTTP/1.1\r\nHost: x\r\n\r\n")
        assert extra.recv(100) == b""  # refused: closed without an answer
        extra.close()
    finally:
        for s in idle:
            s.close()
    assert _get(server.url + "api/status")[0] == 200  # served again once they are gone


def test_http_addresses() -> None:
    assert parse_http_address("8080") == ("127.0.0.1", 8080)
    assert parse_http_address("0.0.0.0:80") == ("0.0.0.0", 80)
    assert parse_http_address("[::1]:9000") == ("::1", 9000)
    for bad in ("", "x", "host:", "8o80"):
        with pytest.raises(UserError, match="expected PORT or HOST:PORT"):
            parse_http_address(bad)
    for bad in ("99999", "1:99999", "-1"):
        with pytest.raises(UserError, match="out of range"):
            parse_http_address(bad)


def test_a_port_in_use_is_one_line(served: tuple[DashboardServer, Dashboard]) -> None:
    server, _ = served
    with pytest.raises(UserError, match="cannot listen"):
        DashboardServer(Dashboard(), "127.0.0.1", server.address[1])


# issue 26, the dashboard's low findings: the Host header (DNS rebinding) and slow clients


def _raw(address: tuple[str, int], request: bytes) -> int:
    """The status code of one raw request (HTTP/1.1, closed after the reply)."""
    with socket.create_connection(address, timeout=10) as conn:
        conn.sendall(request)
        head = conn.recv(64)
    return int(head.split(b" ", 2)[1])


def test_only_a_host_that_names_this_server_is_answered() -> None:
    dashboard = Dashboard()
    server = DashboardServer(dashboard, "127.0.0.1", 0, names=("dash.example.org",))
    server.start()
    port = server.address[1]
    try:
        for host, code in (
            (f"127.0.0.1:{port}", 200),
            (f"localhost:{port}", 200),
            (f"LOCALHOST:{port}", 200),
            (f"[::1]:{port}", 200),
            ("dash.example.org", 200),  # a configured name, e.g. a reverse proxy's
            ("dash.example.org:443", 200),
            (f"evil.example:{port}", 421),  # a rebound name: refused
            ("evil.example", 421),
            (f"127.0.0.1.evil.example:{port}", 421),
            (f"127.0.0.1:{port + 1}", 421),
            ("127.0.0.1", 421),  # port 80 implied: not ours
            (f"127.0.0.1:{port}:{port}", 421),
            ("[::1", 421),
            ("", 421),
        ):
            request = f"GET /api/status HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
            assert _raw(server.address, request.encode()) == code, host
        no_host = b"GET /api/status HTTP/1.0\r\n\r\n"
        assert _raw(server.address, no_host) == 421
    finally:
        server.stop()


def test_host_header_rules() -> None:
    from p2ptrain.web.server import host_allowed, parse_http_option, split_host_header

    assert split_host_header("[::1]:80") == ("::1", 80)
    assert split_host_header("Example.ORG.:8080") == ("example.org", 8080)
    assert split_host_header("a:b") is None and split_host_header(":80") is None
    assert host_allowed("10.1.2.3:8080", 8080, frozenset())  # any IP literal: no name to rebind
    assert not host_allowed("10.1.2.3.nip.io:8080", 8080, frozenset())
    assert host_allowed("node.lan:8080", 8080, frozenset({"node.lan"}))
    option = parse_http_option("0.0.0.0:8080,Dash.Example.org.")
    assert (option.host, option.port, option.names) == ("0.0.0.0", 8080, ("dash.example.org",))
    for bad in ("8080,", "8080,a:1", "8080,a b"):
        with pytest.raises(UserError):
            parse_http_option(bad)


def test_slow_clients_are_reset_and_never_hold_a_slot() -> None:
    from p2ptrain.web import server as module

    dashboard = Dashboard()
    dashboard.update(swarm(100), 1.0)  # a status of ~1 MB
    size = len(dashboard.snapshot.status)
    limits = module.Limits(request_deadline_s=1.0, min_read_bytes_per_s=1e6)
    server = DashboardServer(dashboard, "127.0.0.1", 0, limits=limits)
    server.start()
    host = f"Host: 127.0.0.1:{server.address[1]}\r\n"
    try:
        # one trickles its request a byte every 0.2 s: closed at its deadline all the same
        trickle = socket.create_connection(server.address, timeout=5)
        started = time.monotonic()
        # every other slot taken by a request that never ends (old: held for 10 s per byte sent)
        stuck = [socket.create_connection(server.address, timeout=5) for _ in range(31)]
        for conn in stuck:
            conn.sendall(b"GET /api/status HTTP/1.1\r\n" + host.encode())
        closed_after = None
        for byte in b"GET /api/status HTTP/1.1\r\n" + b"X" * 30:
            try:
                trickle.sendall(bytes([byte]))
            except OSError:
                closed_after = time.monotonic() - started
                break
            time.sleep(0.2)
        assert closed_after is not None and closed_after < 3, "a trickled request stayed open"
        assert closed_after > 0.8, "the trickle was refused, not closed at its deadline"
        # the stuck ones reach their deadline as well: the slots come back (polled: a loaded
        # machine runs their timers late)
        assert _get_within(server.url + "api/status", 5.0) == 200, "slow clients hold the slots"
        # one reads the reply 20 kB/s: reset long before it has the ~1 MB
        reader = socket.socket()
        reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        reader.settimeout(5)
        reader.connect(server.address)
        reader.sendall(b"GET /api/status HTTP/1.1\r\n" + host.encode() + b"\r\n")
        received, started = 0, time.monotonic()
        with contextlib.suppress(OSError):  # reset: what we want
            while time.monotonic() - started < 10:
                chunk = reader.recv(1024)
                if not chunk:
                    break
                received += len(chunk)
                time.sleep(0.05)
        assert received < size and time.monotonic() - started < 6, "a slow reader was served on"
        for conn in (*stuck, trickle, reader):
            conn.close()
    finally:
        server.stop()


def test_a_get_with_a_body_ends_its_connection() -> None:
    """The body was never read, and on a kept-alive connection it was parsed as the next
    request: one request, two answers (a smuggled one, behind a proxy pooling connections)."""
    dashboard = Dashboard()
    dashboard.update(swarm(2), 1.0)
    server = DashboardServer(dashboard, "127.0.0.1", 0)
    server.start()
    host = f"127.0.0.1:{server.address[1]}"
    try:
        smuggled = f"GET /metrics HTTP/1.1\r\nHost: {host}\r\n\r\n"
        for lengths in (f"{len(smuggled)}", f"0\r\nContent-Length: {len(smuggled)}"):
            request = (
                f"GET /api/status HTTP/1.1\r\nHost: {host}\r\n"
                f"Content-Length: {lengths}\r\n\r\n{smuggled}"
            )
            with socket.create_connection(server.address, timeout=5) as conn:
                conn.sendall(request.encode())
                received = b""
                with contextlib.suppress(OSError):
                    while chunk := conn.recv(65536):
                        received += chunk
            assert received.count(b"HTTP/1.1 200") == 1  # was 2
    finally:
        server.stop()


def test_one_source_other_than_loopback_holds_at_most_its_share_of_the_slots() -> None:
    """An exposed dashboard's 32 connections had no cap per source: one client polling on
    kept-alive connections held them all. Loopback (this machine's viewers) is exempt."""
    from p2ptrain.web import client_limits as module

    server = DashboardServer(Dashboard(), "127.0.0.1", 0)
    sources = server._server.sources  # the socketserver's own shares
    remote = ("198.51.100.7", 4000)
    taken = [sources.take(remote) for _ in range(module.MAX_CONNECTIONS_PER_SOURCE + 2)]
    assert taken.count(True) == module.MAX_CONNECTIONS_PER_SOURCE
    assert sources.take(("198.51.100.8", 4000))  # another source has its own share
    sources.give(remote)
    assert sources.take(remote)  # one ended: room for one more
    assert all(sources.take(("127.0.0.1", 5000)) for _ in range(40))


def test_a_loopback_viewer_of_a_dual_stack_listen_is_loopback() -> None:
    from p2ptrain.web.client_limits import is_loopback

    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("::ffff:127.0.0.1")
    assert not is_loopback("198.51.100.7") and not is_loopback("::ffff:198.51.100.7")
    assert not is_loopback("not an address")


def test_a_request_head_past_its_bound_is_not_read_on() -> None:
    """The standard library reads up to 100 header lines of 64 KiB and parses them whole (~6 MB
    a connection, 32 connections); the head's bytes are bounded now, and the answer comes at
    once instead of at the request's deadline."""
    from p2ptrain.web import client_limits as module

    dashboard = Dashboard()
    dashboard.update(swarm(2), 1.0)
    server = DashboardServer(dashboard, "127.0.0.1", 0)
    server.start()
    try:
        with socket.create_connection(server.address, timeout=5) as conn:
            started = time.monotonic()
            reply = b""
            with contextlib.suppress(OSError):  # a reset, the unread rest discarded: as good
                conn.sendall(b"GET /api/status HTTP/1.1\r\n")
                for n in range(4):  # 4 x 16 KiB of headers, and no end to them
                    filler = b"a" * module.MAX_REQUEST_HEAD_BYTES
                    conn.sendall(f"X-Filler-{n}: ".encode() + filler + b"\r\n")
                reply = conn.recv(4096) or b"closed"
            waited_s = time.monotonic() - started
        assert reply in (b"", b"closed") or reply.startswith(b"HTTP/1.1 4"), reply[:40]
        assert waited_s < 2.0  # was the request's 5 s deadline, the bytes parsed whole
        assert _get(server.url + "api/status")[0] == 200  # an honest request is still answered
    finally:
        server.stop()
