"""Copies of one message, judged each on its own. py-libp2p cached a refused message by its id
for 300 s, whoever forwarded it: a blocked peer relaying an honest message first got every later
copy refused, its author's own too (net/safe_pubsub.py no longer caches refusals). And the rate
of each author counted every copy it was asked to validate: replays of an honest message we
refused quietly (its author's record not here yet) made its author a flooder (control/flood.py
counts a message, by its signed seq, once)."""

from __future__ import annotations

import os
import time

import pytest
from libp2p.peer.id import ID

from p2ptrain.control import wire
from p2ptrain.control.flood import GOSSIP_LIMITS
from p2ptrain.control.gossip import CONTROL_TOPIC, make_pubsub, validator_for
from p2ptrain.net.host import make_host
from tests.control.test_gossip_screen import Author, make_node, record_body
from tests.net.trio_run import run


def test_a_blocked_forwarders_copy_does_not_get_the_honest_copies_refused() -> None:
    async def main() -> tuple[bool, bool, bool]:
        seed = os.urandom(32)
        host = make_host(seed)
        pubsub, _ = make_pubsub(host)
        state, intake = make_node(admission="open", seed=seed, host=host)
        validator = validator_for(CONTROL_TOPIC, state, intake)
        pubsub.set_topic_validator(CONTROL_TOPIC, validator, False)
        honest, attacker, forwarder = Author(), Author(), Author()
        state.view.penalties.penalise(attacker.id, "forged", time.monotonic())
        msg = honest.message("peer", record_body())
        verdicts = []
        for copy_from in (attacker, forwarder):
            try:
                await pubsub.validate_msg(ID.from_base58(copy_from.id), msg)
                verdicts.append(True)
            except Exception:
                verdicts.append(False)
        return verdicts[0], verdicts[1], honest.id in state.view.members

    from_attacker, from_forwarder, member = run(main)
    assert not from_attacker  # the blocked forwarder's copy is refused
    assert from_forwarder and member  # the next copy is judged anew: the record is taken


def test_replayed_copies_of_a_quietly_refused_message_cost_its_author_nothing() -> None:
    state, intake = make_node(admission="open")
    author = Author()
    # telemetry before the author's record: refused, nobody blamed
    header = wire.verified_header(author.message("telemetry", {"links": {}}).data)
    drops = [intake.screen(header, time.monotonic()) for _ in range(3 * GOSSIP_LIMITS["telemetry"])]
    assert all(drop is not None and drop.category is None for drop in drops), drops[-1]
    assert state.view.penalties.score(author.id) == 0


@pytest.mark.parametrize("copies", [1, 5])
def test_distinct_messages_still_count_against_the_rate(copies: int) -> None:
    """Copies ride free; new messages do not: the 41st distinct telemetry in a window floods,
    however many copies of each came first."""
    _, intake = make_node(admission="open")
    author = Author()
    limit = GOSSIP_LIMITS["telemetry"]
    verdicts = []
    for _ in range(limit + 1):
        header = wire.verified_header(author.message("telemetry", {"links": {}}).data)
        for _ in range(copies):
            drop = intake.screen(header, time.monotonic())
            verdicts.append(drop.category if drop is not None else None)
    assert verdicts[: limit * copies] == [None] * (limit * copies)
    assert verdicts[limit * copies :] == ["flooding"] * copies
