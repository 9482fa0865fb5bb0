"""The metadata swap that opens a planned round (worker/averaging/planned_group.py): what a
groupmate's message may be (its round key, its size, how far ahead of ours), how much of it is
held, and how ours reaches each groupmate.

hivemind at module level: imported only in the averager (worker/averaging/planned_group.py) and
where its round gives up (worker/averaging/stage_averager.py, lazily).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable
from typing import Any

from hivemind.averaging.control import StepControl
from hivemind.averaging.matchmaking import MatchmakingException
from hivemind.p2p import PeerID
from hivemind.proto import averaging_pb2

from p2ptrain.worker.averaging.checks import GRAD, STATE
from p2ptrain.worker.averaging.robust_allreduce import CountFn

# the name it logged under before the split: operators grep it
log = logging.getLogger("p2ptrain.worker.averaging.planned_group")

MAX_GATHER_BYTES = 64 * 1024  # a member's metadata: checksums and its bandwidth, a few hundred B
KEPT_ROUNDS = 8  # rounds whose early-arriving metadata is held (a member may run a round ahead)
REMEMBERED_ROUNDS = 1024  # rounds already run here: their metadata arrives too late to be used
# a groupmate may not serve the round's protocol yet: after a re-plan it may still be fetching
# its stage's state (seconds); we retry until our own wait for the round would end
SEND_RETRY_S = 0.5
# a groupmate's round key as RoundGather.round_key writes it; a gradient round's step may be up
# to MAX_STEPS_AHEAD past our latest (a member that kept a local gradient runs a step ahead):
# a key farther out was held, and "ahead", for ever
ROUND_KEY = re.compile(rf"({GRAD}|{STATE})/(0|[1-9][0-9]{{0,15}})")
MAX_STEPS_AHEAD = 2


class GroupmatesAhead(MatchmakingException):
    """A groupmate is past the round we wait in (it kept a local gradient once): waiting on
    cannot complete the round; we give it up at once and meet the groupmate in the next one.
    Only a round at most MAX_STEPS_AHEAD past ours counts (a liar in the group can still make
    its rounds local: docs/security.md)."""


def in_window(key: str, latest_step: int) -> bool | None:
    """Whether a groupmate's round `key` is one we may still run (None: we are past it), our
    latest gradient round being of step `latest_step` (-1: none yet). Re-sync rounds are
    numbered from a step (worker/resume/resync.py): any may come."""
    parsed = ROUND_KEY.fullmatch(key)
    if parsed is None or parsed[1] != GRAD or latest_step < 0:
        return parsed is not None
    step = int(parsed[2])
    return None if step < latest_step else step <= latest_step + MAX_STEPS_AHEAD


async def send_gather(
    stub: Any,
    peer: PeerID,
    request: averaging_pb2.JoinRequest,
    step: StepControl,
    count: CountFn,
    give_up: Callable[[str, str], None],
) -> None:
    """Our metadata to groupmate `peer` through its `stub`, retried until our wait for the
    round would end; `count` is told the bytes, `give_up` (round key, why) that the groupmate
    is past the round."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + step.get_timeout()
    while True:
        try:
            reply = await stub.rpc_planned_gather(request, timeout=step.get_timeout())
            count(peer.to_base58(), request.ByteSize(), reply.ByteSize())
            if reply.code == averaging_pb2.BAD_GROUP_KEY:
                give_up(request.group_key, f"{peer} is past this round")
            elif reply.code != averaging_pb2.ACCEPTED:
                log.warning(
                    "planned round %s: %s refused our metadata (%s)",
                    request.group_key,
                    peer,
                    averaging_pb2.MessageCode.Name(reply.code),
                )
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # p2pd dial backoff, a peer that restarts: try again
            if loop.time() + SEND_RETRY_S >= deadline:
                log.warning(
                    "planned round %s: sending to %s failed: %r", request.group_key, peer, exc
                )
                return
            await asyncio.sleep(SEND_RETRY_S)
