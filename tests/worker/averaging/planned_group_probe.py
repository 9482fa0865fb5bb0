"""Run by test_planned_group.py in its own process (hivemind cannot share one with libp2p):
three hivemind DHT peers on 127.0.0.1, a StageAverager per averaging peer with the plan's
group, one round; prints one JSON line with what each peer got.

usage: planned_group_probe.py CASE   (CASE: full = all three average; missing = the group names
three peers but only two of them average; late_reply = two average, the second's reducer sends
its averages back late and the second leaves as soon as its own round is done, as at a run's
last step)
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import sys
import threading
import time
from typing import Any

import torch
from hivemind import DHT
from hivemind.proto import averaging_pb2

from p2ptrain.worker.averaging.planned_group import PlannedGroupAverager
from p2ptrain.worker.averaging.robust_allreduce import RobustAllReduceRunner
from p2ptrain.worker.averaging.stage_averager import StageAverager
from p2ptrain.worker.cpu_clock import WireMarks
from p2ptrain.worker.private_tmp import PrivateTmp
from p2ptrain.worker.traffic import Traffic

NUM_PARAMS = 1000
PREFIX = "planned-probe"
LATE_REPLY_S = 1.5  # late_reply: the second member's reducer holds its replies this long


def _reply_late_from(slow: Any) -> None:
    """Make member `slow`'s reducer hold its replies (a loaded machine's, in the extreme): its
    own round completes while its groupmate still waits for the averages of its share. The
    averagers' processes are forked after this, so they run the patched runner."""
    serve = RobustAllReduceRunner.rpc_aggregate_part

    async def late(self: Any, stream: Any, context: Any) -> Any:
        replies = [reply async for reply in serve(self, stream, context)]
        if self.peer_id == slow:  # every part reduced: only the replies are held
            await asyncio.sleep(LATE_REPLY_S)
        for reply in replies:
            yield reply

    RobustAllReduceRunner.rpc_aggregate_part = late  # type: ignore[method-assign]


async def _download(member: Any, _: Any, node: Any) -> int:
    """What `member`'s averager serves a stranger's rpc_download_state, in tensor bytes."""
    stub = PlannedGroupAverager.get_stub(node.p2p, member, namespace=PREFIX)
    replies = await stub.rpc_download_state(averaging_pb2.DownloadRequest())
    return sum([len(reply.tensor_part.buffer) async for reply in replies])


def main(case: str) -> None:
    PrivateTmp().use()  # hivemind's sockets and multiprocessing's folders go with us
    # each peer dials all earlier ones: every pair is connected, as a session's peers are
    dhts: list[DHT] = []
    for _ in range(3):
        known = [str(a) for d in dhts for a in d.get_visible_maddrs()]
        dhts.append(DHT(start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"], initial_peers=known))
    first = dhts[0]
    group = {d.peer_id.to_base58(): 1.0 for d in dhts}
    active = dhts if case == "full" else dhts[:2]
    if case == "late_reply":
        group = {d.peer_id.to_base58(): 1.0 for d in active}
        _reply_late_from(active[1].peer_id)
    traffics = [Traffic() for _ in active]
    averagers = [
        # a profiling worker's averager: it marks the CPU clock as parts come and go
        StageAverager(
            d,
            NUM_PARAMS,
            PREFIX,
            3,
            "none",
            timeout_s=4.0,
            group=group,
            traffic=t,
            wire=WireMarks(os.getpid()),
        )
        for d, t in zip(active, traffics, strict=True)
    ]
    grads = [torch.full((NUM_PARAMS,), float(i + 1)) for i in range(len(active))]
    results: list[Any] = [None] * len(active)
    left_after: list[float] = []  # late_reply: how long the second member's shutdown took

    def run(i: int) -> None:
        averaged, outcome = averagers[i].average(grads[i], step=5)
        if case == "late_reply" and i == 1:
            started = time.monotonic()
            averagers[i].shutdown()  # its last step: the session ends at once
            left_after.append(time.monotonic() - started)
        # bytes per groupmate, by its index (the worker's counters: worker/traffic.py)
        index = {d.peer_id.to_base58(): j for j, d in enumerate(dhts)}
        links = {index[p]: [c.sent, c.received] for p, c in traffics[i].link_bytes().items()}
        results[i] = {
            "mean": averaged.mean().item(),
            "kind": outcome.kind,
            "group_size": outcome.group_size,
            "link_bytes": links,
            "wire_cpu": outcome.wire_cpu,
        }

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(active))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    # hivemind's matchmaking declares its group key in the DHT; the planned group does not
    declared = first.get(f"{PREFIX}.0b", latest=True)
    # a stranger (outside the group) asks the first member for its averager's state: hivemind
    # served the whole buffer (the round's gradient) to anyone who asked
    stranger = DHT(start=True, initial_peers=[str(a) for a in first.get_visible_maddrs()])
    downloaded = stranger.run_coroutine(functools.partial(_download, first.peer_id))
    stranger.shutdown()
    print(
        json.dumps(
            {
                "results": results,
                "dht_matchmaking_used": declared is not None,
                "stranger_downloaded_bytes": downloaded,
                "state_sharing": averagers[0]._averager.allow_state_sharing,
                "left_after_s": left_after,
            }
        )
    )
    for i, averager in enumerate(averagers):
        if not (case == "late_reply" and i == 1):
            averager.shutdown()
    for d in dhts:
        d.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
