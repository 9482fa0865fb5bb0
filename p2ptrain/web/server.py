"""The dashboard's HTTP server: read-only, bounded, every asset served by the node itself.

The control process hands a Dashboard one status document a second (`update`); the server's
threads only ever read the bytes built from the last one, so a request never touches the
control plane's state, costs the bytes it reads, and cannot change anything (GET and HEAD
only). Connections are capped, each request must arrive within a few seconds and its reply be
read at a minimum rate (Limits): a slow client is reset, and never holds a slot. Only Host values that name this
server are answered (an IP literal at our port, localhost, or a configured name): a page on a
stranger's domain rebound to this address (DNS rebinding) gets 421, not the swarm's status.
Nothing secret is in a status document (peer ids, addresses, measurements, losses). Every number
is finite in the JSON, whatever peers report. Stdlib http.server: no framework, no build step.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import struct
import threading
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any

from p2ptrain.addresses import is_ip
from p2ptrain.errors import UserError
from p2ptrain.records import SwarmStatus
from p2ptrain.web.client_limits import (
    MAX_CONNECTIONS,
    MAX_REQUEST_HEAD_BYTES,
    SOCKET_TIMEOUT_S,
    BoundedLines,
    Limits,
    SourceShares,
)
from p2ptrain.web.history import SwarmHistory, clamped, measured_step_s
from p2ptrain.web.metrics import metrics_text

log = logging.getLogger(__name__)

DEFAULT_LIMITS = Limits()

DEFAULT_HOST = "127.0.0.1"
PROMETHEUS_TYPE = "text/plain; version=0.0.4; charset=utf-8"
STATIC = {  # path -> (file in p2ptrain/web/static, content type)
    "/": ("index.html", "text/html; charset=utf-8"),
    "/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/style.css": ("style.css", "text/css; charset=utf-8"),
}


@dataclass(frozen=True)
class Snapshot:
    """What the server answers with until the next update."""

    status: bytes  # the status document (`p2ptrain status --json`'s record)
    history: bytes  # points and events (web/history.py)
    metrics: bytes  # Prometheus text format


def finite(value: Any) -> Any:
    """value with every float within the finite range (JSON has no Infinity or NaN)."""
    if isinstance(value, float):
        return clamped(value)
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(item) for item in value]
    return value


def json_bytes(value: Any) -> bytes:
    """Standard JSON, whatever the numbers peers reported."""
    return json.dumps(finite(value), allow_nan=False).encode()


EMPTY = Snapshot(b"null", b'{"points": [], "events": [], "measured_step_s": null}', b"")


class Dashboard:
    """The latest snapshot of this node's view, rebuilt by `update` (one thread writes, many
    read: swapping one reference is atomic)."""

    def __init__(self, history: SwarmHistory | None = None) -> None:
        self.history = history or SwarmHistory()
        self.snapshot = EMPTY
        self.assets = {
            path: (resources.files("p2ptrain.web").joinpath("static", name).read_bytes(), kind)
            for path, (name, kind) in STATIC.items()
        }

    def update(self, status: SwarmStatus, wall: float) -> None:
        self.history.observe(status, wall)
        point = self.history.points[-1] if self.history.points else None
        self.snapshot = Snapshot(
            status=json_bytes(status.to_dict()),
            # the page shows the plan's measured step as this module computes it (one rule)
            history=json_bytes(
                {**self.history.to_dict(), "measured_step_s": measured_step_s(status)}
            ),
            metrics=metrics_text(status, point),
        )


@dataclass(frozen=True)
class HttpOption:
    """`--http [HOST:]PORT[,NAME...]`: where to listen, and the names (besides IP literals and
    localhost) the page may be reached by, e.g. a reverse proxy's."""

    host: str
    port: int
    names: tuple[str, ...] = ()


def parse_http_option(text: str) -> HttpOption:
    address, *names = text.split(",")
    host, port = parse_http_address(address)
    cleaned = tuple(name.strip().lower().rstrip(".") for name in names)
    if any(not name or any(c in name for c in " /:[]@") for name in cleaned):
        raise UserError(f"--http {text!r}: expected [HOST:]PORT[,NAME...] (names without ports)")
    return HttpOption(host, port, cleaned)


