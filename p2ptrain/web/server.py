"""The dashboard's HTTP server: read-only, bounded, every asset served by the node itself.

The control process hands a Dashboard one status document a second (`update`); the server's
threads only ever read the bytes built from the last one, so a request never touches the
control plane's state, costs the bytes it reads, and cannot change anything (GET and HEAD
only). Connections are capped and time out; nothing secret is in a status document (peer ids,
addresses, measurements, losses). Stdlib http.server: no framework, no build step, no CDN.
"""

from __future__ import annotations

import json
import socket
import threading
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any

from p2ptrain.errors import UserError
from p2ptrain.records import SwarmStatus
from p2ptrain.web.history import SwarmHistory, measured_step_s
from p2ptrain.web.metrics import metrics_text

DEFAULT_HOST = "127.0.0.1"
MAX_CONNECTIONS = 32  # open at once; more are closed at once
SOCKET_TIMEOUT_S = 10.0  # a client that sends nothing for this long is dropped
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
            status=json.dumps(status.to_dict()).encode(),
            # the page shows the plan's measured step as this module computes it (one rule)
            history=json.dumps(
                {**self.history.to_dict(), "measured_step_s": measured_step_s(status)}
            ).encode(),
            metrics=metrics_text(status, point),
        )


def parse_http_address(text: str) -> tuple[str, int]:
    """`PORT` or `HOST:PORT` (the host defaults to 127.0.0.1: exposing the page is a choice)."""
    host, _, port = text.rpartition(":")
    try:
        number = int(port)
    except ValueError:
        number = -1
    if not 0 <= number <= 65535:
        raise UserError(f"--http {text!r}: expected PORT or HOST:PORT")
    return (host.strip("[]") or DEFAULT_HOST), number


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = SOCKET_TIMEOUT_S
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self._answer(with_body=True)

    def do_HEAD(self) -> None:
        self._answer(with_body=False)

    def _answer(self, with_body: bool) -> None:
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
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], dashboard: Dashboard) -> None:
        self.dashboard = dashboard
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            self.shutdown_request(request)  # full: refuse rather than queue
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


class DashboardServer:
    """Serves a Dashboard on HOST:PORT from a daemon thread until `stop`."""

    def __init__(self, dashboard: Dashboard, host: str, port: int) -> None:
        try:
            self._server = _Server((host, port), dashboard)
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
