"""The control plane's Kademlia DHT (py-libp2p), and what it stores: signed records under our
two keys only, strictly; no provider records. Anything else others send is refused: keys
outside our namespace, other keys inside it, a record stored under another author's key
(docs/security.md, row 30.12)."""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Callable, Iterator

import trio
from libp2p.abc import IHost
from libp2p.kad_dht.kad_dht import DHTMode, KadDHT
from libp2p.peer.peerinfo import PeerInfo
from libp2p.records.validator import NamespacedValidator, Validator

from p2ptrain.control import wire

DHT_NAMESPACE = "p2ptrain"
RUN_KEY = f"/{DHT_NAMESPACE}/run"  # the organiser's run spec
PEER_KEY_PREFIX = f"/{DHT_NAMESPACE}/peer/"  # + an author's peer id: its signed record
DHT_RECORD_MAX_AGE_S = 3600.0
# what values others store with us may cost in parsing and signature checks (~0.2 ms a kB)
VALIDATE_BYTES_PER_S = 256 * 1024
VALIDATE_BURST_BYTES = 2 * 1024 * 1024
# the task that puts a value of ours, while it does: the library validates our own record in
# that task, and a flood that spent the budget must not fail our puts. The task, not a flag:
# trio tasks inherit their spawner's context, and a connection our put dials starts its stream
# handlers (a stranger's PUTs among them) from our task
_OURS: contextvars.ContextVar[object] = contextvars.ContextVar("p2ptrain_own_dht_put", default=None)


def _ours() -> bool:
    try:
        return _OURS.get() is trio.lowlevel.current_task()
    except RuntimeError:  # not in a trio task: not our put
        return False


@contextlib.contextmanager
def own_operation() -> Iterator[None]:
    """Around our own DHT puts: what they validate in this task is not charged to the
    strangers' budget."""
    token = _OURS.set(trio.lowlevel.current_task())
    try:
        yield
    finally:
        _OURS.reset(token)


class _SignedRecordValidator(Validator):
    """DHT values under /p2ptrain/ are signed envelopes; the newest seq wins. Only the two keys
    we put are taken: an author's peer record under /p2ptrain/peer/<author>, and a run spec under
    /p2ptrain/run (any other key in our namespace would let one author store without limit)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._budget = float(VALIDATE_BURST_BYTES)
        self._at = clock()

    def validate(self, key: str, value: bytes) -> None:
        if key != RUN_KEY and not key.startswith(PEER_KEY_PREFIX):
            raise wire.WireError(f"not a key of ours: {key[:100]!r}")  # before any signature
        # before parsing: a peer record or run spec is a gossip-sized envelope of its key's
        # kind (a 1 MiB value of kind "plan" was parsed and verified whole: 125 ms a PUT)
        if len(value) > wire.MAX_ENVELOPE_BYTES:
            raise wire.WireError(f"oversized: {len(value)} bytes")
        if (b'"kind":"run"' if key == RUN_KEY else b'"kind":"peer"') not in value:
            raise wire.WireError(f"not a record of the kind {key[:100]!r} holds")
        if not _ours():
            self._spend(len(value))
        env = wire.decode(value, max_age_s=DHT_RECORD_MAX_AGE_S)  # raises WireError (ValueError)
        expected = {"run": RUN_KEY, "peer": peer_key(env.author)}.get(env.kind)
        if key != expected:
            raise wire.WireError(f"forged: {env.kind} by {env.author} stored under {key}")

    def _spend(self, num_bytes: int) -> None:
        """The library's handler reads PUT_VALUEs one after another on a stream, past our stream
        caps: the bytes we parse and verify for others are budgeted (honest records are a few
        kB each, re-put every few minutes), so a flood costs a bounded share of the loop."""
        now = self.clock()
        self._budget = min(
            VALIDATE_BURST_BYTES, self._budget + (now - self._at) * VALIDATE_BYTES_PER_S
        )
        self._at = now
        if self._budget < num_bytes:
            raise wire.WireError("refused: the DHT's validation budget is spent")
        self._budget -= num_bytes

    def select(self, key: str, values: list[bytes]) -> int:
        def seq(value: bytes) -> int:
            try:
                return wire.decode(value, max_age_s=DHT_RECORD_MAX_AGE_S).seq
            except wire.WireError:
                return -1

        return max(range(len(values)), key=lambda i: seq(values[i]))


def peer_key(peer: str) -> str:
    """Where `peer`'s signed record lives in the DHT."""
    return f"{PEER_KEY_PREFIX}{peer}"


def _refuse_provider(key: bytes, provider: PeerInfo) -> None:
    """We never provide nor look providers up: an ADD_PROVIDER (any key, any number of
    addresses, kept 48 h) stores nothing. py-libp2p ignores enable_providers on requests."""


def make_dht(host: IHost) -> KadDHT:
    """A DHT server that stores only signed records under our two keys, and no provider records
    (still to be started)."""
    # strict: a key in no registered namespace is refused (lax, py-libp2p keeps it unchecked);
    # validator_changed: not the library's /pk and /ipns either, which any identity may fill
    validator = NamespacedValidator(
        {DHT_NAMESPACE: _SignedRecordValidator()}, strict_validation=True
    )
    dht = KadDHT(
        host,
        DHTMode.SERVER,
        validator=validator,
        validator_changed=True,
        strict_validation=True,
        enable_providers=False,
        max_peers_per_subnet=0,
    )
    dht.provider_store.add_provider = _refuse_provider  # type: ignore[method-assign]
    return dht
