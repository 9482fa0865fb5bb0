"""The user-space link emulator: one process that owns a TUN device per peer and forwards
every IP packet between them with the delay, rate, jitter and loss of its directed link.

Run by ``Testbed`` as ``python -m p2ptrain.testbed.forwarder CONFIG_JSON``; it prints ``ready``
once its TUN devices and control socket exist, and exits when its stdin closes (so it never
outlives its owner) or on SIGTERM. Closing the TUN fds removes the devices from the namespaces.

Control socket: one JSON object per line each way.
  {"op": "set", "a": 0, "b": 1, "spec": {LinkSpec fields}}   -> {"ok": true}
  {"op": "links"}                                           -> {"ok": true, "links": [...]}
  {"op": "stats"}                                   -> {"ok": true, "links": [...], "nat": [...]}
  {"op": "set_nat", "peer": 1, "type": "cone"}      -> {"ok": true}   (its mappings are dropped)
  {"op": "nat"}          -> {"ok": true, "timeouts": {...}, "nat": [{"peer", "type", "public",
                             "mappings", "dropped_in", "dropped_out"}, ...]}
  {"op": "mappings", "peer": 1 (optional)}          -> {"ok": true, "mappings": [NatMapping, ...]}

NAT (nat.py): a NATed peer's outbound packets are translated as they are read (its NAT sits
before its links); packets to a NAT's public address are filtered and translated as they are
delivered (the NAT at the far end sees them when they arrive, so crossing punches meet in flight).
"""

from __future__ import annotations

import contextlib
import heapq
import ipaddress
import json
import os
import random
import select
import signal
import socket
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from p2ptrain.testbed.links import LinkSpec
from p2ptrain.testbed.nat import Nat, NatTimeouts, check_nat_type
from p2ptrain.testbed.tun import open_tun

MAX_PACKET_BYTES = 65536
READ_BURST = 64  # packets read from one device before serving the others and the timers
EARLY_WAKE_S = 50e-6  # deliver packets this close to due rather than sleep again
MIN_QUEUE_BYTES = 64 * 1024
MAX_CONTROL_LINE_BYTES = 1 << 20
# Real-time priority: on a loaded machine a normal process wakes milliseconds late, which would
# show up as extra link delay. The forwarder sleeps in select() between packets, and the kernel's
# RT throttling keeps a bug from taking a whole CPU.
REALTIME_PRIORITY = 20


class _Link:
    """Runtime state of one directed link: a FIFO with a byte rate, then a fixed delay."""

    __slots__ = (
        "byte_time_s",
        "bytes",
        "delay_s",
        "dropped",
        "jitter_s",
        "last_deliver_s",
        "loss",
        "next_free_s",
        "packets",
        "queue_limit_s",
        "spec",
        "up",
    )

    def __init__(self, spec: LinkSpec, reverse_delay_ms: float) -> None:
        self.next_free_s = 0.0
        self.last_deliver_s = 0.0
        self.packets = self.bytes = self.dropped = 0
        self.configure(spec, reverse_delay_ms)

    def configure(self, spec: LinkSpec, reverse_delay_ms: float) -> None:
        self.spec = spec
        self.delay_s = spec.delay_ms / 1000.0
        self.jitter_s = spec.jitter_ms / 1000.0
        self.loss = spec.loss
        self.up = spec.up
        self.byte_time_s = 8.0 / (spec.rate_mbps * 1e6)
        # Drop-tail buffer of 1.5 bandwidth-delay products (TCP then fills the link) plus slack.
        rtt_s = (spec.delay_ms + reverse_delay_ms) / 1000.0
        self.queue_limit_s = 1.5 * rtt_s + MIN_QUEUE_BYTES * self.byte_time_s

    def admit(self, now_s: float, size_bytes: int) -> float | None:
        """The delivery time of a packet entering now, or None if it is dropped."""
        if not self.up or (self.loss and random.random() < self.loss):
            self.dropped += 1
            return None
        start_s = max(now_s, self.next_free_s)
        if start_s - now_s > self.queue_limit_s:
            self.dropped += 1
            return None
        self.next_free_s = start_s + size_bytes * self.byte_time_s
        deliver_s = self.next_free_s + self.delay_s
        if self.jitter_s:
            deliver_s += random.uniform(-self.jitter_s, self.jitter_s)
        # Keep each link in order, as a real path mostly is (reordering would look like loss).
        deliver_s = max(deliver_s, self.last_deliver_s)
        self.last_deliver_s = deliver_s
        self.packets += 1
        self.bytes += size_bytes
        return deliver_s


