"""Fuzzing the start-step announcements off the data-plane DHT (worker/resume/announcement.py):
`check_announcement` returns the states or None (its refusal) for any value, and every worker's
`AnnouncementValidator` says yes or no for any record, never raising. The validator runs in a
subprocess: it imports hivemind, which this process must not (it imports libp2p)."""

from __future__ import annotations

import json
import random
import subprocess
import sys

from p2ptrain import identity
from p2ptrain.worker.resume.announcement import check_announcement, sign_announcement
from tests.records.test_fuzz import _mutate

SEED = bytes(range(32))
PEER = identity.peer_id_of(SEED)
KEY = "p2ptrain_r_resume_t1_e3"
DIGEST = "ab" * 32
STATES = {
    "L0-2": {3: (DIGEST, None), 5: (DIGEST, "0123456789abcdef-e4")},
    "L2-4": {3: (DIGEST, None)},
}


def test_a_mutated_announcement_is_checked_or_refused_never_raised() -> None:
    value = sign_announcement(SEED, KEY, PEER, STATES)
    assert check_announcement(value, KEY, PEER, 40) == STATES
    rng = random.Random(1)
    num_valid = 0
    for _ in range(1500):
        checked = check_announcement(_mutate(rng, value), KEY, PEER, 40)
        assert checked is None or isinstance(checked, dict)
        num_valid += checked is not None
    assert num_valid < 1500  # the mutations do reach the checks


VALIDATE = """
import json, random, sys

from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord
from hivemind.utils.serializer import MSGPackSerializer
from hivemind.utils.timed_storage import get_dht_time

from p2ptrain.worker.dht_helpers import AnnouncementValidator

key, peer, values = sys.argv[1], sys.argv[2], json.loads(sys.stdin.read())
rng = random.Random(1)
validator, dht_key = AnnouncementValidator(), DHTID.generate(source=key).to_bytes()
subkey = MSGPackSerializer.dumps("resume:" + peer)
verdicts = []
for index, value in enumerate(values):
    sig = value.get("sig") if isinstance(value, dict) else None
    if isinstance(sig, str):  # JSON carried it as hex
        try:
            value["sig"] = bytes.fromhex(sig)
        except ValueError:
            value["sig"] = sig.encode()
    raw = rng.randbytes(rng.randint(0, 64))
    if index % 4:
        try:
            raw = MSGPackSerializer.dumps(value)
        except (OverflowError, ValueError):  # 10**400, too deep: no DHT value carries it
            pass
    sub = subkey if index % 5 else rng.randbytes(rng.randint(0, 16))
    verdicts.append(validator.validate(DHTRecord(dht_key, sub, raw, get_dht_time() + 60)))
print(json.dumps({"verdicts": verdicts}))
"""


def test_the_dht_validator_says_yes_or_no_to_any_record() -> None:
    value = sign_announcement(SEED, KEY, PEER, STATES)
    wire_value = dict(value, sig=value["sig"].hex())  # JSON to the child, bytes again there
    rng = random.Random(2)
    values = [wire_value] + [_mutate(rng, wire_value) for _ in range(1500)]
    done = subprocess.run(
        [sys.executable, "-c", VALIDATE, KEY, PEER],
        input=json.dumps(values, allow_nan=True),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    verdicts = json.loads(done.stdout.strip().splitlines()[-1])["verdicts"]
    assert len(verdicts) == len(values) and all(isinstance(v, bool) for v in verdicts)
    assert verdicts[0] is True  # hex back to bytes: the valid announcement
