"""Socket roles for the NAT tests, run inside testbed peers: python nat_peer.py ROLE ARGS.

  observe PORT                      UDP and TCP on PORT: answer each datagram / connection with
                                    the "ip:port" it came from (a rendezvous: what a NAT shows)
  connect tcp|udp IP:PORT LOCAL_PORT TIMEOUT_S
                                    ask IP:PORT what it observes; prints {"ok", "observed"}
  punch tcp|udp RENDEZVOUS LOCAL_PORT TIMEOUT_S
                                    prints {"observed"} from the rendezvous, reads the other
                                    peer's observed endpoint from stdin, then both send to each
                                    other at once; prints {"ok", "received"}
  replies PORT DELAY_S:same|other,...
                                    on the first datagram, answer its sender after each delay,
                                    from PORT ("same") or from a fresh port ("other")
  listen LOCAL_PORT IP:PORT SECONDS  send one datagram to IP:PORT from LOCAL_PORT, then print
                                    {"received": [[delay_s, "ip:port", text], ...]} after SECONDS
Stdlib only; every line printed is one JSON object.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time

REUSE = (socket.SO_REUSEADDR, socket.SO_REUSEPORT)  # several sockets on one local TCP port


def endpoint(text: str) -> tuple[str, int]:
    ip, _, port = text.rpartition(":")
    return ip, int(port)


def say(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def bound(kind: int, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, kind)
    for option in REUSE:
        sock.setsockopt(socket.SOL_SOCKET, option, 1)
    sock.bind(("0.0.0.0", port))
    return sock


def observe(port: int) -> None:
    udp = bound(socket.SOCK_DGRAM, port)
    tcp = bound(socket.SOCK_STREAM, port)
    tcp.listen(16)

    def serve_udp() -> None:
        while True:
            _, (ip, source_port) = udp.recvfrom(2048)
            udp.sendto(f"{ip}:{source_port}".encode(), (ip, source_port))

    threading.Thread(target=serve_udp, daemon=True).start()
    say(ready=True)
    while True:
        conn, (ip, source_port) = tcp.accept()
        with conn:
            conn.sendall(f"{ip}:{source_port}\n".encode())


def ask(kind: str, server: tuple[str, int], local_port: int, timeout_s: float) -> str:
    """What `server` (an observer) sees as our address when we use local_port."""
    if kind == "udp":
        sock = bound(socket.SOCK_DGRAM, local_port)
        sock.settimeout(timeout_s)
        with sock:
            sock.sendto(b"?", server)
            return sock.recv(2048).decode()
    sock = bound(socket.SOCK_STREAM, local_port)
    sock.settimeout(timeout_s)
    with sock:
        sock.connect(server)
        return sock.makefile().readline().strip()


def connect(kind: str, server: str, local_port: int, timeout_s: float) -> None:
    try:
        say(ok=True, observed=ask(kind, endpoint(server), local_port, timeout_s))
    except OSError as exc:
        say(ok=False, error=repr(exc))


def punch(kind: str, rendezvous: str, local_port: int, timeout_s: float) -> None:
    say(observed=ask(kind, endpoint(rendezvous), local_port, timeout_s))
    other = endpoint(sys.stdin.readline().strip())
    if kind == "udp":
        punch_udp(other, local_port, timeout_s)
    else:
        punch_tcp(other, local_port, timeout_s)


def punch_udp(other: tuple[str, int], local_port: int, timeout_s: float) -> None:
    """Send to the other's public endpoint every 50 ms; once it answers, go on a little (so that
    it hears us too), then report."""
    sock = bound(socket.SOCK_DGRAM, local_port)
    sock.settimeout(0.05)
    deadline_s = time.monotonic() + timeout_s
    received: list[str] = []
    while time.monotonic() < deadline_s:
        sock.sendto(b"punch", other)
        try:
            data, source = sock.recvfrom(2048)
        except TimeoutError:
            continue
        if source == other and not received:
            received.append(data.decode())
            deadline_s = min(deadline_s, time.monotonic() + 0.5)
    say(ok=bool(received), received=received)


def punch_tcp(other: tuple[str, int], local_port: int, timeout_s: float) -> None:
    """TCP simultaneous open: connect from the port the rendezvous saw to the other's endpoint,
    while the other does the same; the SYNs cross and both ends see one connection."""
    sock = bound(socket.SOCK_STREAM, local_port)
    sock.settimeout(timeout_s)
    try:
        with sock:
            sock.connect(other)
            sock.sendall(b"punch\n")
            say(ok=True, received=[sock.makefile().readline().strip()])
    except OSError as exc:
        say(ok=False, error=repr(exc))


def replies(port: int, plan: str) -> None:
    sock = bound(socket.SOCK_DGRAM, port)
    say(ready=True)
    _, source = sock.recvfrom(2048)
    start_s = time.monotonic()
    for step in plan.split(","):
        delay, _, origin = step.partition(":")
        time.sleep(max(0.0, start_s + float(delay) - time.monotonic()))
        sender = sock if origin == "same" else bound(socket.SOCK_DGRAM, 0)
        sender.sendto(f"{delay}:{origin}".encode(), source)
    say(done=True)


def listen(local_port: int, server: str, seconds: float) -> None:
    sock = bound(socket.SOCK_DGRAM, local_port)
    start_s = time.monotonic()
    sock.sendto(b"hello", endpoint(server))
    received = []
    while (left_s := start_s + seconds - time.monotonic()) > 0:
        sock.settimeout(left_s)
        try:
            data, (ip, port) = sock.recvfrom(2048)
        except TimeoutError:
            break
        received.append([round(time.monotonic() - start_s, 3), f"{ip}:{port}", data.decode()])
    say(received=received)


def main(role: str, *args: str) -> None:
    if role == "observe":
        observe(int(args[0]))
    elif role in ("connect", "punch"):
        run = connect if role == "connect" else punch
        run(args[0], args[1], int(args[2]), float(args[3]))
    elif role == "replies":
        replies(int(args[0]), args[1])
    elif role == "listen":
        listen(int(args[0]), args[1], float(args[2]))
    else:
        raise SystemExit(f"unknown role {role!r}")


if __name__ == "__main__":
    main(*sys.argv[1:])