class Forwarder:
    """Moves packets between TUN fds through the directed links."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.addresses = [ipaddress.IPv4Address(a).packed for a in config["addresses"]]
        self.public_addresses = [
            ipaddress.IPv4Address(a).packed for a in config.get("public_addresses", [])
        ]
        self.nat_timeouts = NatTimeouts(**config.get("nat_timeouts", {}))
        # per peer: its NAT, or None for a directly reachable peer (which then pays nothing)
        self.nats: list[Nat | None] = [None] * len(self.addresses)
        self.nat_types = ["none"] * len(self.addresses)
        self.peer_of_address: dict[bytes, int] = {}  # private addresses of reachable peers
        self.peer_of_public: dict[bytes, int] = {}  # public addresses of NATs
        self.peer_of_private = {address: i for i, address in enumerate(self.addresses)}
        # packets a peer's NAT refused on the way in (unsolicited, expired, or to its private
        # address) and on the way out (what it does not translate: ICMP, fragments)
        self.nat_dropped_in = [0] * len(self.addresses)
        self.nat_dropped_out = [0] * len(self.addresses)
        for i, nat_type in enumerate(config.get("nat", self.nat_types)):
            self.set_nat(i, nat_type)
        specs = {(d["a"], d["b"]): LinkSpec(**d["spec"]) for d in config["links"]}
        self.links: dict[tuple[int, int], _Link] = {
            key: _Link(spec, specs[(key[1], key[0])].delay_ms) for key, spec in specs.items()
        }
        self.fds = [open_tun(name) for name in config["tun_names"]]
        self.peer_of_fd = {fd: i for i, fd in enumerate(self.fds)}
        self.control = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.control.bind(config["control"])
        os.chmod(config["control"], 0o600)
        self.control.listen(8)
        self.clients: dict[int, tuple[socket.socket, bytearray]] = {}
        # (due, seq, fd or ~peer for a NAT to pass first, packet)
        self.in_flight: list[tuple[float, int, int, bytes]] = []
        self.seq = 0

    def serve(self, stop_fd: int) -> None:
        """Forward until stop_fd reaches EOF."""
        while True:
            self._deliver_due()
            timeout_s = (
                max(0.0, self.in_flight[0][0] - time.monotonic()) if self.in_flight else None
            )
            watched = [*self.fds, self.control.fileno(), stop_fd, *self.clients]
            readable, _, _ = select.select(watched, [], [], timeout_s)
            for fd in readable:
                if fd in self.peer_of_fd:
                    self._read_packets(fd)
                elif fd == self.control.fileno():
                    conn, _ = self.control.accept()
                    self.clients[conn.fileno()] = (conn, bytearray())
                elif fd == stop_fd:
                    if not os.read(stop_fd, 4096):
                        return
                elif fd in self.clients:
                    self._serve_client(fd)

    def _read_packets(self, fd: int) -> None:
        src = self.peer_of_fd[fd]
        for _ in range(READ_BURST):
            try:
                packet = os.read(fd, MAX_PACKET_BYTES)
            except OSError:  # EAGAIN: drained; EIO: device not up yet
                return
            if len(packet) < 20 or packet[0] >> 4 != 4:
                continue  # IPv4 only (namespaces have IPv6 off)
            now_s = time.monotonic()
            dst = self.peer_of_address.get(packet[16:20])
            if dst is not None:
                target = self.fds[dst]
            else:  # a NAT's public address: filtered at delivery (target ~dst marks it)
                dst = self.peer_of_public.get(packet[16:20])
                if dst is None:
                    refused_by = self.peer_of_private.get(packet[16:20])
                    if refused_by is not None:
                        self.nat_dropped_in[refused_by] += 1
                    continue
                target = ~dst
            if dst == src:
                continue
            nat = self.nats[src]
            if nat is not None:
                translated = nat.translate_out(packet, now_s)
                if translated is None:
                    self.nat_dropped_out[src] += 1
                    continue
                packet = translated
            due_s = self.links[(src, dst)].admit(now_s, len(packet))
            if due_s is not None:
                self.seq += 1
                heapq.heappush(self.in_flight, (due_s, self.seq, target, packet))

    def _deliver_due(self) -> None:
        now_s = time.monotonic()
        horizon_s = now_s + EARLY_WAKE_S
        while self.in_flight and self.in_flight[0][0] <= horizon_s:
            _, _, target, packet = heapq.heappop(self.in_flight)
            if target < 0:  # to a NAT's public address
                nat = self.nats[~target]
                translated = nat.translate_in(packet, now_s) if nat is not None else None
                if translated is None:
                    self.nat_dropped_in[~target] += 1
                    continue
                with contextlib.suppress(OSError):
                    os.write(self.fds[~target], translated)
                continue
            with contextlib.suppress(OSError):  # receiver's device gone or down: packet lost
                os.write(target, packet)

    def set_nat(self, peer: int, nat_type: str) -> None:
        """Put the peer behind a NAT of that type (or none); its old mappings are dropped."""
        self.nat_types[peer] = check_nat_type(nat_type)
        self.nats[peer] = (
            None
            if nat_type == "none"
            else Nat(nat_type, self.addresses[peer], self.public_addresses[peer], self.nat_timeouts)
        )
        self.peer_of_address = {
            address: i for i, address in enumerate(self.addresses) if self.nats[i] is None
        }
        self.peer_of_public = {
            self.public_addresses[i]: i for i, nat in enumerate(self.nats) if nat is not None
        }

    def _nat_report(self) -> list[dict[str, Any]]:
        return [
            {
                "peer": i,
                "type": self.nat_types[i],
                "public": str(ipaddress.IPv4Address(self.public_addresses[i]))
                if nat is not None
                else str(ipaddress.IPv4Address(self.addresses[i])),
                "mappings": len(nat.outbound) if nat is not None else 0,
                "dropped_in": self.nat_dropped_in[i],
                "dropped_out": self.nat_dropped_out[i],
            }
            for i, nat in enumerate(self.nats)
        ]

    def _serve_client(self, fd: int) -> None:
        conn, buffer = self.clients[fd]
        try:
            chunk = conn.recv(65536)
        except OSError:
            chunk = b""
        if not chunk or len(buffer) + len(chunk) > MAX_CONTROL_LINE_BYTES:
            del self.clients[fd]
            conn.close()
            return
        buffer += chunk
        while b"\n" in buffer:
            line, _, rest = bytes(buffer).partition(b"\n")
            buffer[:] = rest
            try:
                reply = self._handle(json.loads(line))
            except (ValueError, KeyError, TypeError) as exc:
                reply = {"ok": False, "error": str(exc)}
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps(reply).encode() + b"\n")

    def _handle(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request["op"]
        if op == "set":
            key = (int(request["a"]), int(request["b"]))
            if key not in self.links:
                raise KeyError(f"no link {key}")
            spec = LinkSpec(**request["spec"])
            self.links[key].configure(spec, self.links[(key[1], key[0])].spec.delay_ms)
            return {"ok": True}
        if op == "links":
            return {
                "ok": True,
                "links": [
                    {"a": a, "b": b, "spec": ln.spec.to_json()} for (a, b), ln in self.links.items()
                ],
            }
        if op == "stats":
            return {
                "ok": True,
                "links": [
                    {
                        "a": a,
                        "b": b,
                        "packets": ln.packets,
                        "bytes": ln.bytes,
                        "dropped": ln.dropped,
                    }
                    for (a, b), ln in self.links.items()
                ],
                "nat": self._nat_report(),
            }
        if op == "set_nat":
            peer = int(request["peer"])
            if not 0 <= peer < len(self.nats):
                raise KeyError(f"no peer {peer}")
            self.set_nat(peer, request["type"])
            return {"ok": True}
        if op == "nat":
            return {"ok": True, "timeouts": self.nat_timeouts.to_json(), "nat": self._nat_report()}
        if op == "mappings":
            now_s = time.monotonic()
            wanted = request.get("peer")
            return {
                "ok": True,
                "mappings": [
                    asdict(mapping)
                    for i, nat in enumerate(self.nats)
                    if nat is not None and wanted in (None, i)
                    for mapping in nat.mappings(i, now_s)
                ],
            }
        raise ValueError(f"unknown op {op!r}")

    def close(self) -> None:
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        for conn, _ in self.clients.values():
            conn.close()
        self.control.close()


def main(argv: list[str]) -> int:
    config = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the owner decides when we stop
    with contextlib.suppress(OSError):
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(REALTIME_PRIORITY))
    forwarder = Forwarder(config)
    try:
        print("ready", flush=True)
        forwarder.serve(sys.stdin.fileno())
    finally:
        forwarder.close()
        with contextlib.suppress(OSError):
            os.unlink(config["control"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
