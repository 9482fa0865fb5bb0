"""Link measurements run inside the namespaces (stdlib only, so they start fast).

    python -m p2ptrain.harness.link_probe serve ADDRESS           # prints {"port": P}; UDP echo + TCP sink
    python -m p2ptrain.harness.link_probe rtt ADDRESS PORT [--count N]
    python -m p2ptrain.harness.link_probe bulk ADDRESS PORT [--seconds S]
    python -m p2ptrain.harness.link_probe blast ADDRESS PORT --mbps RATE [--seconds S]

Clients print one JSON line. RTT: median of UDP echo round trips. Capacity: the rate at which UDP
sent faster than the link arrives. TCP throughput: goodput seen by
the receiver after the first 40% of the transfer (slow start): the median rate over segments of the
timeline of cumulative bytes that the sink reports back.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import itertools
import json
import os
import socket
import statistics
import sys
import threading
import time

CHUNK_BYTES = 64 * 1024
SAMPLE_EVERY_S = 0.05
# Below the forwarder's priority, above everything else: timestamps taken by a process that
# waits for a CPU would add the machine's load to the measured link.
REALTIME_PRIORITY = 10
BLAST_TAG = b"p2tb-blast"
BLAST_END_TAG = b"p2tb-end"
BLAST_DATAGRAM_BYTES = 8000  # fits the testbed's 9000-byte MTU: no fragments
IP_UDP_HEADER_BYTES = 28
MAX_TIMELINE_POINTS = 400
BLAST_OVERDRIVE = 1.3  # send this much faster than the link: its queue stays full
PING_TIMEOUT_S = 2.0


def serve(address: str) -> None:
    """UDP echo and TCP sink on the same port number; runs until killed."""
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    tcp.bind((address, 0))
    port = tcp.getsockname()[1]
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind((address, port))
    tcp.listen(8)
    threading.Thread(target=_echo, args=(udp,), daemon=True).start()
    print(json.dumps({"port": port}), flush=True)
    while True:
        conn, _ = tcp.accept()
        threading.Thread(target=_sink, args=(conn,), daemon=True).start()


def _echo(udp: socket.socket) -> None:
    """Echo pings; time blast datagrams per sender and answer a blast's end with the timeline of
    bytes received (counted as IP packets, as the link's rate is)."""
    blasts: dict[tuple[str, int], tuple[float, list[tuple[float, int]]]] = {}
    while True:
        data, peer = udp.recvfrom(65536)
        if data.startswith(BLAST_TAG):
            start_s, arrivals = blasts.setdefault(peer, (time.monotonic(), []))
            received = (arrivals[-1][1] if arrivals else 0) + len(data) + IP_UDP_HEADER_BYTES
            arrivals.append((time.monotonic() - start_s, received))
        elif data.startswith(BLAST_END_TAG):
            _, arrivals = blasts.pop(peer, (0.0, []))
            step = max(1, len(arrivals) // MAX_TIMELINE_POINTS)
            timeline = arrivals[::step] + arrivals[-1:]
            udp.sendto(BLAST_END_TAG + json.dumps(timeline).encode(), peer)
        else:
            udp.sendto(data, peer)


def _sink(conn: socket.socket) -> None:
    """Read until the sender shuts down its side, then send back [(t_s, cumulative_bytes)]."""
    with conn:
        timeline: list[tuple[float, int]] = []
        received = 0
        next_sample_s = 0.0
        start_s = time.monotonic()
        while True:
            data = conn.recv(1 << 20)
            if not data:
                break
            received += len(data)
            now_s = time.monotonic() - start_s
            if now_s >= next_sample_s:
                timeline.append((now_s, received))
                next_sample_s = now_s + SAMPLE_EVERY_S
        timeline.append((time.monotonic() - start_s, received))
        conn.sendall(json.dumps(timeline).encode())


def rtt(address: str, port: int, count: int) -> dict[str, float]:
    """Median and min UDP round trip in ms over `count` pings."""
    samples_ms = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.settimeout(PING_TIMEOUT_S)
        for seq in range(count):
            payload = seq.to_bytes(4, "big") + b"\0" * 28
            sent_s = time.perf_counter()
            udp.sendto(payload, (address, port))
            try:
                while True:
                    data = udp.recv(2048)
                    if data[:4] == payload[:4]:
                        break
            except TimeoutError:
                continue
            samples_ms.append((time.perf_counter() - sent_s) * 1000.0)
    if not samples_ms:
        return {"rtt_ms": float("nan"), "rtt_min_ms": float("nan"), "lost": count}
    return {
        "rtt_ms": statistics.median(samples_ms),
        "rtt_min_ms": min(samples_ms),
        "lost": count - len(samples_ms),
    }


def bulk(address: str, port: int, seconds: float) -> dict[str, float]:
    """Send for `seconds`; goodput (Mbit/s) over the receiver's second half of the transfer."""
    chunk = b"\x5a" * CHUNK_BYTES
    with socket.create_connection((address, port), timeout=30) as conn:
        deadline_s = time.monotonic() + seconds
        while time.monotonic() < deadline_s:
            conn.sendall(chunk)
        conn.shutdown(socket.SHUT_WR)
        reply = b""
        while data := conn.recv(1 << 20):
            reply += data
    timeline = json.loads(reply)
    end_s, end_bytes = timeline[-1]
    # Skip slow start (the first 40%) and the final EOF sample (a lost last packet waits for a
    # retransmission timeout, which says nothing about the link's rate).
    steady = [(t, b) for t, b in timeline[:-1] if t >= 0.4 * end_s]
    return {"mbps": _median_rate(steady) * 8 / 1e6, "bytes": end_bytes, "seconds": end_s}


def blast(address: str, port: int, seconds: float, mbps: float) -> dict[str, float]:
    """Link capacity: UDP at BLAST_OVERDRIVE x mbps for `seconds`; the rate that arrives after
    the link's queue has filled (first 30% skipped) is the rate the link lets through."""
    payload = BLAST_TAG + b"\0" * (BLAST_DATAGRAM_BYTES - len(BLAST_TAG))
    bytes_per_s = mbps * BLAST_OVERDRIVE * 1e6 / 8
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.connect((address, port))
        start_s = time.monotonic()
        sent = 0
        while (elapsed_s := time.monotonic() - start_s) < seconds:
            if sent < elapsed_s * bytes_per_s:
                with contextlib.suppress(BlockingIOError, ConnectionRefusedError):
                    sent += udp.send(payload)
            else:
                time.sleep(0.001)
        udp.settimeout(PING_TIMEOUT_S)
        for _ in range(5):  # the end marker queues behind the blast and may be dropped
            udp.send(BLAST_END_TAG)
            with contextlib.suppress(TimeoutError):
                reply = udp.recv(65536)
                if reply.startswith(BLAST_END_TAG):
                    break
        else:
            return {"mbps": float("nan"), "bytes": 0}
    timeline = json.loads(reply[len(BLAST_END_TAG) :])
    if len(timeline) < 3:
        return {"mbps": float("nan"), "bytes": 0}
    end_s, end_bytes = timeline[-1]
    start_s, start_bytes = next((t, b) for t, b in timeline if t >= 0.3 * end_s)
    mbps_in = (end_bytes - start_bytes) * 8 / (end_s - start_s) / 1e6 if end_s > start_s else 0
    return {"mbps": mbps_in, "bytes": end_bytes, "seconds": end_s}


def _median_rate(points: list[tuple[float, int]], num_segments: int = 9) -> float:
    """Bytes per second: the median over equal time segments. A lost packet holds data back in
    the receiver's reorder queue and then releases it at once; that hole and burst bend one or
    two segments, not the median (a two-point difference or a straight-line fit are biased
    by where the hole falls)."""
    if len(points) < 2 or points[-1][0] <= points[0][0]:
        return float("nan")
    t0, t1 = points[0][0], points[-1][0]
    bounds = [t0 + (t1 - t0) * k / num_segments for k in range(num_segments + 1)]
    times = [t for t, _ in points]

    def bytes_at(t: float) -> int:  # cumulative bytes received by time t (a step function)
        return points[max(0, bisect.bisect_right(times, t) - 1)][1]

    rates = [(bytes_at(hi) - bytes_at(lo)) / (hi - lo) for lo, hi in itertools.pairwise(bounds)]
    return statistics.median(rates)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m p2ptrain.harness.link_probe")
    sub = parser.add_subparsers(dest="mode", required=True)
    sub.add_parser("serve").add_argument("address")
    for mode in ("rtt", "bulk", "blast"):
        p = sub.add_parser(mode)
        p.add_argument("address")
        p.add_argument("port", type=int)
    sub.choices["rtt"].add_argument("--count", type=int, default=20)
    sub.choices["bulk"].add_argument("--seconds", type=float, default=3.0)
    sub.choices["blast"].add_argument("--seconds", type=float, default=2.0)
    sub.choices["blast"].add_argument("--mbps", type=float, required=True, help="the link's rate")
    args = parser.parse_args(argv)
    with contextlib.suppress(OSError):
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(REALTIME_PRIORITY))
    if args.mode == "serve":
        serve(args.address)
    elif args.mode == "rtt":
        print(json.dumps(rtt(args.address, args.port, args.count)))
    elif args.mode == "bulk":
        print(json.dumps(bulk(args.address, args.port, args.seconds)))
    else:
        print(json.dumps(blast(args.address, args.port, args.seconds, args.mbps)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
