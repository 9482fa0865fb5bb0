"""The records' multiaddr check against the parsers it stands in for: every address it passes,
py-multiaddr (the control process's dialler) and hivemind's copy (the worker's) both parse.
Both parsers run in a child process: hivemind and py-libp2p cannot share one (their protobufs
clash), and other tests of this process may have imported py-libp2p."""

from __future__ import annotations

import importlib.util
import json
import random
import subprocess
import sys

import base58
import pytest

from p2ptrain.errors import WireError
from p2ptrain.records import PeerRecord, Plan
from p2ptrain.records.multiaddrs import problem, valid_peer_id
from tests.records.samples import A, peer_dict, plan_dict

PARSE_BOTH = """
import json, sys
from multiaddr import Multiaddr as Control
from hivemind.utils.multiaddr import Multiaddr as Worker

def parses(kind, text):
    try:
        str(kind(text))  # printing checks the value again
    except Exception:
        return False
    return True

from multiaddr.protocols import REGISTRY

# a host named like any protocol py-multiaddr knows, whatever its version
names = [p.name for p in REGISTRY._names_to_protocols.values()]
texts = json.load(sys.stdin) + [f"/dns4/{name}/tcp/1" for name in names]
json.dump([[t, parses(Control, t), parses(Worker, t)] for t in texts], sys.stdout)
"""

SHA256_ID = "QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"
ED25519_ID = "12D3KooWD3eckifWpRn9wQpMG9R9hX3sD158z7EqHWmweQAJU5SA"
# what our nodes and p2pd announce, and the other shapes a multiaddr of ours may take
GOOD = [
    "/ip4/127.0.0.1/tcp/4001",
    f"/ip4/203.0.113.7/tcp/7401/p2p/{ED25519_ID}",
    f"/ip4/1.2.3.4/tcp/1/p2p/{SHA256_ID}",
    f"/ip4/1.2.3.4/tcp/1/p2p/{A}",
    "/ip6/::1/tcp/4001",
    "/ip6/fe80::1/tcp/1",
    "/ip6/::ffff:1.2.3.4/tcp/1",
    "/ip6/1:2:3:4:5:6:7:8/tcp/65535",
    "/dns4/bootstrap.example.org/tcp/7400",
    "/dns/a-b.c/tcp/1",
    "/dnsaddr/x.y",
    "/ip4/1.2.3.4/udp/4001/quic-v1",
    "/ip4/1.2.3.4/udp/4001/quic",
    "/ip4/1.2.3.4/tcp/1/ws",
    "/ip4/1.2.3.4/tcp/1/wss",
    f"/ip4/1.2.3.4/tcp/1/p2p/{ED25519_ID}/p2p-circuit/p2p/{SHA256_ID}",
]
# what a parser refuses, one of them at least: each was once a record's, and crashed a node
BAD = [
    "/ip4/8.8.8.8/tcp/4001/ipfs/1",
    f"/ip4/8.8.8.8/tcp/4001/ipfs/{SHA256_ID}",
    "/ip4/8.8.8.8/tcp/4001/p2p/1",
    "/ip4/1.2.3.4/tcp/1/p2p/11",
    f"/ip4/1.2.3.4/tcp/1/p2p/{SHA256_ID[:-1]}",
    f"/ip4/1.2.3.4/tcp/1/p2p/1{ED25519_ID}",
    "/ip6/::::/tcp/1",
    "/ip6/::1%eth0/tcp/1",
    "/ip6/١::1/tcp/1",
    "/ip4/1.2.3.4/tcp/²",
    "/ip4/1.2.3.4/tcp/65536",
    "/ip4/01.2.3.4/tcp/1",
    "/ip4/١.2.3.4/tcp/1",
    "/ip4/1.2.3.4/udp/1/quic-v1/webtransport",
    "/dns/-a/tcp/1",
    "/dns/a_b/tcp/1",
    "/dns/a..b/tcp/1",
    "/dns/a./tcp/1",
    "/dns/ab--c/tcp/1",
    "/dns/xn--abc/tcp/1",
]
# what both parse, read as another text: refused all the same, so an address means one thing
ODD_SPELLINGS = ["/ip4/1.2.3.4/tcp/٣", "/dns/ﬀ.example/tcp/1", "/dns/xn--bcher-kva.example/tcp/1"]


