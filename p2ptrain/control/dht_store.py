"""The control plane's Kademlia DHT (py-libp2p), and what it stores: signed records under our
two keys only, strictly; no provider records. Anything else others send is refused: keys
outside our namespace, other keys inside it, a record stored under another author's key
(docs/security.md, row 30.12)."""

from __future__ import annotations

from libp2p.abc import IHost
from libp2p.kad_dht.kad_dht import DHTMode, KadDHT
from libp2p.peer.peerinfo import PeerInfo
from libp2p.records.validator import NamespacedValidator, Validator

from p2ptrain.control import wire

DHT_NAMESPACE = "p2ptrain"
RUN_KEY = f"/{DHT_NAMESPACE}/run"  # the organiser's run spec
PEER_KEY_PREFIX = f"/{DHT_NAMESPACE}/peer/"  # + an author's peer id: its signed record
DHT_RECORD_MAX_AGE_S = 3600.0


class _SignedRecordValidator(Validator):
    """DHT values under /p2ptrain/ are signed envelopes; the newest seq wins. Only the two keys
    we put are taken: an author's peer record under /p2ptrain/peer/<author>, and a run spec under
    /p2ptrain/run (any other key in our namespace would let one author store without limit)."""

    def validate(self, key: str, value: bytes) -> None:
        if key != RUN_KEY and not key.startswith(PEER_KEY_PREFIX):
            raise wire.WireError(f"not a key of ours: {key[:100]!r}")  # before any signature
        env = wire.decode(value, max_age_s=DHT_RECORD_MAX_AGE_S)  # raises WireError (ValueError)
        expected = {"run": RUN_KEY, "peer": peer_key(env.author)}.get(env.kind)
        if key != expected:
            raise wire.WireError(f"forged: {env.kind} by {env.author} stored under {key}")

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
