"""hivemind's butterfly all-reduce with worker/averaging/robust.py's rule in every reducer.

`RobustPartReducer` holds every sender's copy of the part being reduced and combines them with
`robust_mean` (planned weights, finite check, centred clip, drift bound) instead of adding each
as it comes with the weight its sender claims. `RobustAllReduceRunner` builds one in place of
hivemind's and splits the tensor evenly among the members: a member's claimed bandwidth no
longer decides how much of everyone's gradient it reduces.

A reducer's reply stream can end early while its reduction went fine (rare: about one round in
a few hundred on a loaded machine, "sent 0 parts"). hivemind then keeps our own values for that
reducer's share and the round comes out partial on this member alone: its groupmates pass their
checks and move on, so its retry finds nobody. Instead we ask the reducer once more for what it
computed (`PlannedGroupAverager.rpc_reduced_parts` serves it from `RobustPartReducer.outputs`).

hivemind at module level: imported only in the averager (worker/averaging/planned_group.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import torch
from hivemind.averaging.allreduce import AllReduceRunner
from hivemind.averaging.partition import AllreduceException, BannedException, TensorPartReducer
from hivemind.compression import deserialize_torch_tensor
from hivemind.p2p import P2PContext, PeerID
from hivemind.proto import averaging_pb2
from hivemind.utils.asyncio import aiter_with_timeout, amap_in_executor

from p2ptrain.worker.averaging.robust import robust_mean

log = logging.getLogger(__name__)


class RobustPartReducer(TensorPartReducer):
    """A TensorPartReducer that waits for every sender's copy of a part, then combines them.

    weights: each sender's planned weight (by sender index); own: our sender index, if we send;
    drift_bound: set in state rounds; floor_per_element: the parts' scale floor is this times
    the square root of a part's size; names: how the log calls each sender; token_rows: for
    each part, its spans that are rows of the token embedding or the head."""

    def __init__(
        self,
        part_shapes: Sequence[torch.Size],
        num_senders: int,
        *,
        weights: Sequence[float],
        own: int | None,
        drift_bound: float | None,
        floor_per_element: float,
        names: Sequence[str],
        token_rows: Sequence[Sequence[tuple[int, int]]] = (),
    ) -> None:
        assert len(weights) == len(names) == num_senders
        assert not token_rows or len(token_rows) == len(part_shapes)
        self._token_rows = tuple(token_rows) or tuple(() for _ in part_shapes)
        self._weights, self._own, self._drift_bound = tuple(weights), own, drift_bound
        self._floor_per_element, self._names = floor_per_element, tuple(names)
        # the current part's copies by sender; None: a copy left out (wrong shape or dtype)
        self._held: dict[int, torch.Tensor | None] = {}
        self.notes: dict[str, str] = {}  # sender -> what was done to its parts (first reason)
        # every part's combination and the senders whose copy is in it, kept for a sender whose
        # reply stream broke (see the module doc); `done` is set once every part is combined
        # or the reducer is finalized
        self.outputs: list[torch.Tensor] = []
        self.contributors: list[frozenset[int]] = []
        self.done = asyncio.Event()
        super().__init__(part_shapes, num_senders)

    def finalize(self) -> None:
        super().finalize()
        self.done.set()

    def averaged_for(self, name: str) -> list[torch.Tensor] | None:
        """Every part's combination if all are done and sender `name`'s copy is in each of them
        (else the sender would take an average it is not part of), else None."""
        if name not in self._names or len(self.outputs) != self.num_parts:
            return None
        sender = self._names.index(name)
        return self.outputs if all(sender in c for c in self.contributors) else None

    def reset_accumulators(self) -> None:
        self._held = {}
        super().reset_accumulators()

    async def accumulate_part(
        self, sender_index: int, part_index: int, tensor_part: torch.Tensor, weight: float = 1.0
    ) -> torch.Tensor:
        """Hold this sender's copy (its own `weight` is ignored), wait for the others' and the
        combination, and return it. A copy not of the part's shape, or not floating point, is
        left out of the combination (as a non-finite one is): holding it failed the whole
        combination, and every member waited for the part until its timeout."""
        assert 0 <= sender_index < self.num_senders, "invalid sender index"
        assert 0 <= part_index < self.num_parts, "invalid part index"
        self.num_parts_received[sender_index] += 1
        while part_index > self.current_part_index:  # earlier parts are still being reduced
            await asyncio.wait(
                {self.current_part_future, asyncio.create_task(self.finished.wait())},
                return_when=asyncio.FIRST_COMPLETED,
            )
            if self.finished.is_set():
                raise AllreduceException("attempted to aggregate part in a finalized reducer")
        if self.sender_failed_after[sender_index] != float("inf"):
            raise BannedException(f"sender {sender_index} was banned in background")
        if part_index != self.current_part_index or sender_index in self._held:
            raise AllreduceException(f"sender {sender_index} sent part {part_index} out of turn")
        current_part_future = self.current_part_future
        problem = _part_problem(tensor_part, self.part_shapes[part_index])
        if problem is not None:
            self._note(sender_index, f"part dropped: {problem}")
        self._held[sender_index] = None if problem is not None else tensor_part
        self.current_part_accumulated_from += 1
        self.check_current_part_finished()
        result: torch.Tensor = await current_part_future
        return result

    def check_current_part_finished(self) -> None:
        assert self.current_part_accumulated_from <= self.num_current_senders
        if self.current_part_accumulated_from == self.num_current_senders:
            self.current_part_future.set_result(self._combine())
            self.reset_accumulators()

    def _combine(self) -> torch.Tensor:
        held = {i: part for i, part in self._held.items() if part is not None}
        senders = sorted(held)
        if not senders:  # every sender failed: hivemind's round fails on its own
            return self._kept(torch.zeros(self.part_shapes[self.current_part_index]), ())
        parts = [held[i] for i in senders]
        own = senders.index(self._own) if self._own in senders else None
        numel = parts[0].numel()
        combined = robust_mean(
            parts,
            [self._weights[i] for i in senders],
            own,
            self._drift_bound,
            floor=self._floor_per_element * numel**0.5,
            token_rows=self._token_rows[self.current_part_index],
        )
        for position, why in combined.dropped.items():
            self._note(senders[position], f"part dropped: {why}")
        for position in combined.clipped:
            self._note(senders[position], "part clipped toward the others'")
        kept = [
            sender for position, sender in enumerate(senders) if position not in combined.dropped
        ]
        return self._kept(combined.value, kept)

    def _kept(self, value: torch.Tensor, senders: Sequence[int]) -> torch.Tensor:
        self.outputs.append(value)
        self.contributors.append(frozenset(senders))
        if len(self.outputs) == self.num_parts:
            self.done.set()
        return value

    def _note(self, sender: int, what: str) -> None:
        name = self._names[sender]
        if name not in self.notes:  # once per sender and round: the log stays readable
            self.notes[name] = what
            log.warning("reducer part %d: %s's %s", self.current_part_index, name, what)


def _part_problem(part: torch.Tensor, shape: torch.Size) -> str | None:
    """Why a sender's copy of a part cannot be combined with the others', or None."""
    if part.shape != shape:
        return f"shape {tuple(part.shape)}, not {tuple(shape)}"
    if not part.is_floating_point():
        return f"dtype {part.dtype}"
    return None


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
