"""A member's signed announcement of the stage states it holds, as it crosses the DHT.

Before a new plan starts, every member stores one under the plan's key (worker/resume/
start_step.py): its states (layers key -> step -> sha256 and lineage tag), bound to that key and
signed by the member's identity key, so it cannot be forged or replayed under another plan. It
comes off the wire: `check_announcement` bounds and verifies it, or refuses it (None).
"""

from __future__ import annotations

import json
import re
from typing import Any

from p2ptrain import identity
from p2ptrain.records.lineage import parse_tag

MAX_KEYS = 256  # stage layer ranges one peer may announce
MAX_STEPS_PER_KEY = 64
MAX_KEY_CHARS = 32
SUBKEY_PREFIX = "resume:"  # + the announcing peer id; dht_helpers.AnnouncementValidator
_DIGEST = re.compile(r"^[0-9a-f]{64}$")

# as announced: layers key -> step -> (sha256, lineage tag or None for the root lineage)
Announced = dict[str, dict[int, tuple[str, str | None]]]


def announcement_payload(key: str, peer: str, states: Announced) -> bytes:
    """The signed bytes of an announcement: canonical JSON of the DHT key, the peer and its
    states (the key binds it to one plan, so it cannot be replayed under another)."""
    body = {"key": key, "peer": peer, "states": _wire_states(states)}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def _wire_states(states: Announced) -> dict[str, list[list[Any]]]:
    """[step, sha256, tag ("" for the root lineage)] per state, sorted."""
    return {
        k: sorted([s, d, t or ""] for s, (d, t) in steps.items()) for k, steps in states.items()
    }


def sign_announcement(seed: bytes, key: str, peer: str, states: Announced) -> dict[str, Any]:
    """The DHT value announcing `states` under `key`, signed by `peer`'s key (`seed`)."""
    signature = identity.sign(seed, announcement_payload(key, peer, states))
    return {"key": key, "peer": peer, "states": _wire_states(states), "sig": signature}


def check_announcement(value: Any, key: str, peer: str, num_steps: int | None) -> Announced | None:
    """A member's announcement if it is well-formed, bounded, for `key`, and signed by `peer`,
    else None (it came off the wire). Steps outside the run are refused: a state at or past the
    run's last step would make every worker skip training as if the run were done."""
    if not isinstance(value, dict) or value.get("key") != key or value.get("peer") != peer:
        return None
    states, signature = value.get("states"), value.get("sig")
    if not isinstance(states, dict) or len(states) > MAX_KEYS or not isinstance(signature, bytes):
        return None
    clean: Announced = {}
    for layers, entries in states.items():
        if not isinstance(layers, str) or len(layers) > MAX_KEY_CHARS:
            return None
        if not isinstance(entries, list) or len(entries) > MAX_STEPS_PER_KEY:
            return None
        clean[layers] = {}
        for entry in entries:
            if not isinstance(entry, list | tuple) or len(entry) != 3:
                return None
            step, digest, tag = entry
            if not isinstance(step, int) or isinstance(step, bool) or step < 0:
                return None
            if num_steps is not None and step >= num_steps:
                return None
            if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
                return None
            if not isinstance(tag, str) or (tag and parse_tag(tag) is None):
                return None
            clean[layers][step] = (digest, tag or None)
    public_key = identity.public_key_of_peer_id(peer)
    if public_key is None or not identity.verify(
        public_key, announcement_payload(key, peer, clean), signature
    ):
        return None
    return clean
