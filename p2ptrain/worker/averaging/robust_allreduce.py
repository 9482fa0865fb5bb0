"""hivemind's butterfly all-reduce with worker/averaging/robust.py's rule in every reducer.

`RobustAllReduceRunner` builds a `RobustPartReducer` (worker/averaging/robust_reducer.py: every
sender's copy of a part combined with `robust_mean`, not each added with the weight its sender
claims) in place of hivemind's and splits the tensor evenly among the members: a member's
claimed bandwidth no longer decides how much of everyone's gradient it reduces.

A reducer's reply stream can end early while its reduction went fine (rare: about one round in
a few hundred on a loaded machine, "sent 0 parts"). hivemind then keeps our own values for that
reducer's share and the round comes out partial on this member alone: its groupmates pass their
checks and move on, so its retry finds nobody. Instead we ask the reducer once more for what it
computed (`PlannedGroupAverager.rpc_reduced_parts` serves it from `RobustPartReducer.outputs`,
through worker/averaging/kept_reductions.py).

hivemind at module level: imported only in the averager (worker/averaging/planned_group.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import torch
from hivemind.averaging.allreduce import AllReduceRunner
from hivemind.averaging.partition import AllreduceException, TensorPartReducer
from hivemind.compression import deserialize_torch_tensor
from hivemind.p2p import P2PContext, PeerID
from hivemind.proto import averaging_pb2
from hivemind.utils.asyncio import aiter_with_timeout, amap_in_executor

from p2ptrain.worker.averaging.robust_reducer import RobustPartReducer

CountFn = Callable[[str, int, int], None]  # (peer id, bytes sent to it, bytes received from it)


class RobustAllReduceRunner(AllReduceRunner):
    """hivemind's AllReduceRunner with a RobustPartReducer (see RobustPartReducer for the
    keyword arguments) and an even split of the tensor among the members; `count` is told the
    bytes of every message to and from each peer (serialised parts, as hivemind sends them);
    `token_rows`: the spans of the (one, flat) tensor that are token embedding or head rows."""

    tensor_part_reducer: TensorPartReducer

    def __init__(
        self,
        *,
        weights: Sequence[float],
        drift_bound: float | None,
        floor_per_element: float,
        count: CountFn = lambda peer, sent, received: None,
        token_rows: Sequence[tuple[int, int]] = (),
        **kwargs: Any,
    ) -> None:
        self._count = count
        n = len(kwargs["ordered_peer_ids"])
        total = sum(t.numel() for t in kwargs["tensors"])
        # every member the same share (the remainder to the first ones): what hivemind does
        # when no member states a bandwidth, as ours never do; a claimed one is ignored
        kwargs["peer_fractions"] = tuple(total // n + (i < total % n) for i in range(n))
        kwargs.pop("modes", None)
        super().__init__(**kwargs)
        unused = self.tensor_part_reducer
        unused.num_parts = 0  # finalized without its "received 0% of input tensors" warning
        unused.finalize()
        names = [str(p) for p in self.sender_peer_ids]
        own = (
            self.sender_peer_ids.index(self.peer_id)
            if self.peer_id in self.sender_peer_ids
            else None
        )
        self._robust_reducer = RobustPartReducer(
            tuple(part.shape for part in self.parts_for_local_averaging),
            len(self.sender_peer_ids),
            weights=weights,
            own=own,
            drift_bound=drift_bound,
            floor_per_element=floor_per_element,
            names=names,
            token_rows=_part_rows(kwargs["tensors"], self.parts_for_local_averaging, token_rows),
        )
        self.tensor_part_reducer = self._robust_reducer
        self.reducer_failures: dict[str, str] = {}  # peer -> why its averaged part never came
        self.refetched: dict[str, str] = {}  # peer -> why its reducer was asked again
        self._received = [0] * n  # averaged parts registered so far, by reducer index

    @property
    def reducer(self) -> RobustPartReducer:
        """Our reducer (its outputs are served to a groupmate whose reply stream broke)."""
        return self._robust_reducer

    async def _communicate_with_peer(self, peer_id: PeerID) -> None:
        """Our parts to one reducer and its averages back, as hivemind does; if the reply stream
        fails, the reducer is asked once more for what it computed. Only if that fails too are
        our own values kept for its share (hivemind's fallback: the checks then catch the
        partial round, and the failure is noted with the reason)."""
        if peer_id == self.peer_id:
            await super()._communicate_with_peer(peer_id)
            return
        peer_index = self.ordered_peer_ids.index(peer_id)
        try:
            try:
                await self._exchange(peer_id, peer_index)
            except Exception as exc:
                # noted before the parts come: the round may end as the last one registers,
                # before this coroutine resumes
                self.refetched[peer_id.to_base58()] = repr(exc)[:400]
                try:
                    await asyncio.wait_for(
                        self._fetch_reduced(peer_id, peer_index), self.reducer_timeout
                    )
                except Exception as again:
                    del self.refetched[peer_id.to_base58()]
                    raise AllreduceException(f"{exc!r}; asked again: {again!r}") from exc
        except BaseException as exc:
            if isinstance(exc, Exception):
                self.reducer_failures[peer_id.to_base58()] = repr(exc)[:400]
            self.tensor_part_container.register_failed_reducer(peer_index)
            raise

    async def _exchange(self, peer_id: PeerID, peer_index: int) -> None:
        """Stream our parts for `peer_id`'s share and register its averaged deltas as they come
        back (counted in self._received); an AllreduceException if not all came."""
        container = self.tensor_part_container
        expected = container.num_parts_by_peer[peer_index]
        replies = await self._get_peer_stub(peer_id).rpc_aggregate_part(
            self._generate_input_for_peer(peer_index)
        )

        def delta_of(message: averaging_pb2.AveragingData) -> torch.Tensor:
            if message.code != averaging_pb2.AVERAGED_PART:
                raise AllreduceException(
                    f"{peer_id} sent {averaging_pb2.MessageCode.Name(message.code)}"
                )
            return deserialize_torch_tensor(message.tensor_part)

        async for delta in amap_in_executor(
            delta_of,
            aiter_with_timeout(replies, self.reducer_timeout),
            max_prefetch=container.prefetch,
        ):
            container.register_processed_part(peer_index, self._received[peer_index], delta)
            self._received[peer_index] += 1
        if self._received[peer_index] != expected:
            raise AllreduceException(
                f"peer {peer_id} sent {self._received[peer_index]} parts, but we expected {expected}"
            )

    async def _fetch_reduced(self, peer_id: PeerID, peer_index: int) -> None:
        """Ask reducer `peer_id` for the averages of its share (uncompressed) and register the
        parts not yet received, as deltas from our own raw parts."""
        container = self.tensor_part_container
        # the raw parts we sent: hivemind keeps them for register_failed_reducer (pinned 1.1.12)
        own = [part for part, _info in container._input_parts_by_peer[peer_index]]
        stub = super()._get_peer_stub(peer_id)
        peer = peer_id.to_base58()
        request = averaging_pb2.AveragingData(group_id=self.group_id)
        self._count(peer, request.ByteSize(), 0)
        index = 0
        async for reply in await stub.rpc_reduced_parts(request):
            self._count(peer, 0, reply.ByteSize())
            if reply.code != averaging_pb2.AVERAGED_PART:
                raise AllreduceException(
                    f"{peer_id} has no averages for us ({averaging_pb2.MessageCode.Name(reply.code)})"
                )
            if index >= len(own):
                raise AllreduceException(f"{peer_id} sent more than {len(own)} parts")
            averaged = deserialize_torch_tensor(reply.tensor_part)
            if averaged.shape != own[index].shape or averaged.dtype != own[index].dtype:
                raise AllreduceException(f"{peer_id} sent part {index} of the wrong shape or type")
            if index >= self._received[peer_index]:
                container.register_processed_part(peer_index, index, averaged - own[index])
                self._received[peer_index] += 1
            index += 1
        if index != len(own):
            raise AllreduceException(f"{peer_id} sent {index} averaged parts of {len(own)}")

    @property
    def notes(self) -> dict[str, str]:
        """What our reducer did to whose parts this round (empty: every part counted fully)."""
        return dict(self._robust_reducer.notes)

    async def _generate_input_for_peer(
        self, peer_index: int
    ) -> AsyncIterator[averaging_pb2.AveragingData]:
        """Our parts for one reducer, counted as they go."""
        peer = self.ordered_peer_ids[peer_index].to_base58()
        async for message in super()._generate_input_for_peer(peer_index):
            self._count(peer, message.ByteSize(), 0)
            yield message

    async def rpc_aggregate_part(
        self, stream: AsyncIterator[averaging_pb2.AveragingData], context: P2PContext
    ) -> AsyncIterator[averaging_pb2.AveragingData]:
        """A sender's parts for us to reduce, and the averaged parts we send back, counted."""
        peer = context.remote_id.to_base58()

        async def counted() -> AsyncIterator[averaging_pb2.AveragingData]:
            async for message in stream:
                self._count(peer, 0, message.ByteSize())
                yield message

        async for reply in super().rpc_aggregate_part(counted(), context):
            self._count(peer, reply.ByteSize(), 0)
            yield reply

    def _get_peer_stub(self, peer: PeerID) -> Any:
        return _CountingStub(super()._get_peer_stub(peer), peer.to_base58(), self._count)


