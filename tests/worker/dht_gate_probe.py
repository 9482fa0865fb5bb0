"""Run by test_dht_gate.py in its own process (hivemind cannot share one with libp2p): two
members' DHTs behind worker/dht_gate.py's gate, and 5 stranger DHT nodes whose self-chosen node
ids sit next to a plan's announcement key and that say "stored" but keep nothing (without the
gate every member stored its announcement on them alone, and no member found another's). Prints
one JSON line: what member B found of member A's record, whether a stranger could store, and
how many requests the members refused.
"""

from __future__ import annotations

import json
import time

import hivemind
from hivemind.dht.routing import DHTID
from hivemind.utils import get_dht_time
from hivemind.utils.timed_storage import TimedStorage

from p2ptrain.worker.dht_gate import admit_plan_peers, serve_plan_peers_only
from p2ptrain.worker.dht_helpers import AnnouncementValidator, bootstrap_dht

KEY = "p2ptrain_probe_run_resume_t3_e7"  # resume_key(): predictable from a plan's term, epoch
NUM_STRANGERS = 5  # hivemind's num_replicas: the nodes a key is stored on


def main() -> None:
    listen = ["/ip4/127.0.0.1/tcp/0"]
    validators = [AnnouncementValidator()]
    a = hivemind.DHT(start=True, host_maddrs=listen, record_validators=validators)
    entry = [str(addr) for addr in a.get_visible_maddrs()]
    # connected, as a session's transport connects the plan's peers before the DHT is used
    b = hivemind.DHT(
        start=True, host_maddrs=listen, initial_peers=entry, record_validators=validators
    )
    members = {a.peer_id.to_base58(), b.peer_id.to_base58()}
    for dht in (a, b):
        serve_plan_peers_only(dht)
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
    refused = [admit_plan_peers(dht, members) for dht in (a, b)]
    value = None if found is None else {k: v.value for k, v in found.value.items()}
    print(
        json.dumps(
            {
                "stored": stored,
                "found": value,
                "stranger_stored": stranger_stored,
                "refused": refused,
            }
        )
    )
    for dht in (*strangers, b, a):
        dht.shutdown()


if __name__ == "__main__":
    main()
