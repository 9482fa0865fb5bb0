"""Run by test_dht_gate.py in its own process (hivemind cannot share one with libp2p): two
members' DHTs behind worker/dht_gate.py's gate, and 5 stranger DHT nodes whose self-chosen node
ids sit next to a plan's announcement key and that say "stored" but keep nothing (without the
gate every member stored its announcement on them alone, and no member found another's). Prints
one JSON line: what member B found of member A's record, whether a stranger could store, and
how many requests the members refused.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from functools import partial
from pathlib import Path

import hivemind
from hivemind.dht.routing import DHTID
from hivemind.utils import get_dht_time
from hivemind.utils.timed_storage import TimedStorage

from p2ptrain.worker.dht_gate import (
    _GATE,
    admit_plan_peers,
    serve_plan_peers_only,
    start_gated_dht,
)
from p2ptrain.worker.dht_helpers import AnnouncementValidator, bootstrap_dht
from p2ptrain.worker.dht_quota import MAX_ENTRIES_PER_PEER
from p2ptrain.worker.private_tmp import PrivateTmp

KEY = "p2ptrain_probe_run_resume_t3_e7"  # resume_key(): predictable from a plan's term, epoch
NUM_STRANGERS = 5  # hivemind's num_replicas: the nodes a key is stored on
KEY_DIR = Path(tempfile.mkdtemp())


def _p2pd_args() -> list[str]:
    """The command line of the one p2pd running so far (a's)."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            args = cmdline.read_bytes().decode().split("\0")
            if args and Path(args[0]).name == "p2pd" and str(os.getpid()) in _ancestors(cmdline):
                return args
    return []


def _ancestors(cmdline: Path) -> list[str]:
    pids, pid = [], cmdline.parent.name
    while pid not in ("0", "1"):
        stat = (Path("/proc") / pid / "stat").read_text()
        pid = stat.rpartition(")")[2].split()[1]  # the parent's pid
        pids.append(pid)
    return pids


async def _store_many(keys: list[str], expiry: float, _dht: object, node: object) -> None:
    """`node` stores every key at once (in its DHT process): on its nearest peers."""
    await node.store_many(keys, ["x"] * len(keys), expiry)  # type: ignore[attr-defined]


async def _store_dictionary(
    target: object, num_items: int, expiry: float, _dht: object, node: object
) -> bool:
    """`node` asks `target` to store one dictionary of `num_items` fresh items."""
    from hivemind.dht.storage import DictionaryDHTValue

    dictionary = DictionaryDHTValue()
    for i in range(num_items):
        dictionary.store(f"sub-{i}", b"x" * 10, expiry)
    key = DHTID.generate(source="dictionary-key")
    # into the cache: b's storage slot is full after its flood, its cache slot is empty
    stored = await node.protocol.call_store(  # type: ignore[attr-defined]
        target, [key], [dictionary], get_dht_time() - 1, in_cache=True
    )
    return bool(stored and stored[0])


async def _over_quota(_dht: object, node: object) -> int:
    """How many records the gate of `node` (in its DHT process) refused for its quota."""
    return int(getattr(node.protocol, _GATE).num_over_quota)  # type: ignore[attr-defined]


def main() -> None:
    PrivateTmp().use()  # hivemind's sockets and multiprocessing's folders go with us
    listen = ["/ip4/127.0.0.1/tcp/0"]
    validators = [AnnouncementValidator()]
    a = start_gated_dht(listen[0], [], str(KEY_DIR / "a.key"), validators)  # as a worker starts
    p2pd_args = _p2pd_args()
    entry = [str(addr) for addr in a.get_visible_maddrs()]
    # connected, as a session's transport connects the plan's peers before the DHT is used
    b = hivemind.DHT(
        start=True,
        host_maddrs=listen,
        initial_peers=entry,
        record_validators=validators,
        ensure_bootstrap_success=False,  # a's gate admits b once both are up
    )
    members = {a.peer_id.to_base58(), b.peer_id.to_base58()}
    serve_plan_peers_only(b)
    for dht in (a, b):
        admit_plan_peers(dht, members)
    bootstrap_dht(b, [a.peer_id.to_base58()])
    # the strangers: forked with a storage that keeps nothing, node ids next to the key
    keeps = TimedStorage.store
    TimedStorage.store = lambda self, key, value, expiration_time: True  # type: ignore[method-assign,assignment]
    key_id = int(DHTID.generate(source=KEY))
    strangers = [
        hivemind.DHT(
            start=True,
            initial_peers=entry,
            node_id=DHTID(key_id ^ (i + 1)),
            host_maddrs=listen,
            ensure_bootstrap_success=False,  # the gate refuses their pings
            wait_timeout=1.0,
        )
        for i in range(NUM_STRANGERS)
    ]
    TimedStorage.store = keeps  # type: ignore[method-assign]
    time.sleep(1.0)
    stored = a.store(KEY, "A's announcement", get_dht_time() + 600, subkey="a-record")
    found, deadline = None, time.monotonic() + 15
    while found is None and time.monotonic() < deadline:
        found = b.get(KEY, latest=True)
        if found is None:
            time.sleep(0.3)
    strangers[0].store("stranger-key", "x", get_dht_time() + 60)
    stranger_stored = a.get("stranger-key") is not None or b.get("stranger-key") is not None
    # a member storing fresh keys without end: held to its quota of records on a
    flood = [f"flood-{i}" for i in range(MAX_ENTRIES_PER_PEER + 20)]
    b.run_coroutine(partial(_store_many, flood, get_dht_time() + 600))
    over_quota = a.run_coroutine(_over_quota)
    # a whole dictionary of fresh items under one key, its own expiry already past (hivemind
    # stores the items under theirs): the items count, one by one
    dictionary_stored = b.run_coroutine(
        partial(_store_dictionary, a.peer_id, MAX_ENTRIES_PER_PEER + 1, get_dht_time() + 600)
    )
    over_quota_after = a.run_coroutine(_over_quota)
    refused = [admit_plan_peers(dht, members) for dht in (a, b)]
    value = None if found is None else {k: v.value for k, v in found.value.items()}
    print(
        json.dumps(
            {
                "stored": stored,
                "found": value,
                "stranger_stored": stranger_stored,
                "refused": refused,
                "over_quota": over_quota,
                "dictionary_stored": dictionary_stored,
                "dictionary_over_quota": over_quota_after - over_quota,
                "p2pd_args": p2pd_args,
            }
        )
    )
    for dht in (*strangers, b, a):
        dht.shutdown()


if __name__ == "__main__":
    main()
