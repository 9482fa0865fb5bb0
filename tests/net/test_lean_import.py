"""py-libp2p loads lean (p2ptrain/net/lean_import.py): a control process never imports the
transports we do not run, the scheduler's scipy stays in searches, and what stands in for a
left-out name fails loudly if anything ever used it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from p2ptrain.net import lean_import

# what the left-out subpackages (and dnspython's optional DNS over QUIC and HTTPS) would load
HEAVY = {"aioquic", "OpenSSL", "service_identity", "httpx", "requests", "zeroconf", "wsproto"}
HEAVY |= {"fastecdsa", "scipy", "coincurve", "Crypto", "pycparser", "sqlite3"}

_REPORT = """
import json, sys
import p2ptrain.control.node
member = sorted(sys.modules)  # what every member loads
from p2ptrain.control.planning import plan_maker
planning = sorted(sys.modules)  # what a planner's control process loads
from p2ptrain.control.planning import planner  # the planning child's
import p2ptrain.schedule.cost
quic = sys.modules["libp2p.transport.quic.transport"]
from libp2p.crypto.pb import crypto_pb2
from libp2p.crypto.serialization import deserialize_public_key
from libp2p.crypto.exceptions import MissingDeserializerError
refused = []
for key_type in (crypto_pb2.RSA, crypto_pb2.Secp256k1, crypto_pb2.ECDSA):
    key = crypto_pb2.PublicKey(key_type=key_type, data=bytes(33)).SerializeToString()
    try:
        deserialize_public_key(key)
    except MissingDeserializerError:
        refused.append(key_type)
from libp2p.relay.circuit_v2.nat import is_private_ip
from libp2p.bitswap.cid import parse_cid
print(json.dumps({
    "member": member,
    "planning": planning,
    "planner": sorted(sys.modules),
    "quic_is_left_out": type(quic).__name__ == "_LeftOutModule",
    "refused_key_types": refused,
    "kept_work": is_private_ip("10.1.2.3") and not is_private_ip("8.8.8.8"),
    "cid_kept": type(sys.modules["libp2p.bitswap.cid"]).__name__ == "module",
}))
"""


def _roots(names: list[str]) -> set[str]:
    return {name.split(".")[0] for name in names}


def test_a_control_process_loads_none_of_the_left_out_libraries() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _REPORT], capture_output=True, text=True, timeout=120, check=True
    )
    report = json.loads(out.stdout.splitlines()[-1])
    assert not _roots(report["planner"]) & HEAVY, _roots(report["planner"]) & HEAVY
    assert report["quic_is_left_out"]
    # a stranger's RSA or secp256k1 key is refused as py-libp2p refuses a key type it lacks
    assert report["refused_key_types"] == [0, 2, 3]
    # modules py-libp2p calls whatever its options stay real inside their left-out packages
    assert report["kept_work"] and report["cid_kept"]
    # numpy loads in the planning child (and a large swarm's status), not in a control process
    # that plans (control/planning/numbers.py)
    assert "numpy" not in _roots(report["member"])
    assert "numpy" not in _roots(report["planning"])
    assert "numpy" in _roots(report["planner"])
    # what we do run is the real thing
    assert {
        "libp2p.security.noise.transport",
        "libp2p.stream_muxer.yamux.yamux",
        "libp2p.transport.tcp.tcp",
    } <= set(report["member"])


def test_only_the_named_subpackages_are_left_out() -> None:
    assert lean_import.left_out("libp2p.transport.quic")
    assert lean_import.left_out("libp2p.transport.quic.stream")
    assert not lean_import.left_out("libp2p.transport.quicker")  # a prefix, not a package
    assert not lean_import.left_out("libp2p.transport.tcp.tcp")
    assert not lean_import.left_out("libp2p.security.noise.transport")
    assert lean_import.left_out("libp2p.relay.circuit_v2.transport")
    assert not lean_import.left_out("libp2p.relay.circuit_v2.nat")  # KEPT


def test_a_left_out_class_refuses_its_class_attributes_too() -> None:
    module = lean_import._LeftOutModule("libp2p.transport.quic.example")
    with pytest.raises(RuntimeError, match="does not load"):
        module.QUICTransport.from_config({})
    keys = lean_import._LeftOutModule("libp2p.crypto.rsa")
    with pytest.raises(Exception, match=r"RSAPublicKey\.from_bytes") as refused:
        keys.RSAPublicKey.from_bytes(b"\x30" * 40)
    assert type(refused.value).__name__ == "MissingDeserializerError"
    assert not issubclass(type(refused.value), RuntimeError)


def test_a_left_out_name_is_one_class_that_refuses_every_call() -> None:
    module = lean_import._LeftOutModule("libp2p.transport.quic.example")
    stand_in = module.QUICTransport
    assert stand_in is module.QUICTransport  # `except X` and isinstance see one class
    assert issubclass(stand_in, Exception)
    instance = stand_in("key", config=None)  # py-libp2p builds some at import time
    assert not isinstance(ValueError(), stand_in)
    with pytest.raises(RuntimeError, match="does not load"):
        instance.listen("/ip4/127.0.0.1/udp/0/quic-v1")
    with pytest.raises(AttributeError):
        module.__wrapped__  # noqa: B018  (dunder lookups stay real misses)


def test_install_is_idempotent() -> None:
    lean_import.install()
    lean_import.install()
    finders = [f for f in sys.meta_path if isinstance(f, lean_import._LeftOutFinder)]
    assert len(finders) == 1