def split_host_header(value: str) -> tuple[str, int | None] | None:
    """A Host header's (name or IP, port or None); None if it is not one."""
    value = value.strip().lower()
    if value.startswith("["):  # [v6] or [v6]:port
        name, bracket, rest = value[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            return None
        port_text = rest[1:] if rest else None
    else:
        name, colon, port_text_or_empty = value.partition(":")
        port_text = port_text_or_empty if colon else None
    name = name.rstrip(".")
    if not name:
        return None
    if port_text is None:
        return name, None
    # ASCII digits: str.isdigit() takes "²", which int() refuses
    if not (port_text.isascii() and port_text.isdigit()) or len(port_text) > 5:
        return None
    return name, int(port_text)


def host_allowed(header: str | None, port: int, names: frozenset[str]) -> bool:
    """True if a request's Host names this server: a configured name (any port), or an IP
    literal or localhost at our port. A name we do not know is how DNS rebinding looks."""
    parsed = None if header is None else split_host_header(header)
    if parsed is None:
        return False
    name, given_port = parsed
    if name in names:
        return True
    if name != "localhost" and not is_ip(name):
        return False
    return given_port == port or (given_port is None and port == 80)


def parse_http_address(text: str) -> tuple[str, int]:
    """`PORT` or `HOST:PORT` (the host defaults to 127.0.0.1: exposing the page is a choice);
    names after a comma are parse_http_option's."""
    host, _, port = text.split(",", 1)[0].rpartition(":")
    try:
        number = int(port)
    except ValueError:
        raise UserError(f"--http {text!r}: expected PORT or HOST:PORT") from None
    if not 0 <= number <= 65535:
        raise UserError(f"--http {text!r}: port {number} is out of range (0-65535)")
    return (host.strip("[]") or DEFAULT_HOST), number


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = SOCKET_TIMEOUT_S
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self._answer(with_body=True)

    def do_HEAD(self) -> None:
        self._answer(with_body=False)

    def setup(self) -> None:
        self._deadline: threading.Timer | None = None
        super().setup()
        self.rfile = self._head = BoundedLines(self.rfile)  # type: ignore[assignment]

    def handle_one_request(self) -> None:
        # a deadline for the whole exchange: a trickled request or a reply read a byte at a
        # time would otherwise hold this thread and its slot for as long as the client likes
        self._arm(self.server.limits.request_deadline_s)
        self._head.left = MAX_REQUEST_HEAD_BYTES
        try:
            super().handle_one_request()
        finally:
            if self._deadline is not None:
                self._deadline.cancel()

    def _arm(self, seconds: float) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = threading.Timer(seconds, self._drop)
        self._deadline.daemon = True
        self._deadline.start()

    def _drop(self) -> None:
        self.close_connection = True
        with contextlib.suppress(OSError):
            # the close that follows resets the connection: what the kernel still buffers for
            # a slow reader is discarded, not sent on for as long as it takes
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.shutdown(socket.SHUT_RDWR)  # wakes the handler's recv or send

    def _answer(self, with_body: bool) -> None:
        lengths = self.headers.get_all("Content-Length") or ["0"]
        if [n.strip() for n in lengths] != ["0"] or self.headers.get("Transfer-Encoding"):
            # a GET with a body: never read, it would be parsed as the connection's next
            # request (a smuggled one, behind a proxy that pools connections): the last one
            self.close_connection = True
        if not self.server.host_allowed(self.headers.get("Host")):
            self.send_error(HTTPStatus.MISDIRECTED_REQUEST, "unknown Host")
            return
        path = self.path.split("?", 1)[0]
        dashboard = self.server.dashboard
        snapshot = dashboard.snapshot
        routes: dict[str, tuple[bytes, str]] = {
            **dashboard.assets,
            "/api/status": (snapshot.status, "application/json"),
            "/api/history": (snapshot.history, "application/json"),
            "/metrics": (snapshot.metrics, PROMETHEUS_TYPE),
        }
        if path not in routes:
            self.send_error(HTTPStatus.NOT_FOUND)
            return
        body, kind = routes[path]
        limits = self.server.limits
        self._arm(limits.request_deadline_s + len(body) / limits.min_read_bytes_per_s)
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        # the page's own files only: no inline script, nothing from elsewhere
        self.send_header("Content-Security-Policy", "default-src 'self'; img-src 'self' data:")
        self.end_headers()
        if with_body:
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # a page polled every second would flood the node's log


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64  # the listen backlog (5 by default: bursts of connects stalled 1-3 s)
    allow_reuse_address = True

    def __init__(
        self,
        address: tuple[str, int],
        dashboard: Dashboard,
        names: tuple[str, ...],
        limits: Limits,
    ) -> None:
        self.dashboard = dashboard
        self.limits = limits
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.sources = SourceShares()
        # a listen address given as a name is one the page is reached by
        listen = address[0].lower()
        self.names = frozenset(names) | (frozenset() if is_ip(listen) else {listen})
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.sources.take(client_address):
            self.shutdown_request(request)  # this source holds its share: refused
            return
        if not self.slots.acquire(blocking=False):
            self.sources.give(client_address)
            self.shutdown_request(request)  # full: refuse rather than queue
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()
            self.sources.give(client_address)

    def host_allowed(self, header: str | None) -> bool:
        return host_allowed(header, int(self.server_address[1]), self.names)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # a client that went away (or was dropped) mid-reply: nothing to report
        log.debug("dashboard client %s: connection error", client_address, exc_info=True)


class DashboardServer:
    """Serves a Dashboard on HOST:PORT from a daemon thread until `stop`."""

    def __init__(
        self,
        dashboard: Dashboard,
        host: str,
        port: int,
        names: tuple[str, ...] = (),
        limits: Limits = DEFAULT_LIMITS,
    ) -> None:
        try:
            self._server = _Server((host, port), dashboard, names, limits)
        except OSError as exc:
            raise UserError(f"--http {host}:{port}: cannot listen: {exc.strerror or exc}") from None
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{f'[{host}]' if ':' in host else host}:{port}/"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
