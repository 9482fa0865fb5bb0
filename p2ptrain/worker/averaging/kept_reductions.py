"""Our reducer's results of the last few rounds, served again to a groupmate whose reply stream
from it broke (worker/averaging/robust_allreduce.py asks; `PlannedGroupAverager`'s
rpc_reduced_parts answers from here), so one lost stream does not leave that groupmate alone
with a partial round.

Held in the averager's process; hivemind at module level: imported only in the averager
(worker/averaging/planned_group.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Collection

from hivemind.compression import serialize_torch_tensor
from hivemind.proto import averaging_pb2

from p2ptrain.worker.averaging.robust_allreduce import CountFn
from p2ptrain.worker.averaging.robust_reducer import RobustPartReducer

# rounds whose reductions are kept for a groupmate that asks again: 1/n of the tensor each
KEPT_REDUCTIONS = 2


class KeptReductions:
    """By group id: our reducer of that round and how long a groupmate may wait for it. Only
    `members` (base58 peer ids) are served; `count` is told the bytes of every part served."""

    def __init__(self, members: Collection[str], count: CountFn) -> None:
        self._members = members
        self._count = count
        self._by_group: dict[bytes, tuple[RobustPartReducer, float]] = {}

    def keep(self, group_id: bytes, reducer: RobustPartReducer, wait_s: float) -> None:
        self._by_group[group_id] = (reducer, wait_s)
        while len(self._by_group) > KEPT_REDUCTIONS:
            del self._by_group[next(iter(self._by_group))]

    async def replies(
        self, group_id: bytes, sender: str
    ) -> AsyncIterator[averaging_pb2.AveragingData]:
        """What our reducer computed for round `group_id` once it is done, uncompressed, part
        by part; a refusal if the round is not kept here, `sender` is not a member, or its own
        parts are not in every average."""
        kept = self._by_group.get(group_id) if sender in self._members else None
        if kept is None:
            yield averaging_pb2.AveragingData(code=averaging_pb2.BAD_GROUP_ID)
            return
        reducer, wait_s = kept
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(reducer.done.wait(), timeout=wait_s or None)
        outputs = reducer.averaged_for(sender)
        if outputs is None:
            yield averaging_pb2.AveragingData(code=averaging_pb2.INTERNAL_ERROR)
            return
        loop = asyncio.get_running_loop()
        for part in outputs:
            tensor = await loop.run_in_executor(None, serialize_torch_tensor, part)
            reply = averaging_pb2.AveragingData(
                code=averaging_pb2.AVERAGED_PART, tensor_part=tensor
            )
            self._count(sender, reply.ByteSize(), 0)
            yield reply
