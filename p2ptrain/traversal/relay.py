"""Relays and hole punches for peers behind NATs, in both planes (records/relay.py says the wire).

A public peer runs a RelayServer: a control-plane protocol (RELAY_PROTOCOL) through which NATed
members reserve a slot and others ask to reach them, and a raw TCP port (the relay port) that
answers "which endpoint do you see" and splices the two halves of a relayed circuit. A relayed or
punched connection carries a whole libp2p connection (py-libp2p's or the worker's p2pd's) whose
own Noise handshake authenticates both ends; the relay forwards ciphertext.

Hole punching is TCP simultaneous open: each side learns the public endpoint of one local port
from the relay port (RAW_OBSERVE), the relay swaps the endpoints over the control plane, and both
connect from that port to the other's endpoint at once. Behind endpoint-independent ("cone")
NATs the crossing SYNs open both mappings; a symmetric NAT maps the punch to another port, the
connect times out and the caller relays instead. The relay forwards an endpoint only as its raw
port observed it from that peer's address (`vouch`): nobody can aim a punch's SYNs elsewhere.

Strangers reach the raw port without any membership: a connection waits for its hello in a small
pool, capped per source address, per public /24 (IPv6 /48) and in all, and is dropped after
RAW_IDLE_S without one; only a half whose token matches a granted circuit moves to the circuits'
pool, which idle strangers therefore cannot fill. The accept loop outlives running out of
descriptors (net/accepting.py). Capacity is shared out: per pair and per requesting peer, per
public /24 (net/address_classes.py: public_prefix), and identities new to the relay share a few slots; idle circuits close.
The client side (observe, punch, open_raw) is traversal/relay_client.py; the splice of a
circuit's halves, traversal/splice.py.

Why not libp2p's circuit relay v2 and DCUtR: the worker's p2pd (hivemind's) has no hole punching,
and it reserves relay slots only after autorelay's boot delay, minutes (docs/benchmarks.md,
"NAT"). Carrying both planes' TCP connections below libp2p gives both the same relays and
punches, at once, with no change to either library.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from p2ptrain.errors import WireError
from p2ptrain.net.accepting import ConnectionCaps, current_seat, serve_accepting
from p2ptrain.net.address_classes import public_prefix
from p2ptrain.records.relay import (
    RAW_CIRCUIT,
    RAW_HELLO_BYTES,
    RAW_OBSERVE,
    TOKEN_BYTES,
    RawHello,
    split_endpoint,
)
from p2ptrain.sampled_log import SampledLog
from p2ptrain.traversal.relay_client import PUNCH_TIMEOUT_S as PUNCH_TIMEOUT_S
from p2ptrain.traversal.relay_client import RAW_HELLO_TIMEOUT_S as RAW_HELLO_TIMEOUT_S
from p2ptrain.traversal.relay_client import Observation as Observation
from p2ptrain.traversal.relay_client import bound_socket as bound_socket
from p2ptrain.traversal.relay_client import observe as observe
from p2ptrain.traversal.relay_client import observe_from as observe_from
from p2ptrain.traversal.relay_client import open_raw as open_raw
from p2ptrain.traversal.relay_client import punch as punch
from p2ptrain.traversal.relay_client import receive_exact as receive_exact
from p2ptrain.traversal.splice import MAX_CIRCUIT_BYTES, RelayCounters, splice

log = logging.getLogger(__name__)

RAW_IDLE_S = 3.0  # the relay's wait for a raw connection's hello: idle strangers go quickly
CIRCUIT_PAIRING_S = 15.0  # both halves of a circuit arrive within this of its grant
CIRCUIT_IDLE_S = 120.0  # a circuit with no byte either way this long is closed
MAX_RESERVATIONS = 64
MAX_RESERVATIONS_PER_PREFIX = 8  # one /24 of public addresses
MAX_NEW_RESERVATIONS = 16  # held by identities this relay first saw under NEW_IDENTITY_S ago
NEW_IDENTITY_S = 600.0
# relayed connections at once, over all reservations; per peer: a NATed peer has one per plane
# and NATed partner, two when both ends dialled at once, and a few mid-handshake or closing
MAX_CIRCUITS = 192
MAX_CIRCUITS_PER_PEER = 48  # that a peer asked for
MAX_CIRCUITS_PER_PAIR = 8  # from one source to one target: nobody can use up a target's share
MAX_CIRCUITS_PER_PREFIX = 64  # asked for from one /24 of public addresses
MAX_PENDING = 128
# raw connections at once, waiting for their hello (or answering an observe): a few per source
# address (halves and observes of peers behind one NAT), a few more per public /24 (IPv6 /48)
MAX_RAW_HELLOS = 128
MAX_RAW_HELLOS_PER_SOURCE = 16
MAX_RAW_HELLOS_PER_PREFIX = 32
# and halves of granted circuits: both halves of every circuit; per source address, a peer's
# share of circuits and some as a target
MAX_RAW_CIRCUIT_HALVES = 2 * MAX_CIRCUITS
MAX_RAW_PER_SOURCE = MAX_CIRCUITS_PER_PEER + 16
MAX_RAW_CONNECTIONS = MAX_RAW_CIRCUIT_HALVES + MAX_RAW_HELLOS
RESERVATION_TTL_S = 120.0
OBSERVED_TTL_S = 30.0  # a punch endpoint must have been observed this recently
MAX_OBSERVED = 4096  # source addresses whose observed ports are kept
# ports kept per source address: a few peers behind one NAT address punching at once. A stranger
# observing from fresh ports churns only its own address's entries.
MAX_OBSERVED_PORTS = 8
MAX_FIRST_SEEN = 4096


@dataclass
class _Circuit:
    """A granted circuit: pending until both halves arrive, then spliced until `done`."""

    source: str
    target: str
    prefix: str  # the source's address prefix ('' when not public)
    created: float
    halves: list[trio.SocketStream] = field(default_factory=list)
    paired: trio.Event = field(default_factory=trio.Event)
    done: trio.Event = field(default_factory=trio.Event)


class RelayServer:
    """The relay side: reservations, circuit grants and the raw port's splicing, with limits."""

    def __init__(
        self, may_use: Callable[[str], bool], counters: RelayCounters | None = None
    ) -> None:
        self.may_use = may_use  # a member of the run (open runs: anyone who published a record)
        self.reservations: dict[str, float] = {}  # peer -> expiry (monotonic)
        self.reserved_from: dict[str, str] = {}  # peer -> its address prefix ('' : not public)
        self.pending: dict[bytes, _Circuit] = {}
        self.spliced: list[_Circuit] = []
        self.counters = counters if counters is not None else RelayCounters()
        # where the raw port admits a connection; a granted circuit's half moves to the other
        self.caps = ConnectionCaps(
            MAX_RAW_HELLOS_PER_SOURCE, MAX_RAW_HELLOS, MAX_RAW_HELLOS_PER_PREFIX
        )
        self.circuit_caps = ConnectionCaps(MAX_RAW_PER_SOURCE, MAX_RAW_CIRCUIT_HALVES)
        self._refusals = SampledLog(log, logging.WARNING)
        # ip -> port -> when the raw port saw (ip, port); both least recently seen first
        self.observed: OrderedDict[str, OrderedDict[int, float]] = OrderedDict()
        self.first_seen: dict[str, float] = {}
        self.started: float | None = None

    def reserve(self, peer: str, now: float, ip: str = "") -> str:
        """'' if `peer` (connected to us from `ip`) holds a slot until now + RESERVATION_TTL_S,
        else why not."""
        self._expire(now)
        if not self.may_use(peer):
            return "not a member of this run"
        key = public_prefix(ip)
        if peer not in self.reservations:
            if len(self.reservations) >= MAX_RESERVATIONS:
                return self._refuse(f"relay full ({MAX_RESERVATIONS} reservations)")
            if key and sum(k == key for k in self.reserved_from.values()) >= (
                MAX_RESERVATIONS_PER_PREFIX
            ):
                return self._refuse(f"at most {MAX_RESERVATIONS_PER_PREFIX} slots per {key}")
            new = [p for p in self.reservations if self._is_new(p, now)]
            if self._is_new(peer, now) and len(new) >= MAX_NEW_RESERVATIONS:
                return self._refuse(f"at most {MAX_NEW_RESERVATIONS} slots for new identities")
        self.reservations[peer] = now + RESERVATION_TTL_S
        self.reserved_from[peer] = key
        return ""

    def _is_new(self, peer: str, now: float) -> bool:
        """Whether `peer` is an identity this relay first saw under NEW_IDENTITY_S ago. Those
        seen in the relay's own first NEW_IDENTITY_S are not: a relay that just started has no
        history, and every honest peer of a starting swarm is new to it."""
        if self.started is None:
            self.started = now
        if peer not in self.first_seen:
            if len(self.first_seen) >= MAX_FIRST_SEEN:  # drop the youngest: old peers stay old
                del self.first_seen[max(self.first_seen, key=self.first_seen.__getitem__)]
            self.first_seen[peer] = now
        seen = self.first_seen[peer]
        return seen - self.started > NEW_IDENTITY_S and now - seen < NEW_IDENTITY_S

    def grant(self, source: str, target: str, now: float, ip: str = "") -> tuple[str, bytes]:
        """('', token) for a circuit from source (connected to us from `ip`) to a reserved
        target, else (why not, b'')."""
        self._expire(now)
        if not self.may_use(source):
            return "not a member of this run", b""
        if source == target:
            return "no circuit to oneself", b""
        if target not in self.reservations:
            return "no reservation here", b""
        busy = self.counters.active + len(self.pending)
        if busy >= MAX_CIRCUITS or len(self.pending) >= MAX_PENDING:
            return self._refuse(f"relay busy ({MAX_CIRCUITS} circuits)"), b""
        circuits = [*self.pending.values(), *self.spliced]
        if sum(c.source == source for c in circuits) >= MAX_CIRCUITS_PER_PEER:
            return self._refuse(f"at most {MAX_CIRCUITS_PER_PEER} circuits per peer"), b""
        if sum(c.source == source and c.target == target for c in circuits) >= (
            MAX_CIRCUITS_PER_PAIR
        ):
            return self._refuse(f"at most {MAX_CIRCUITS_PER_PAIR} circuits per pair"), b""
        key = public_prefix(ip)
        if key and sum(c.prefix == key for c in circuits) >= MAX_CIRCUITS_PER_PREFIX:
            return self._refuse(f"at most {MAX_CIRCUITS_PER_PREFIX} circuits per {key}"), b""
        token = secrets.token_bytes(TOKEN_BYTES)
        self.pending[token] = _Circuit(source, target, key, now)
        return "", token

    def vouch(self, ip: str, endpoint: str, now: float) -> str:
        """A punch endpoint for a peer connected to us from `ip`: `ip` with the endpoint's port,
        if this relay's raw port saw that very (ip, port) within OBSERVED_TTL_S; else ''. What a
        peer names as its endpoint is a hint: we forward only what we observed it to be."""
        if not endpoint:
            return ""
        port = split_endpoint(endpoint)[1]
        ports = self.observed.get(ip)
        seen = None if ports is None else ports.get(port)
        if seen is None or now - seen > OBSERVED_TTL_S:
            return ""
        return f"{ip}:{port}"

    def _note_observed(self, ip: str, port: int, now: float) -> None:
        """The raw port saw (ip, port) now. O(1): an address past MAX_OBSERVED_PORTS forgets its
        own oldest port, and past MAX_OBSERVED addresses the least recently seen one goes."""
        ports = self.observed.get(ip)
        if ports is None:
            if len(self.observed) >= MAX_OBSERVED:
                self.observed.popitem(last=False)
            ports = self.observed[ip] = OrderedDict()
        else:
            self.observed.move_to_end(ip)
        ports.pop(port, None)
        ports[port] = now
        if len(ports) > MAX_OBSERVED_PORTS:
            ports.popitem(last=False)

    def _refuse(self, why: str) -> str:
        """Count a refusal for capacity and say so (the 1st, then every 100th): a relay at its
        limits is not oversubscribed silently."""
        self.counters.refused += 1
        self._refusals.event("refused", "relay refused a request: %s", why)
        return why

    def _expire(self, now: float) -> None:
        for peer in [p for p, expiry in self.reservations.items() if expiry < now]:
            del self.reservations[peer]
            self.reserved_from.pop(peer, None)
        for token in [t for t, p in self.pending.items() if now - p.created > CIRCUIT_PAIRING_S]:
            del self.pending[token]

    async def serve_raw(
        self, listener: trio.SocketListener, *, task_status: Any = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Accept raw connections for as long as the node runs (net/accepting.py: a flood of
        connections neither ends this nor holds more than the caps)."""
        await serve_accepting(
            listener, self._raw_connection, self.caps, "relay port", task_status=task_status
        )

    async def _raw_connection(self, stream: trio.SocketStream) -> None:
        try:
            with trio.fail_after(RAW_IDLE_S):
                hello = RawHello.decode(await receive_exact(stream, RAW_HELLO_BYTES))
            if hello.kind == RAW_OBSERVE:
                ip, port = stream.socket.getpeername()[:2]
                self._note_observed(str(ip), int(port), trio.current_time())
                await stream.send_all(encode_observed(f"{ip}:{port}"))
            elif hello.kind == RAW_CIRCUIT:
                await self._join_circuit(hello.token, stream)
        except (WireError, trio.TooSlowError, OSError, trio.BrokenResourceError) as exc:
            log.debug("raw relay connection dropped: %s", exc)
        finally:
            with contextlib.suppress(Exception):
                await stream.aclose()

    async def _join_circuit(self, token: bytes, stream: trio.SocketStream) -> None:
        """Both halves' tasks live as long as the circuit (each holds its place in the caps);
        the second one splices."""
        circuit = self.pending.get(token)
        if circuit is None:
            return
        seat = current_seat()  # None: called outside serve_raw (tests)
        if seat is not None and not seat.move(self.circuit_caps):
            self._refuse("raw port full (circuit halves)")
            return
        circuit.halves.append(stream)
        if len(circuit.halves) == 1:
            with trio.move_on_after(CIRCUIT_PAIRING_S):
                await circuit.paired.wait()
            if not circuit.paired.is_set():
                self.pending.pop(token, None)
                return
            await circuit.done.wait()
            return
        del self.pending[token]
        circuit.paired.set()
        self.counters.circuits += 1
        self.counters.active += 1
        self.spliced.append(circuit)
        try:
            await splice(
                circuit.halves[0],
                circuit.halves[1],
                self.counters,
                MAX_CIRCUIT_BYTES,
                idle_s=CIRCUIT_IDLE_S,
            )
        finally:
            self.counters.active -= 1
            self.spliced.remove(circuit)
            circuit.done.set()


def encode_observed(text: str) -> bytes:
    data = text.encode()
    return bytes([len(data)]) + data
