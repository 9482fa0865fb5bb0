"""A plan too large to gossip whole, pulled hop by hop along its claim's path.

A plan's envelope is O(N) bytes (1,000 peers: ~200 kB), over gossip's 64 KiB envelope past ~320
peers, and a flood sends and receives each message ~3 times a node (control/gossip.py:
MESH_DEGREE). A planner whose plan's envelope is over INLINE_PLAN_BYTES (control/authored.py)
therefore does not gossip it: its claim, re-sent every few seconds anyway, names the plan's key
(records.Claim's `plan`). A node whose plan is older pulls the plan over PLAN_PROTOCOL from the
peer that sent it the claim, which heard the claim a hop earlier and is pulling the same plan
from its own sender: asked too early, it answers "not yet", and the asker tries again
(PULL_TRIES, PULL_RETRY_S), then asks the planner. Each node receives the plan once and serves
it about once, and the pulled envelope, signed by the planner, passes the same checks as a
gossiped one (control/intake.py). A node that holds an earlier plan asks for the changes against
it (control/plan_delta.py): a re-plan keeps most of the placement. Digest sync (control/sync.py)
heals a node that missed the claims. A copy older than PULLED_PLAN_MAX_AGE_S is refused; the
planner signs its own afresh at most once a second, and a delta is made once per base and plan
copy (control/recent.py): anyone may ask, as often as its streams allow.
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

from p2ptrain.control import plan_delta, wire
from p2ptrain.control.recent import Recent
from p2ptrain.control.state import NodeState
from p2ptrain.control.sync import PULLED_PLAN_MAX_AGE_S
from p2ptrain.net import rpc
from p2ptrain.records import Plan
from p2ptrain.records.replies import PlanReply, PlanRequest

log = logging.getLogger(__name__)

PLAN_PROTOCOL = TProtocol("/p2ptrain/plan/1.0.0")
PULL_TRIES = 8  # ... of the claim's sender, which may still be pulling the plan itself
PULL_RETRY_S = 0.5
NOT_YET = "not yet"
MAX_QUEUED = 16
MAX_BASES = 4  # plans remembered as bases for deltas
# the largest reply, both ends (rpc.cap_replies: a client refuses a larger one unread): a plan's
# envelope, canonical JSON (ASCII) of at most wire.MAX_PLAN_ENVELOPE_BYTES, as a JSON string (it
# at most doubles), and the reply's braces; a larger delta becomes an error, and the asker then
# asks for the whole plan
PLAN_REPLY_BYTES = 2 * wire.MAX_PLAN_ENVELOPE_BYTES + 4 * 1024
rpc.cap_replies(PLAN_PROTOCOL, PLAN_REPLY_BYTES)

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
        self._own_plan = own_plan  # our plan, signed now (authored.plan_message)
        # what respond served lately: our plan signed, by its key and the view's plan version;
        # the deltas of a plan copy against our bases (each was up to 1 MiB of work a request)
        self.own_signed: Recent[tuple[PlanKey, int], bytes] = Recent(lambda _: own_plan(), 1)
        self.deltas = Recent(self._delta, size=MAX_BASES)
        self._apply = apply
        self._send, self._receive = trio.open_memory_channel[tuple[PlanKey, str]](MAX_QUEUED)
        self._asked: PlanKey = (0, 0)  # the newest key a pull was queued for
        # the bodies of the last few plans we held, by key: a delta's bases (plan_delta.py)
        self._bodies: dict[PlanKey, dict[str, Any]] = {}

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
                if self.state.view.penalties.is_blocked(peer, time.monotonic()):
                    break  # it sent us garbage (a bad reply is blamed: _pull_once)
                error = await self._pull_from(peer, key)
                if error is None:
                    return
                if error != NOT_YET:
                    log.debug("plan %s from %s: %s", key, peer, error)
                    break
                await trio.sleep(PULL_RETRY_S)
        log.info("could not pull plan %s (sync will bring it)", key)

    def _remember(self, key: PlanKey, data: bytes) -> None:
        """Keep plan `key`'s body (of its envelope `data`) as a base for deltas."""
        if key not in self._bodies:
            self._bodies[key] = json.loads(data)["body"]
            for old in sorted(self._bodies)[:-MAX_BASES]:
                del self._bodies[old]

    def _held_envelope(self) -> tuple[PlanKey, bytes] | None:
        """The plan we hold and its envelope (ours signed now, if we are its planner)."""
        plan = self.state.view.plan
        if plan is None:
            return None
        if plan.planner == self.state.peer_id:
            data = self.own_signed.get((plan.key, self.state.view.plan_version))
        else:
            held = self.state.latest.get((plan.planner, "plan"))
            if held is None:
                return None
            data = held
        self._remember(plan.key, data)
        return plan.key, data

    async def _pull_from(self, peer: str, key: PlanKey) -> str | None:
        """Pull plan `key` from `peer` (as a delta against ours, if it has it) and apply it;
        None, or why not."""
        held = self._held_envelope()
        have = held[0] if held is not None and held[0] != (0, 0) else None
        for base in (have, None) if have is not None else (None,):
            error = await self._pull_once(peer, key, base)
            if error is None or error == NOT_YET:
                return error
            log.debug("plan %s from %s against %s: %s", key, peer, base, error)
        return error

    async def _pull_once(self, peer: str, key: PlanKey, base: PlanKey | None) -> str | None:
        """None once the view took a plan of at least `key` from `peer`; else why not (an older
        plan, or one the view refused, fails this source like an error)."""
        request = json.dumps(PlanRequest(*key, have=base).to_dict()).encode()
        try:
            reply = PlanReply.from_dict(
                await rpc.call(self.state.host, ID.from_base58(peer), PLAN_PROTOCOL, request)
            )
        except wire.WireError as exc:  # no plan reply (oversized, not JSON): the peer's own
            score = self.state.view.penalties.penalise(peer, exc.category, time.monotonic())
            log.info("plan pull from %s: %s (penalty %.1f)", peer, exc, score)
            return str(exc)
        except Exception as exc:  # a timeout, a reset: no blame
            return str(exc)
        try:
            if reply.error is not None:
                return reply.error
            if reply.delta is not None:
                if base is None or base not in self._bodies:
                    return "a delta we did not ask for"
                data = plan_delta.rebuild(self._bodies[base], reply.delta)
            else:
                data = (reply.envelope or "").encode()
            env = wire.decode(data, max_age_s=PULLED_PLAN_MAX_AGE_S)
        except Exception as exc:
            return str(exc)
        if not isinstance(env.body, Plan):
            return f"a {env.kind}, not a plan"
        got = env.body.key
        if got < key:  # an older plan answers nothing: ask the next source
            return f"plan {got}, older than {key}"
        if not self._apply(env, data, peer, "sync", time.monotonic()):
            return f"plan {got} refused"
        self._remember(got, data)
        return None

    async def respond(self, request: bytes) -> dict[str, Any]:
        """The server side: our current plan if it is at least the asked key, as a delta if
        we know the plan the asker holds."""
        try:
            asked = PlanRequest.from_dict(json.loads(request))
        except (ValueError, RecursionError) as exc:
            return PlanReply(error=f"bad request: {exc}"[:200]).to_dict()
        held = self._held_envelope()
        if held is None or held[0] < (asked.term, asked.epoch):
            return PlanReply(error=NOT_YET).to_dict()
        key, data = held
        if asked.have is not None and asked.have in self._bodies and asked.have != key:
            return PlanReply(delta=self.deltas.get((asked.have, data))).to_dict()
        return PlanReply(envelope=data.decode()).to_dict()

    def _delta(self, key: tuple[PlanKey, bytes]) -> dict[str, Any]:
        """Plan envelope key[1] as its changes against base key[0] (one we hold the body of);
        hashing the envelope for the key is done once: bytes objects keep their hash."""
        base, data = key
        return plan_delta.delta(self._bodies[base], data)
