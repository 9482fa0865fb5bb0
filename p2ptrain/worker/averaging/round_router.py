"""Which matchmaking a round of a planned group goes through (worker/averaging/planned_group.py).

`RoundRouter` stands in for hivemind's `Matchmaking` inside a `PlannedGroupAverager`: a round's
first attempt swaps metadata in the planned group; a retry goes to hivemind's DHT matchmaking,
whose groups (and join requests) are refused if they hold a peer outside the plan. The router is
the averager's own delegate: it reads the averager's round bookkeeping directly.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol

from hivemind.averaging.control import StepControl
from hivemind.averaging.group_info import GroupInfo
from hivemind.p2p import P2PContext, PeerID
from hivemind.proto import averaging_pb2

log = logging.getLogger(__name__)


class PlannedRounds(Protocol):
    """What the router reads of its averager (a PlannedGroupAverager): the rounds it ran and
    how it finds a round's group."""

    _rounds_seen: dict[str, None]

    def _round_key(self, step: StepControl) -> str | None: ...

    def _found(self, group: GroupInfo, step: StepControl) -> None: ...

    def outsiders(self, peer_ids: Sequence[PeerID]) -> list[str]: ...

    async def gather_planned(self, step: StepControl, key: str) -> GroupInfo | None: ...


class RoundRouter:
    """Stands in for hivemind's Matchmaking: a round's first look_for_group goes to the planned
    group, a retry of that round (and anything else) to the DHT matchmaking, which may take in
    members of the planned group only."""

    def __init__(self, averager: PlannedRounds, dht_matchmaking: Any) -> None:
        self._averager = averager
        self._dht_matchmaking = dht_matchmaking

    async def look_for_group(self, step: StepControl) -> GroupInfo | None:
        averager = self._averager
        key = averager._round_key(step)
        if key is not None and key not in averager._rounds_seen:
            group = await averager.gather_planned(step, key)
        else:
            group = await self._dht_matchmaking.look_for_group(step)
            outsiders = averager.outsiders(group.peer_ids) if group is not None else []
            if outsiders:
                log.warning("round %s: refusing a group with non-members %s", key, outsiders)
                group = None
        if group is not None:
            averager._found(group, step)
        return group

    async def rpc_join_group(
        self, request: averaging_pb2.JoinRequest, context: P2PContext
    ) -> AsyncIterator[averaging_pb2.MessageFromLeader]:
        """A peer asks to join the group we lead: only members of the planned group may."""
        if self._averager.outsiders([context.remote_id]):
            yield averaging_pb2.MessageFromLeader(code=averaging_pb2.PROTOCOL_VIOLATION)
            return
        async for reply in self._dht_matchmaking.rpc_join_group(request, context):
            yield reply

    def __getattr__(self, name: str) -> Any:
        return getattr(self._dht_matchmaking, name)
