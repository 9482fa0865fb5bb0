"""A plan too large to gossip whole, pulled hop by hop along its claim's path.

A plan's envelope is O(N) bytes (1,000 peers: ~200 kB), over gossip's 64 KiB envelope past ~320
peers, and a flood sends and receives each message ~3 times a node (control/gossip.py:
MESH_DEGREE). A planner whose plan's envelope is over INLINE_PLAN_BYTES (control/publishing.py)
therefore does not
gossip it: its claim, re-sent every few seconds anyway, names the plan's key (records.Claim's
`plan`). A node whose plan is older pulls the plan over PLAN_PROTOCOL from the peer that sent it
the claim, which heard the claim a hop earlier and is pulling the same plan from its own sender:
asked too early, it answers "not yet", and the asker tries again (PULL_TRIES, PULL_RETRY_S),
then asks the planner. Each node receives the plan once and serves it about once, and the pulled
envelope, signed by the planner, passes the same checks as a gossiped one (control/intake.py).
Digest sync (control/sync.py) heals a node that missed the claims. A copy older than
PULLED_PLAN_MAX_AGE_S is refused; the planner signs its own afresh for each asker.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

import trio
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID

from p2ptrain.control import wire
from p2ptrain.control.state import NodeState
from p2ptrain.control.sync import PULLED_PLAN_MAX_AGE_S
from p2ptrain.errors import WireError
from p2ptrain.net import rpc
from p2ptrain.records.replies import PlanReply, PlanRequest

log = logging.getLogger(__name__)

PLAN_PROTOCOL = TProtocol("/p2ptrain/plan/1.0.0")
PULL_TRIES = 8  # ... of the claim's sender, which may still be pulling the plan itself
PULL_RETRY_S = 0.5
NOT_YET = "not yet"
MAX_QUEUED = 16

PlanKey = tuple[int, int]


class PlanPull:
    """Both ends of PLAN_PROTOCOL for one node; `apply` takes a pulled envelope (Intake.apply)."""

    def __init__(
        self,
        state: NodeState,
        own_plan: Callable[[], bytes],
        apply: Callable[[wire.Envelope, bytes, str, str, float], bool],
    ) -> None:
        self.state = state
        self._own_plan = own_plan  # our plan, signed now (publishing.plan_message)
        self._apply = apply
        self._send, self._receive = trio.open_memory_channel[tuple[PlanKey, str]](MAX_QUEUED)
        self._asked: PlanKey = (0, 0)  # the newest key a pull was queued for

    def _held(self) -> PlanKey:
        plan = self.state.view.plan
        return plan.key if plan is not None else (0, 0)

    def want(self, key: PlanKey, source: str) -> None:
        """A claim from `source` names the planner's plan `key`: pull it unless we hold it or
        already asked. Called from gossip's validator (synchronous): queued, never awaited."""
        if key <= self._held() or key <= self._asked:
            return
        try:
            self._send.send_nowait((key, source))
        except trio.WouldBlock:
            return  # a burst of claims: the ones queued pull the newest plan anyway
        self._asked = key

    async def serve(self) -> None:
        """Pull the plans `want` queued, one at a time (a newer one supersedes)."""
        async for key, source in self._receive:
            if key > self._held():
                await self._pull(key, source)
            if self._receive.statistics().current_buffer_used == 0:
                # a key nobody could serve (a token holder's claim may name any) stops no
                # later claim from asking again
                self._asked = self._held()

    async def _pull(self, key: PlanKey, source: str) -> None:
        """From `source` (retrying while it has not got the plan yet), else from the planner."""
        for peer, tries in ((source, PULL_TRIES), (self.state.view.planner, 1)):
            for _ in range(tries):
                if peer is None or peer == self.state.peer_id or key <= self._held():
                    return
                error = await self._pull_from(peer, key)
                if error is None:
                    return
                if error != NOT_YET:
                    log.debug("plan %s from %s: %s", key, peer, error)
                    break
                await trio.sleep(PULL_RETRY_S)
        log.info("could not pull plan %s (sync will bring it)", key)

    async def _pull_from(self, peer: str, key: PlanKey) -> str | None:
        """Pull plan `key` from `peer` and apply it; None, or why not."""
        request = json.dumps(PlanRequest(*key).to_dict()).encode()
        try:
            reply = PlanReply.from_dict(
                await rpc.call(self.state.host, ID.from_base58(peer), PLAN_PROTOCOL, request)
            )
        except Exception as exc:
            return str(exc)
        if reply.envelope is None:
            return reply.error
        data = reply.envelope.encode()
        now = time.monotonic()
        try:
            env = wire.decode(data, max_age_s=PULLED_PLAN_MAX_AGE_S)
        except WireError as exc:
            return str(exc)
        if env.kind != "plan":
            return f"a {env.kind}, not a plan"
        self._apply(env, data, peer, "sync", now)
        return None

    async def respond(self, request: bytes) -> dict[str, Any]:
        """The server side: our current plan if it is at least the asked key."""
        try:
            asked = PlanRequest.from_dict(json.loads(request))
        except (ValueError, RecursionError) as exc:
            return PlanReply(error=f"bad request: {exc}"[:200]).to_dict()
        plan = self.state.view.plan
        if plan is None or plan.key < (asked.term, asked.epoch):
            return PlanReply(error=NOT_YET).to_dict()
        if plan.planner == self.state.peer_id:
            data = self._own_plan()
        else:
            held = self.state.latest.get((plan.planner, "plan"))
            if held is None:
                return PlanReply(error=NOT_YET).to_dict()
            data = held
        return PlanReply(envelope=data.decode()).to_dict()
