"""Run by test_hostile_groupmate.py in its own process (hivemind cannot share one with libp2p);
prints one JSON line.

usage: hostile_groupmate_probe.py CASE
  far_key:    a PlannedGroupAverager's metadata inbox (no network: its sends are stubbed), fed
              one far-future round key by a groupmate, then its honest rounds
  bad_part:   a RobustPartReducer fed one sender's part of the wrong shape, and one not
              floating point
"""

from __future__ import annotations

import asyncio
import json
import sys
import types
from typing import Any

import torch

FAR = "grad/9007199254740991"  # 2**53 - 1: a step no honest groupmate reaches


def far_key() -> dict[str, Any]:
    from hivemind.p2p import P2PContext, PeerID
    from hivemind.proto import averaging_pb2

    from p2ptrain.worker.averaging.averager_reports import AveragerReports
    from p2ptrain.worker.averaging.planned_gather import GroupmatesAhead
    from p2ptrain.worker.averaging.planned_group import PlannedGroupAverager

    me, honest, liar = (PeerID(bytes([0, 4]) + bytes([i]) * 4) for i in (1, 2, 3))

    class Bare(PlannedGroupAverager):  # the inbox's state only: no process, no p2pd
        peer_id = me

    avg = object.__new__(Bare)
    avg._group = tuple(p.to_base58() for p in (me, honest, liar))
    avg._weights = dict.fromkeys(avg._group, 1.0)
    avg._inbox, avg._rounds_seen, avg._sending = {}, {}, set()
    avg._waiting_for, avg._given_up, avg._latest_step, avg._arrived = "", "", -1, None
    avg.reports, avg.schema_hash, avg.prefix = AveragerReports(), b"schema", "probe"
    avg._parent_pid = -1  # hivemind's __del__ reads it

    async def no_send(peer: Any, request: Any, step: Any) -> None:
        pass

    avg._send = no_send  # type: ignore[method-assign]
    step = types.SimpleNamespace(data_for_gather=b"ours", get_timeout=lambda: 2.0)

    async def send(peer: PeerID, key: str) -> str:
        request = averaging_pb2.JoinRequest(schema_hash=b"schema", gather=b"x", group_key=key)
        context = P2PContext(handle_name="", local_id=me, remote_id=peer)
        reply = await avg.rpc_planned_gather(request, context)
        return str(averaging_pb2.MessageCode.Name(reply.code))

    async def run(key: str, *extra: tuple[PeerID, str], complete: bool = True) -> str:
        """Our planned round `key`: `extra` keys come while we wait, then (if `complete`) the
        groupmates' metadata of the round."""
        task = asyncio.create_task(avg.gather_planned(step, key))
        await asyncio.sleep(0)  # it sends ours and waits
        for peer, theirs in extra:
            codes[f"{'far' if theirs == FAR else theirs} during {key}"] = await send(peer, theirs)
        if complete:
            await send(honest, key)
            await send(liar, key)
        try:
            return "group" if await task is not None else "timed out"
        except GroupmatesAhead:
            return "groupmates ahead"

    codes: dict[str, str] = {}

    async def main() -> dict[str, Any]:
        codes["far before any round"] = await send(liar, FAR)
        rounds = {"grad/5": await run("grad/5", (liar, FAR))}
        for n in range(6, 9):
            rounds[f"grad/{n}"] = await run(f"grad/{n}")
        # the window keeps what it was for: a groupmate a step ahead still ends our round
        rounds["grad/9"] = await run("grad/9", (honest, "grad/10"), complete=False)
        hostile = {"5000 digits": "grad/" + "9" * 5000, "far": FAR}
        for key in ("grad/3", "grad/11", "grad/12", "grad/09", "grad/²", "x/9", *hostile):
            codes[key] = await send(honest, hostile.get(key, key))
        codes["state/900"] = await send(honest, "state/900")  # re-sync rounds: any step
        return {"rounds": rounds, "codes": codes, "held": sorted(avg._inbox)}

    return asyncio.run(main())


def bad_part() -> dict[str, Any]:
    from p2ptrain.worker.averaging.robust_reducer import RobustPartReducer

    honest = [torch.randn(2, 4, generator=torch.Generator().manual_seed(i)) for i in range(2)]
    bad = {2: torch.randn(2, 5), 3: torch.ones(2, 4, dtype=torch.int64)}  # shape; not floats

    async def main() -> tuple[list[list[float]], dict[str, str], list[list[int]]]:
        red = RobustPartReducer(
            [torch.Size([4])] * 2,
            4,
            weights=[1.0] * 4,
            own=0,
            drift_bound=None,
            floor_per_element=0.0,
            names=["s0", "s1", "s2", "s3"],
        )

        async def send(i: int) -> list[torch.Tensor]:
            parts = bad[i] if i in bad else honest[i]
            return [await red.accumulate_part(i, j, parts[j]) for j in range(2)]

        # before, the combination raised and the others waited for the part for ever
        results = await asyncio.wait_for(asyncio.gather(*(send(i) for i in range(4))), 5.0)
        red.finalize()
        contributors = [sorted(c) for c in red.contributors]
        return [[float(x) for x in r[0]] for r in results], red.notes, contributors

    results, notes, contributors = asyncio.run(main())
    mean = ((honest[0][0] + honest[1][0]) / 2).tolist()
    error = max(abs(a - b) for r in results for a, b in zip(r, mean, strict=True))
    return {"error": error, "notes": notes, "contributors": contributors}


if __name__ == "__main__":
    cases = {"far_key": far_key, "bad_part": bad_part}
    print(json.dumps(cases[sys.argv[1]]()))