def _part_rows(
    tensors: Sequence[torch.Tensor], parts: Sequence[torch.Tensor], rows: Sequence[tuple[int, int]]
) -> list[tuple[tuple[int, int], ...]]:
    """Each of our parts' token-row spans, relative to the part. hivemind's parts are views of
    the tensor's flat storage (split in order), so a part's place is its storage offset."""
    if not rows:
        return [() for _ in parts]
    assert len(tensors) == 1, "token rows index one flat tensor"
    storage, base = tensors[0].untyped_storage().data_ptr(), int(tensors[0].storage_offset())
    spans = []
    for part in parts:
        assert part.untyped_storage().data_ptr() == storage, "a part is not a view of the tensor"
        start = int(part.storage_offset()) - base
        stop = start + int(part.numel())
        spans.append(
            tuple(
                (max(a, start) - start, min(b, stop) - start)
                for a, b in rows
                if a < stop and b > start
            )
        )
    return spans


class _CountingStub:
    """A reducer's stub whose replies (the averaged parts it sends back) are counted."""

    def __init__(self, stub: Any, peer: str, count: CountFn) -> None:
        self._stub, self._peer, self._count = stub, peer, count

    async def rpc_aggregate_part(
        self, inputs: AsyncIterator[averaging_pb2.AveragingData]
    ) -> AsyncIterator[averaging_pb2.AveragingData]:
        replies = await self._stub.rpc_aggregate_part(inputs)
        return self._counted(replies)

    async def _counted(
        self, replies: AsyncIterator[averaging_pb2.AveragingData]
    ) -> AsyncIterator[averaging_pb2.AveragingData]:
        async for reply in replies:
            self._count(self._peer, 0, reply.ByteSize())
            yield reply