def _parse_both(texts: list[str]) -> dict[str, tuple[bool, bool]]:
    """Each text's verdicts (py-multiaddr's, hivemind's), with more texts the child adds."""
    if importlib.util.find_spec("hivemind") is None:
        pytest.skip("hivemind is not installed (the `train` extra)")
    done = subprocess.run(
        [sys.executable, "-c", PARSE_BOTH],
        input=json.dumps(texts),
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return {text: (control, worker) for text, control, worker in json.loads(done.stdout)}


def _peer_ids(rng: random.Random) -> list[str]:
    """Real peer ids of every shape, and near misses of them."""
    ids = [ED25519_ID, SHA256_ID, A]
    ids += [base58.b58encode(b"\x12\x20" + rng.randbytes(32)).decode() for _ in range(8)]
    ids += [
        base58.b58encode(b"\x00" + bytes([n]) + rng.randbytes(n)).decode() for n in range(1, 46)
    ]
    near = []
    for peer in ids:
        at = rng.randrange(len(peer))
        near += [peer[:at] + peer[at + 1 :], peer[:at] + rng.choice("1zQ0Il") + peer[at:], peer]
    return ids + near + ["1", "11", "Qm", "0OIl", "x" * 52, "1" * 60]


VALUE_KINDS = {"ip4": "ip4", "ip6": "ip6", "dns": "host", "dns4": "host", "dnsaddr": "host"}
VALUE_KINDS |= {"tcp": "port", "udp": "port", "p2p": "peer", "ipfs": "peer"}
USUAL = ["ip4", "ip6", "dns4", "tcp", "udp", "p2p", "quic-v1", "ws", "p2p-circuit"]
ODD = ["dns", "dnsaddr", "ipfs", "webtransport", "unix", "onion", ""]


# values of each kind, for the random candidates
WELL_FORMED = {
    "ip4": ["1.2.3.4", "0.0.0.0", "255.255.255.255", "127.0.0.1", "10.0.0.1"],
    "ip6": ["::", "::1", "::ffff:1.2.3.4", "fe80::1", "2001:db8::1", "1:2:3:4:5:6:7:8"],
    "host": ["a", "a.b", "A-b.c", "1.2.3.4", "x1.example.org", "a" * 63],
    "port": ["0", "1", "65535", "01", "00000", "7401"],
}
MALFORMED = {
    "ip4": ["256.1.1.1", "1.2.3", "01.2.3.4", "", "1.2.3.4.5", "١.2.3.4"],
    "ip6": ["::::", ":::", "1::2::3", "fe80::1%1", "g::1", "1:2:3:4:5:6:7:8:9", "::1.2.3"],
    "host": ["-a", "a-", "a..b", "a.", "ab--c", "a" * 64, "a_b", "é.fr", "ws", "p2p"],
    "port": ["65536", "-1", "+1", " 1", "²", "٣", "1" * 9, ""],
}


def _candidates(num: int, seed: int) -> list[str]:
    """Random multiaddrs of mostly the usual protocols and values, some odd ones among them."""
    rng = random.Random(seed)
    values = {kind: [*WELL_FORMED[kind], *MALFORMED[kind]] for kind in WELL_FORMED}
    values["peer"] = _peer_ids(rng)
    texts = []
    for _ in range(num):
        parts = [""]
        for _ in range(rng.randint(1, 4)):
            protocol = rng.choice(USUAL if rng.random() < 0.85 else ODD)
            parts.append(protocol)
            kind = VALUE_KINDS.get(protocol)
            if kind is not None and rng.random() < 0.95:
                parts.append(rng.choice(values[kind]))
            elif rng.random() < 0.1:
                parts.append(rng.choice(values[rng.choice(list(values))]))
        texts.append("/".join(parts))
    return texts


def test_what_the_check_passes_both_dialers_parse() -> None:
    verdicts = _parse_both(GOOD + BAD + ODD_SPELLINGS + _candidates(3000, seed=1))
    passed = [text for text in verdicts if problem(text) is None]
    refused = {text: verdicts[text] for text in passed if verdicts[text] != (True, True)}
    assert not refused, f"passed, but a parser refuses: {refused}"
    assert len(passed) > 300  # the candidates do reach addresses that pass
    assert all(problem(text) is None for text in GOOD)
    assert all(verdicts[text] == (True, True) for text in GOOD)
    assert all(verdicts[text] != (True, True) for text in BAD)  # each list is what it says


@pytest.mark.parametrize("addr", BAD + ODD_SPELLINGS)
def test_an_address_a_dialer_refuses_is_refused_in_every_record(addr: str) -> None:
    """A signed peer record with `/ipfs/1` crashed every control process that dialled it, and a
    plan's data address `/ip6/::::/tcp/1` every worker of the plan."""
    assert problem(addr) is not None
    with pytest.raises(WireError):
        PeerRecord.from_dict({**peer_dict(), "addrs": [addr]})
    with pytest.raises(WireError):
        Plan.from_dict({**plan_dict(), "data_addrs": {A: [addr]}})


def test_a_peer_id_is_a_canonical_base58_multihash() -> None:
    assert valid_peer_id(ED25519_ID) and valid_peer_id(SHA256_ID)
    assert not valid_peer_id("1" + ED25519_ID)  # one more zero byte: no multihash
    assert not valid_peer_id(SHA256_ID + "1")
    assert not valid_peer_id("Qm" + "1" * 44)
    assert not valid_peer_id("")
