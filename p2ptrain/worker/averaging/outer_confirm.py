"""An outer attempt's confirmation (worker/averaging/outer_attempt.py runs the attempt's
messages): in a group of three or more, the members confirm that they combined the same ones.

A member that equivocates (one top-k payload to one groupmate and another to the next, a
reducer's shard or a member's claims differing by receiver) passes every check each receiver
makes alone, and honest members would apply different means. Each member sends every other
the digest of every message its result combined (outer_wire.combined_digest), paced as its
other messages, or FAILED_DIGEST at once if its attempt failed; a digest unlike ours fails
the attempt (someone equivocated: which one, a third member cannot tell), and so does a
failed one (a member that missed a message: all stay local rather than it alone), both with
no retry (a retry's group is the members each heard from, not alike here). A confirmation
that does not come is no reason to drop the result (a member that withholds it changes
nothing; one that died after its messages left is not needed); we wait for it until a
groupmate that missed a message would have failed (it may start join_s after us: our
attempt's start + 2 join_s + transfer_s) and transfer_s more, so a member that withholds its
confirmation delays the round's result by that much (not its steps: the round runs beside
them). Two members need no confirmation: no third one could be told a different story.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import torch

from p2ptrain.worker.averaging import outer_wire as wire
from p2ptrain.worker.averaging.checks import Checksums
from p2ptrain.worker.averaging.outer_attempt import (
    Attempt,
    AttemptCombined,
    AttemptFailed,
    AttemptResult,
    RoundLink,
    send_paced,
)


def confirmed(
    link: RoundLink,
    weights: Mapping[str, float],
    this: Attempt,
    exchange: Callable[[], AttemptCombined],
) -> AttemptResult:
    """`exchange`'s result once the groupmates confirmed it (groups of three or more);
    AttemptFailed, having told them, if it failed here."""
    if len(this.members) < 3:
        result, gathered, _ = exchange()
        return result, gathered
    began = time.monotonic()
    try:
        result, gathered, combined = exchange()
    except AttemptFailed:
        send_confirmations(link, weights, this, wire.FAILED_DIGEST)
        raise
    ours = wire.combined_digest(combined)
    send_confirmations(link, weights, this, ours)
    # a groupmate that misses a message fails once its own waits are over (join_s, then
    # transfer_s), and it may have started up to join_s after us: its word must still
    # reach us, whenever we finished
    last_fail = began + 2 * this.join_s + this.transfer_s
    deadline = max(time.monotonic(), last_fail) + this.transfer_s
    failed: list[str] = []
    for peer in this.members:
        if peer == link.peer_id:
            continue
        got = link.inbox.take(this.key, wire.CONFIRM, peer, 0, deadline, this.should_stop)
        if got is None:
            continue  # withheld or dead: no third story reached us through it
        if got[1] == wire.FAILED_DIGEST:
            failed.append(peer)
        elif got[1] != ours:  # someone told two stories: retrying asks it again
            raise AttemptFailed(f"{peer} combined other messages than we did", set())
    if failed:  # no retry: its group, of those it heard, would not be ours
        raise AttemptFailed(f"{', '.join(failed)} failed the attempt", set())
    return result, gathered


def send_confirmations(
    link: RoundLink, weights: Mapping[str, float], this: Attempt, digest: bytes
) -> None:
    """Our digest to every groupmate, around the ring and the attempt's send gap apart: every
    member comes here within moments of the others (after the last reduced shard), and a
    message costs its stream's work whatever its 32 bytes, so a group's confirmations sent at
    once were a burst of streams on every member. A failure's go at once."""
    me = link.peer_id
    # a header's claims are required; a confirmation claims only the round and anchor
    claims = Checksums(this.step, weights[me], 0.0, 0.0, 0.0, *this.anchor)
    header = wire.RoundHeader(this.key, wire.CONFIRM, me, 0, len(digest), claims)
    payload = torch.frombuffer(bytearray(digest), dtype=torch.uint8)
    sends = [(peer, header, payload) for peer in this.members if peer != me]
    if digest == wire.FAILED_DIGEST:  # at once: the groupmates stop waiting sooner
        for peer, _, _ in sends:
            link.send(peer, header, payload, this.transfer_s)
        return
    send_paced(link, this, sends, this.transfer_s)
