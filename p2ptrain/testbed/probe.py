"""Link measurements run inside the namespaces (stdlib only, so they start fast).

    python -m p2ptrain.testbed.probe serve ADDRESS           # prints {"port": P}; UDP echo + TCP sink
    python -m p2ptrain.testbed.probe rtt ADDRESS PORT [--count N]
    python -m p2ptrain.testbed.probe bulk ADDRESS PORT [--seconds S]

Clients print one JSON line. RTT: median of UDP echo round trips. Throughput: TCP goodput seen by
the receiver over the second half of the transfer (after slow start), which the sink reports back
as a timeline of cumulative bytes.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import threading
import time

CHUNK_BYTES = 64 * 1024
SAMPLE_EVERY_S = 0.05
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
    while True:
        data, peer = udp.recvfrom(2048)
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
    start_s, start_bytes = next((t, b) for t, b in timeline if t >= end_s / 2)
    if end_s - start_s <= 0:
        return {"mbps": float("nan"), "bytes": end_bytes}
    mbps = (end_bytes - start_bytes) * 8 / (end_s - start_s) / 1e6
    return {"mbps": mbps, "bytes": end_bytes, "seconds": end_s}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m p2ptrain.testbed.probe")
    sub = parser.add_subparsers(dest="mode", required=True)
    sub.add_parser("serve").add_argument("address")
    for mode in ("rtt", "bulk"):
        p = sub.add_parser(mode)
        p.add_argument("address")
        p.add_argument("port", type=int)
    sub.choices["rtt"].add_argument("--count", type=int, default=20)
    sub.choices["bulk"].add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args(argv)
    if args.mode == "serve":
        serve(args.address)
    elif args.mode == "rtt":
        print(json.dumps(rtt(args.address, args.port, args.count)))
    else:
        print(json.dumps(bulk(args.address, args.port, args.seconds)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
