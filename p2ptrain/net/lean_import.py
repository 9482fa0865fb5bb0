"""py-libp2p without the transports we never run: importing `libp2p` loads every transport,
security and discovery module it ships (QUIC on aioquic and OpenSSL, TLS with its ACME client on
httpx and requests, WebSocket, secio, mDNS on zeroconf, a Prometheus exporter for its resource
manager): ~23 MiB of a control process's ~100 MiB, in every one of a machine's nodes; then
circuit relay v2, bitswap, persistent peer stores (sqlite), private networks (pycryptodome, which
parses C declarations with pycparser at import) and RSA and secp256k1 keys (coincurve): ~7 MiB more.

We run TCP, Noise and yamux (net/host.py), so those subpackages are replaced, before anything
imports them, by placeholder modules: any name imported from one is a placeholder class (an
Exception subclass, so `except` and `isinstance` against it stay valid and simply never match)
whose instances, and the class itself, refuse every method call. py-libp2p builds a QUIC, TLS or
WebSocket transport only when asked for one (a listen address or an option we never give), so
none is ever built. A few modules inside a left-out package stay real (KEPT): py-libp2p calls
them whatever its options.

Every p2ptrain identity is Ed25519 (key_file.py). A remote RSA or secp256k1 key (a handshake, a
signed pubsub message, a peer record) is refused as a key type without a deserializer
(MissingDeserializerError), as py-libp2p refuses any key type it does not know: a path every
caller already takes for a stranger's bytes.

install() runs when p2ptrain.net is imported; control/ and traversal/ import p2ptrain.net first
(their package __init__), so no module of ours imports py-libp2p before it. Pinned to the
py-libp2p version in pyproject.toml: tests/net/test_lean_import.py checks the subpackages stay
out, and every loopback test runs hosts built this way.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import types
from collections.abc import Sequence
from typing import Any, NoReturn

# key types no p2ptrain node has: coincurve's secp256k1, pycryptodome's RSA
REFUSED_KEYS = ("libp2p.crypto.rsa", "libp2p.crypto.secp256k1")
# subpackages of py-libp2p we never use, and what each would load
LEFT_OUT = (
    "libp2p.transport.quic",  # aioquic, pyOpenSSL, service_identity
    "libp2p.transport.websocket",  # trio-websocket, wsproto
    "libp2p.security.tls",  # its AutoTLS ACME client: httpx, requests, rich, pygments, click
    "libp2p.security.secio",  # fastecdsa
    "libp2p.discovery.mdns",  # zeroconf
    "libp2p.rcmgr.prometheus_exporter",  # prometheus_client's exposition (web/ loads it itself)
    "libp2p.relay",  # circuit relay v2 (ours is control/relay_service.py)
    "libp2p.bitswap",  # block exchange
    "libp2p.peer.persistent",  # sqlite, LevelDB, RocksDB peer stores: ours is in memory
    "libp2p.security.pnet",  # pre-shared-key networks: pycryptodome, cffi's C parser
    *REFUSED_KEYS,
)
# real modules inside left-out packages, which py-libp2p uses whatever its options
KEPT = (
    "libp2p.relay.circuit_v2.nat",  # basic_host: is an observed address private?
    "libp2p.bitswap.cid",  # kad_dht: a DHT key that parses as a CID is hashed as one
)


def _refusal(module: str, qualname: str) -> Any:
    def refuse(*args: Any, **kwargs: Any) -> NoReturn:
        if module.startswith(REFUSED_KEYS):
            from libp2p.crypto.exceptions import MissingDeserializerError

            raise MissingDeserializerError({"key_type": module.rsplit(".", 1)[-1], "key": qualname})
        raise RuntimeError(f"{module}.{qualname}: {_WHY}")

    return refuse


class _RefusingClass(type):
    """The class of a stand-in: a class attribute (`RSAPublicKey.from_bytes`, looked up when
    py-libp2p builds its deserializer table) is a function that refuses."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _refusal(cls.__module__, f"{cls.__name__}.{name}")


class LeftOut(Exception, metaclass=_RefusingClass):
    """A name from a left-out subpackage: constructible (py-libp2p builds some at import time),
    but no method of it runs."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args)

    def __getattr__(self, name: str) -> Any:
        return _refusal(type(self).__module__, f"{type(self).__name__}.{name}")


_WHY = "p2ptrain does not load this part of py-libp2p (p2ptrain/net/lean_import.py)"


class _LeftOutModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        stand_in = type(name, (LeftOut,), {"__module__": self.__name__, "__doc__": _WHY})
        setattr(self, name, stand_in)  # one class per name: `except X` and isinstance agree
        return stand_in


def left_out(name: str) -> bool:
    if name in KEPT:
        return False
    return any(name == package or name.startswith(package + ".") for package in LEFT_OUT)


class _LeftOutFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == "libp2p":
            _plain_dns_only()  # then py-libp2p loads as usual
        if not left_out(fullname):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _LeftOutModule(spec.name, _WHY)

    def exec_module(self, module: types.ModuleType) -> None:
        # a package: its submodules come from this finder, but for the KEPT ones, which the
        # usual finders look up on this path, the package's real one
        parent, _, leaf = module.__name__.rpartition(".")
        module.__path__ = [os.path.join(path, leaf) for path in sys.modules[parent].__path__]


def install() -> None:
    """Put the finder first on sys.meta_path (once). A subpackage already imported stays as it
    is: the finder only answers for names not yet loaded."""
    if not any(isinstance(finder, _LeftOutFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _LeftOutFinder())


def _plain_dns_only() -> None:
    """py-libp2p's TCP transport resolves /dns addresses (an organiser's bootstrap) with
    dnspython, which loads aioquic and httpx for DNS over QUIC and HTTPS when installed: we
    resolve over plain DNS only (dnspython's own switch for its optional features). Done when
    py-libp2p is first imported, not at install(): the node's supervisor never loads either."""
    import dns._features

    for feature in ("doq", "doh"):
        dns._features.force(feature, False)
