"""What a stranger may park in a worker's hivemind DHT (worker/dht_helpers.py): every record it
stores or reads must expire within MAX_EXPIRATION_S and be at most MAX_RECORD_BYTES, or hivemind's
unbounded storage keeps it as long as its sender says. Our own records stay within both: the
largest announcement check_announcement accepts, at the announcements' TTL. The validator runs
in a subprocess: it imports hivemind, which this process must not (it imports libp2p)."""

from __future__ import annotations

import json
import subprocess
import sys

VALIDATE = """
import json, math

from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord
from hivemind.utils.serializer import MSGPackSerializer
from hivemind.utils.timed_storage import get_dht_time

from p2ptrain import identity
from p2ptrain.worker.dht_helpers import MAX_EXPIRATION_S, MAX_RECORD_BYTES, AnnouncementValidator
from p2ptrain.worker.resume.announcement import (
    MAX_KEYS, MAX_STEPS_PER_KEY, SUBKEY_PREFIX, sign_announcement,
)
from p2ptrain.worker.resume.start_step import ANNOUNCEMENT_TTL_S

seed = bytes(range(32))
peer = identity.peer_id_of(seed)
validator = AnnouncementValidator()
key = DHTID.generate(source="p2ptrain_r_s0_t0_e0.0b").to_bytes()
averager = MSGPackSerializer.dumps(b"\\x00" * 38)  # a matchmaking subkey: a peer id's bytes
looking = MSGPackSerializer.dumps(True)


def verdict(value, expires_in, subkey=averager, dht_key=key):
    return validator.validate(DHTRecord(dht_key, subkey, value, get_dht_time() + expires_in))


# the largest announcement check_announcement accepts: every bound at its maximum
resume_key = "p2ptrain_" + "r" * 64 + "_resume_t" + "9" * 15 + "_e" + "9" * 15
tag = "f" * 16 + "-e" + "9" * 16
states = {
    f"L{i:015d}-{i + 1:015d}": {2**64 - 1 - j: ("ab" * 32, tag) for j in range(MAX_STEPS_PER_KEY)}
    for i in range(MAX_KEYS)
}
largest = MSGPackSerializer.dumps(sign_announcement(seed, resume_key, peer, states))
largest_args = (
    largest,
    ANNOUNCEMENT_TTL_S + 300,  # stored by a peer whose clock is 5 minutes ahead of ours
    MSGPackSerializer.dumps(SUBKEY_PREFIX + peer),
    DHTID.generate(source=resume_key).to_bytes(),
)
print(json.dumps({
    "matchmaking": verdict(looking, 30),
    "far_future": verdict(looking, 10**9),
    "past_the_cap": verdict(looking, MAX_EXPIRATION_S + 60),
    "nan": verdict(looking, math.nan),
    "inf": verdict(looking, math.inf),
    "oversized": verdict(b"\\x00" * MAX_RECORD_BYTES, 30),
    "oversized_subkey": verdict(looking, 30, subkey=b"\\x00" * MAX_RECORD_BYTES),
    "largest_announcement": verdict(*largest_args),
    "largest_announcement_bytes": len(largest),
}))
"""


def _verdicts() -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", VALIDATE], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    verdicts: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return verdicts


def test_records_past_the_expiration_or_size_caps_are_refused_ours_pass() -> None:
    verdicts = _verdicts()
    assert verdicts["matchmaking"] is True
    assert verdicts["largest_announcement"] is True
    size = verdicts["largest_announcement_bytes"]
    assert isinstance(size, int) and 1_500_000 < size < 2 * 1024**2
    refused = ("far_future", "past_the_cap", "nan", "inf", "oversized", "oversized_subkey")
    assert {name: verdicts[name] for name in refused} == dict.fromkeys(refused, False)
