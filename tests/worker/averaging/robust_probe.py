"""Run by test_robust_averaging.py in its own process (hivemind cannot share one with libp2p);
prints one JSON line.

usage: robust_probe.py CASE
  reducer:  a RobustPartReducer fed three senders' parts directly (one claims a weight of 1e9,
            one sends an infinity)
  router:   the retry matchmaking of a planned group, asked by and offered non-members
  part_rows: hivemind's split of a flat tensor among 3 reducers, each part's token-row spans
            found from its place in the tensor
  poisoned: three StageAverager peers on 127.0.0.1, one of which puts garbage orthogonal to
            the checksum directions into its gradient while gathering honest checksums
  lost_reply: two StageAverager peers on 127.0.0.1; the first's reducer takes the second's
            parts but its reply stream ends with none of the averages (as p2pd streams
            rarely do under load)
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from typing import Any

import torch

N = 4096


def _honest(num: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    shared = torch.randn(N, generator=generator)
    return [shared + 0.5 * torch.randn(N, generator=generator) for _ in range(num)]


def reducer() -> dict[str, Any]:
    from p2ptrain.worker.averaging.robust_reducer import RobustPartReducer

    parts = [list(p.split(1024)) for p in _honest(3)]
    parts[2][1] = parts[2][1] * float("inf")
    weights, claimed = [1.0, 1.0, 2.0], [1.0, 1e9, 2.0]

    async def main() -> tuple[list[list[torch.Tensor]], dict[str, str]]:
        red = RobustPartReducer(
            [p.shape for p in parts[0]],
            3,
            weights=weights,
            own=0,
            drift_bound=None,
            floor_per_element=0.0,
            names=["s0", "s1", "s2"],
        )

        async def send(i: int) -> list[torch.Tensor]:
            out = []
            for j in range(4):
                await asyncio.sleep(0.001 * ((i * 7 + j * 3) % 5))  # senders interleave
                out.append(await red.accumulate_part(i, j, parts[i][j], weight=claimed[i]))
            return out

        results = await asyncio.gather(*(send(i) for i in range(3)))
        red.finalize()
        return list(results), red.notes

    results, notes = asyncio.run(main())
    errors = []
    for j in range(4):
        kept = [0, 1] if j == 1 else [0, 1, 2]
        want = sum(weights[i] * parts[i][j] for i in kept) / sum(weights[i] for i in kept)
        errors += [float((r[j] - want).abs().max()) for r in results]
    return {"max_error": max(errors), "notes": notes}


def part_rows() -> dict[str, Any]:
    from hivemind.averaging.partition import TensorPartContainer

    from p2ptrain.worker.averaging.robust_allreduce import _part_rows

    tensor = torch.zeros(10_003)[3:]  # a view that does not start its storage
    rows = [(0, 1500), (7000, 10_000)]
    container = TensorPartContainer([tensor], (3334, 3333, 3333), part_size_bytes=4 * 700)
    num_parts = []
    for peer in range(3):
        parts = container.get_raw_input_parts(peer)
        num_parts.append(len(parts))
        for part, spans in zip(parts, _part_rows([tensor], parts, rows), strict=True):
            for a, b in spans:
                part[a:b] += 1.0  # a view: marks the tensor where the part says its rows are
    want = torch.zeros(10_000)
    for a, b in rows:
        want[a:b] = 1.0
    return {"num_parts": num_parts, "exact": bool(torch.equal(tensor, want))}


def router() -> dict[str, Any]:
    from hivemind.averaging.group_info import GroupInfo
    from hivemind.p2p import P2PContext, PeerID
    from hivemind.proto import averaging_pb2

    from p2ptrain.worker.averaging.planned_group import PlannedGroupAverager
    from p2ptrain.worker.averaging.round_router import RoundRouter

    member, other, stranger = (PeerID(bytes([0, 4]) + bytes([i]) * 4) for i in (1, 2, 3))

    class Averager:  # the router's view of a PlannedGroupAverager
        outsiders = PlannedGroupAverager.outsiders

        def __init__(self) -> None:
            self._weights = {member.to_base58(): 1.0, other.to_base58(): 1.0}
            self._rounds_seen = {"5": None}  # round 5's planned attempt is over: a retry

        def _round_key(self, step: Any) -> str:
            return "5"

        def _found(self, group: Any, step: Any) -> None:
            pass

    class DhtMatchmaking:
        offered: tuple[PeerID, ...] = ()

        async def look_for_group(self, step: Any) -> GroupInfo:
            return GroupInfo(b"g", self.offered, (b"", b""))

        async def rpc_join_group(self, request: Any, context: Any) -> Any:
            yield averaging_pb2.MessageFromLeader(code=averaging_pb2.ACCEPTED)

    async def main() -> dict[str, Any]:
        dht = DhtMatchmaking()
        route = RoundRouter(Averager(), dht)  # type: ignore[arg-type]
        codes = {}
        for name, peer in (("member", other), ("stranger", stranger)):
            context = P2PContext(handle_name="", local_id=member, remote_id=peer)
            replies = [r async for r in route.rpc_join_group(averaging_pb2.JoinRequest(), context)]
            codes[name] = [averaging_pb2.MessageCode.Name(r.code) for r in replies]
        found = {}
        for name, group in (("members", (member, other)), ("with_stranger", (member, stranger))):
            dht.offered = group
            found[name] = await route.look_for_group(None) is not None  # type: ignore[arg-type]
        return {"join_codes": codes, "found": found}

    return asyncio.run(main())


def _local_dhts(num: int) -> list[Any]:
    """`num` hivemind DHT nodes on 127.0.0.1, each knowing the ones started before it."""
    from hivemind import DHT

    dhts: list[Any] = []
    for _ in range(num):
        known = [str(a) for d in dhts for a in d.get_visible_maddrs()]
        dhts.append(DHT(start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"], initial_peers=known))
    return dhts


def _run_then_shut_down(threads: list[threading.Thread], averagers: Any, dhts: Any) -> None:
    """Start the members' threads, wait for them (90 s at most), then stop every averager and
    DHT node."""
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=90)
    for averager in averagers:
        averager.shutdown()
    for d in dhts:
        d.shutdown()


def poisoned() -> dict[str, Any]:

    from p2ptrain.worker.averaging.checks import GRAD, RoundGather, checksums
    from p2ptrain.worker.averaging.stage_averager import StageAverager

    dhts = _local_dhts(3)
    group = {d.peer_id.to_base58(): 1.0 for d in dhts}
    averagers = [StageAverager(d, N, "robust-probe", 3, "none", 6.0, group=group) for d in dhts]
    grads = _honest(3)
    step = 5
    # the attacker's garbage: 1000× a gradient's norm, orthogonal to the all-ones and the
    # step's ±1 checksum directions, so the checksums it gathers (of its honest gradient) hold
    signs = (
        torch.randint(
            0,
            2,
            (N,),
            generator=torch.Generator().manual_seed(1_000_003 * step + 17),
            dtype=torch.int8,
        ).double()
        * 2
        - 1
    )
    basis, _ = torch.linalg.qr(torch.stack([torch.ones(N, dtype=torch.float64), signs], dim=1))
    garbage = torch.randn(N, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    garbage -= basis @ (basis.T @ garbage)
    garbage = (1000 * float(grads[2].norm()) * garbage / garbage.norm()).float()
    results: list[Any] = [None] * 3

    def honest(i: int) -> None:
        averaged, outcome = averagers[i].average(grads[i], step)
        direction = garbage / garbage.norm()
        results[i] = {
            "kind": outcome.kind,
            "detail": outcome.detail,
            "group_size": outcome.group_size,
            "garbage_share": float(averaged @ direction) / float(garbage.norm()),
            "own_gradient": bool(torch.equal(averaged, grads[i])),
            "finite": bool(torch.isfinite(averaged).all()),
        }

    def attacker() -> None:
        liar = averagers[2]._averager
        with liar.get_tensors() as (buffer,):
            buffer.copy_(grads[2] + garbage)
        gather = RoundGather(GRAD, checksums(grads[2], step, 1.0)).to_dict()
        try:
            liar.step(gather=gather, weight=1e9, timeout=6.0, allow_retries=False)
        except Exception as exc:  # its round fails: we only look at the honest ones
            print(f"attacker: {exc!r}", file=sys.stderr)

    threads = [threading.Thread(target=honest, args=(i,)) for i in range(2)]
    threads.append(threading.Thread(target=attacker))
    _run_then_shut_down(threads, averagers, dhts)
    return {"results": results[:2]}


def lost_reply() -> dict[str, Any]:
    import os
    import tempfile
    from collections.abc import AsyncIterator

    from p2ptrain.worker.averaging.robust_allreduce import RobustAllReduceRunner
    from p2ptrain.worker.averaging.stage_averager import StageAverager

    dhts = _local_dhts(2)
    dropper = dhts[0].peer_id
    marker = os.path.join(tempfile.mkdtemp(), "dropped")
    serve = RobustAllReduceRunner.rpc_aggregate_part

    async def drop_replies(self: Any, stream: Any, context: Any) -> AsyncIterator[Any]:
        async for reply in serve(self, stream, context):  # the reduction runs as usual ...
            if self.peer_id != dropper:
                yield reply
        if self.peer_id == dropper:  # ... but the sender gets none of it back
            os.close(os.open(marker, os.O_CREAT | os.O_WRONLY))  # an empty file says it did

    RobustAllReduceRunner.rpc_aggregate_part = drop_replies  # type: ignore[method-assign]
    group = {d.peer_id.to_base58(): 1.0 for d in dhts}
    size = 2**19  # four parts for each member's reducer (schedule/step_time.py's part_size_bytes)
    averagers = [StageAverager(d, size, "lost-reply", 2, "none", 6.0, group=group) for d in dhts]
    grads = [torch.randn(size, generator=torch.Generator().manual_seed(i)) for i in range(2)]
    mean = (grads[0] + grads[1]) / 2
    results: list[Any] = [None] * 2

    def member(i: int) -> None:
        averaged, outcome = averagers[i].average(grads[i], 3)
        results[i] = {
            "kind": outcome.kind,
            "detail": outcome.detail,
            "error": float((averaged - mean).abs().max()),
        }

    threads = [threading.Thread(target=member, args=(i,)) for i in range(2)]
    _run_then_shut_down(threads, averagers, dhts)
    return {"results": results, "dropped": os.path.exists(marker)}


if __name__ == "__main__":
    cases = {
        "reducer": reducer,
        "part_rows": part_rows,
        "router": router,
        "poisoned": poisoned,
        "lost_reply": lost_reply,
    }
    print(json.dumps(cases[sys.argv[1]]()))
