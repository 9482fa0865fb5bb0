"""Averaging groups fixed by the plan: hivemind's all-reduce without its per-round matchmaking.

hivemind's `DecentralizedAverager` finds its group anew every round through the DHT: on a WAN
about 3.5 of the swarm's longest round trips (docs/benchmarks.md) whatever the placement, which
blurs exactly what the scheduler optimises. But a plan already says who averages with whom.

`PlannedGroupAverager` runs a step's first round in that group. Each member sends its gathered
metadata straight to the others (one unary call, one one-way delay); once a member holds every
groupmate's, all of them build the same `GroupInfo` (plan order, an id derived from the round)
and run hivemind's own all-reduce (`AllReduceRunner`: parts, compression, reducers) on it.
A retry of the same round (a member died, a part was lost) goes through hivemind's matchmaking
as before, which can form a group of the survivors, and of them only: a join request from a
peer outside the group is refused, and a group found with one in it is not taken.

The swap's message rules and sending are worker/averaging/planned_gather.py's.

Every round, planned or not, runs worker/averaging/robust_allreduce.py's all-reduce: each member reduces
an even share of the tensor with the plan's weights and worker/averaging/robust.py's checks. A member
keeps what its reducer computed in the last few rounds and serves it again to a groupmate whose
reply stream broke (`rpc_reduced_parts`, from worker/averaging/kept_reductions.py), so one lost
stream does not leave that groupmate alone with a partial round.

hivemind at module level (its servicer reads the rpc_ annotations), so this module is imported
only where hivemind may be (worker/averaging/stage_averager.py imports it lazily).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import typing
from collections.abc import Sequence
from typing import Any

import torch
from hivemind.averaging import DecentralizedAverager
from hivemind.averaging.allreduce import AllreduceException
from hivemind.averaging.control import StepControl
from hivemind.averaging.group_info import GroupInfo
from hivemind.p2p import P2PContext, PeerID
from hivemind.proto import averaging_pb2
from hivemind.utils import get_dht_time
from hivemind.utils.asyncio import as_aiter, azip

from p2ptrain.errors import WireError
from p2ptrain.worker.averaging.averager_reports import AveragerReports
from p2ptrain.worker.averaging.checks import (
    GRAD,
    STATE,
    RoundGather,
    is_later_round,
    median_claimed_norm,
)
from p2ptrain.worker.averaging.kept_reductions import KeptReductions
from p2ptrain.worker.averaging.planned_gather import (
    KEPT_ROUNDS,
    MAX_GATHER_BYTES,
    REMEMBERED_ROUNDS,
    ROUND_KEY,
    GroupmatesAhead,
    in_window,
    send_gather,
)
from p2ptrain.worker.averaging.robust_allreduce import RobustAllReduceRunner
from p2ptrain.worker.averaging.round_router import RoundRouter
from p2ptrain.worker.cpu_clock import WireMarks

log = logging.getLogger(__name__)


class PlannedGroupAverager(DecentralizedAverager):
    """A DecentralizedAverager whose rounds run in a fixed group (`group`: base58 peer ids, the
    same list in the same order on every member) instead of a group found through the DHT.
    `weights`: each member's planned weight (its rows of the batch), in the group's order;
    `token_rows`: the spans of the flat tensor that are rows of the token embedding or head."""

    # hivemind's servicer caches the rpc_ handlers per class: this class has one more
    _rpc_handlers = None
    _stub_type = None

    def __init__(
        self,
        *args: Any,
        group: Sequence[str],
        weights: Sequence[float],
        wire: WireMarks | None = None,
        token_rows: Sequence[tuple[int, int]] = (),
        **kwargs: Any,
    ) -> None:
        if len(set(group)) != len(group) or len(group) < 2:
            raise ValueError(f"a planned group needs >= 2 distinct peers, got {list(group)}")
        if len(weights) != len(group) or not all(w > 0 for w in weights):
            raise ValueError(f"a planned group needs a positive weight per member, got {weights}")
        self._group = tuple(group)
        self._weights = dict(zip(group, (float(w) for w in weights), strict=True))
        # our own metadata of each round found (by group id): which round it is, from us
        self._own_rounds: dict[bytes, RoundGather | None] = {}
        # the bytes, reducer notes and open replies, for the worker's process
        self.reports = AveragerReports()
        self.wire = wire or WireMarks(None)  # the CPU clock as a round's parts come and go
        self._token_rows = tuple(token_rows)  # of the flat tensor: worker/averaging/robust.py
        # the rest lives in the averager's own process (it is forked by super().__init__)
        self._inbox: dict[str, dict[PeerID, bytes]] = {}
        self._rounds_seen: dict[str, None] = {}  # insertion-ordered: the oldest go first
        self._waiting_for = ""
        self._latest_step = -1  # of our latest gradient round (-1: none yet)
        self._given_up = ""  # why the round waited for cannot complete, if it cannot
        self._sending: set[asyncio.Task[None]] = set()
        self._arrived: asyncio.Event | None = None
        # our reducer of the last few rounds, for a groupmate that asks again
        self._reductions = KeptReductions(self._group, self.reports.count)
        # hivemind served the averaged buffer (a round's gradient, a re-sync's weights) to any
        # peer that asked (rpc_download_state); a stage's state goes to the plan's members only,
        # through worker/resume/
        super().__init__(*args, **{**kwargs, "allow_state_sharing": False})
        if self.peer_id.to_base58() not in self._group:
            raise ValueError(f"this peer ({self.peer_id}) is not in its planned group")

    # hivemind sets self._matchmaking once its process runs; every look_for_group goes through
    # RoundRouter (worker/averaging/round_router.py), which sends a round's first attempt to the
    # planned group
    @property
    def _matchmaking(self) -> Any:
        return self._router

    @_matchmaking.setter
    def _matchmaking(self, dht_matchmaking: Any) -> None:
        self._router = RoundRouter(self, dht_matchmaking)

    def _own_metadata(self, step: StepControl) -> RoundGather | None:
        """What we gather for this step (worker/averaging/checks.py's RoundGather), or None."""
        try:
            return RoundGather.from_hivemind(step.data_for_gather, self.serializer)
        except WireError:
            return None

    def _round_key(self, step: StepControl) -> str | None:
        """The round a step is for (its gathered kind and step), or None if it names none."""
        own = self._own_metadata(step)
        return None if own is None else own.round_key

    def _found(self, group: GroupInfo, step: StepControl) -> None:
        """Remember, for the all-reduce, which round of ours `group` was found for."""
        self._own_rounds[group.group_id] = self._own_metadata(step)
        while len(self._own_rounds) > KEPT_ROUNDS:
            del self._own_rounds[next(iter(self._own_rounds))]

    def outsiders(self, peer_ids: Sequence[PeerID]) -> list[str]:
        """The peers of a group that are not in the planned group."""
        return [str(p) for p in peer_ids if p.to_base58() not in self._weights]

    async def _run_allreduce_inplace_(
        self,
        tensors: Sequence[torch.Tensor],
        group_info: GroupInfo,
        group_id: bytes | None = None,
        **kwargs: Any,
    ) -> None:
        """hivemind's, with the robust runner: planned weights (equal ones in a state round,
        as StageAverager.average_state averages), checked and clipped parts."""
        group_id = group_info.group_id if group_id is None else group_id
        own = self._own_rounds.pop(group_info.group_id, None)
        if self.outsiders(group_info.peer_ids):  # the router lets none through: never here
            raise AllreduceException(
                f"not the planned group: {self.outsiders(group_info.peer_ids)}"
            )
        state_round = own is not None and own.kind == STATE
        names = [p.to_base58() for p in group_info.peer_ids]
        runner = RobustAllReduceRunner(
            p2p=self._p2p,
            servicer_type=type(self),
            prefix=self.prefix,
            tensors=tensors,
            group_id=group_id,
            ordered_peer_ids=group_info.peer_ids,
            weights=[1.0 if state_round else self._weights[n] for n in names],
            drift_bound=None if own is None else own.drift_bound,
            floor_per_element=median_claimed_norm(group_info.gathered, self.serializer)
            / max(self.total_size, 1) ** 0.5,
            token_rows=self._token_rows,
            count=self._count_part,
            **kwargs,
        )
        self._reductions.keep(group_id, runner.reducer, float(runner.reducer_timeout or 0.0))
        assert group_id in self._running_groups, f"group {group_id!r} was not registered"
        self._running_groups[group_id].set_result(runner)
        self.wire.start()
        try:
            async for tensor, update in azip(as_aiter(*tensors), runner):
                tensor.add_(update, alpha=self._averaging_alpha)
                self.last_updated = get_dht_time()
                self._state_updated.set()
        finally:
            name = "?" if own is None else own.round_key
            if runner.notes:
                said = "; ".join(f"{peer}'s {what}" for peer, what in runner.notes.items())
                self.reports.note(f"round {name}: our reducer: {said}")
            for peer, why in runner.refetched.items():
                self.reports.note(f"round {name}: {peer}'s reducer asked again ({why}): averaged")
            for peer, why in runner.reducer_failures.items():
                self.reports.note(f"round {name}: no averaged part from {peer}'s reducer: {why}")
            self.reports.round_done()
            self.wire.finish()

    def _count_part(self, peer: str, sent: int, received: int) -> None:
        self.wire.mark(sent, received)  # the all-reduce's parts only: not the metadata swap
        self.reports.count(peer, sent, received)

    async def gather_planned(self, step: StepControl, key: str) -> GroupInfo | None:
        """Swap metadata with every groupmate for round `key`; the round's group, or None if
        someone's did not arrive in time."""
        self._rounds_seen[key] = None
        if len(self._rounds_seen) > REMEMBERED_ROUNDS:
            del self._rounds_seen[next(iter(self._rounds_seen))]
        self._waiting_for, self._given_up = key, ""
        if (own := ROUND_KEY.fullmatch(key)) is not None and own[1] == GRAD:
            self._latest_step = int(own[2])
        for held in [k for k in self._inbox if not in_window(k, self._latest_step)]:
            del self._inbox[held]  # past rounds, and rounds too far ahead to be real
        for held, senders in self._inbox.items():  # a groupmate's later round came first
            if is_later_round(held, key) and senders:
                self._given_up = f"{next(iter(senders))} is at round {held}"
        members = [PeerID.from_base58(p) for p in self._group]
        others = [p for p in members if p != self.peer_id]
        request = averaging_pb2.JoinRequest(
            schema_hash=self.schema_hash, gather=step.data_for_gather, group_key=key
        )
        for peer in others:
            # not cancelled when our own wait ends: a groupmate may still be waiting for ours
            task = asyncio.create_task(self._send(peer, request, step))
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)
        try:
            inbox = self._inbox.setdefault(key, {})
            arrived = self._arrival_event()
            while any(peer not in inbox for peer in others):
                if self._given_up:
                    raise GroupmatesAhead(f"planned round {key}: {self._given_up}")
                arrived.clear()
                await asyncio.wait_for(arrived.wait(), timeout=step.get_timeout())
        except TimeoutError:
            missing = [str(p) for p in others if p not in self._inbox.get(key, {})]
            log.warning("planned round %s: no metadata from %s in time", key, missing)
            return None
        finally:
            self._inbox.pop(key, None)
            self._waiting_for = ""
        gathered = tuple(step.data_for_gather if p == self.peer_id else inbox[p] for p in members)
        group_id = hashlib.sha256(f"{self.prefix}/{key}".encode()).digest()
        return GroupInfo(group_id=group_id, peer_ids=tuple(members), gathered=gathered)

    async def _send(
        self, peer: PeerID, request: averaging_pb2.JoinRequest, step: StepControl
    ) -> None:
        stub = type(self).get_stub(self._p2p, peer, namespace=self.prefix)
        await send_gather(stub, peer, request, step, self.reports.count, self._give_up)

    async def rpc_planned_gather(
        self, request: averaging_pb2.JoinRequest, context: P2PContext
    ) -> averaging_pb2.MessageFromLeader:
        """A groupmate's metadata for one round (it then waits for ours, and we for the rest)."""
        sender = context.remote_id
        if sender.to_base58() not in self._group:
            return averaging_pb2.MessageFromLeader(code=averaging_pb2.NOT_A_LEADER)
        if request.schema_hash != self.schema_hash:
            return averaging_pb2.MessageFromLeader(code=averaging_pb2.BAD_SCHEMA_HASH)
        if len(request.gather) > MAX_GATHER_BYTES or not ROUND_KEY.fullmatch(request.group_key):
            return averaging_pb2.MessageFromLeader(code=averaging_pb2.PROTOCOL_VIOLATION)
        self.reports.count(sender.to_base58(), 0, request.ByteSize())
        key, window = request.group_key, in_window(request.group_key, self._latest_step)
        if (key in self._rounds_seen or window is None) and key not in self._inbox:
            return averaging_pb2.MessageFromLeader(code=averaging_pb2.BAD_GROUP_KEY)  # too late
        if not window:  # farther ahead than an honest groupmate gets
            return averaging_pb2.MessageFromLeader(code=averaging_pb2.NOT_LOOKING_FOR_GROUP)
        if key not in self._inbox and len(self._inbox) >= KEPT_ROUNDS:
            # make room: drop the oldest round held, never the one being waited for
            oldest = next(k for k in self._inbox if k != self._waiting_for)
            del self._inbox[oldest]
        self._inbox.setdefault(key, {})[sender] = request.gather
        if is_later_round(key, self._waiting_for):
            self._give_up(self._waiting_for, f"{sender} is at round {key}")
        self._arrival_event().set()
        return averaging_pb2.MessageFromLeader(code=averaging_pb2.ACCEPTED)

    # typing's AsyncIterator, not collections.abc's: hivemind's servicer tells a streaming
    # reply by the hint's _name, which only typing's generics have
    async def rpc_aggregate_part(
        self, stream: typing.AsyncIterator[averaging_pb2.AveragingData], context: P2PContext
    ) -> typing.AsyncIterator[averaging_pb2.AveragingData]:
        """hivemind's (a groupmate's parts of our share in, their averages back), counted among
        the replies in flight while it runs."""
        with self.reports.replying():
            async for reply in super().rpc_aggregate_part(stream, context):
                yield reply

    async def rpc_reduced_parts(
        self, request: averaging_pb2.AveragingData, context: P2PContext
    ) -> typing.AsyncIterator[averaging_pb2.AveragingData]:
        """A groupmate's reply stream from our reducer broke: what our reducer computed for
        round `request.group_id` once it is done, uncompressed, part by part; a refusal if the
        round is not kept here or the groupmate's own parts are not in every average."""
        with self.reports.replying():
            async for reply in self._reductions.replies(
                request.group_id, context.remote_id.to_base58()
            ):
                yield reply

    async def rpc_download_state(
        self, request: averaging_pb2.DownloadRequest, context: P2PContext
    ) -> typing.AsyncIterator[averaging_pb2.DownloadData]:
        """Nothing, to anyone, whatever allow_state_sharing says (see __init__)."""
        nothing: tuple[averaging_pb2.DownloadData, ...] = ()
        for reply in nothing:
            yield reply

    def _give_up(self, key: str, why: str) -> None:
        if key and key == self._waiting_for:
            self._given_up = why
            self._arrival_event().set()

    def _arrival_event(self) -> asyncio.Event:
        if self._arrived is None:  # created in the averager's process, on its event loop
            self._arrived = asyncio.Event()
        return self._arrived
