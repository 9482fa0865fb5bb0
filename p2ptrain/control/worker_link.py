"""The bridge to this peer's worker over the IPC socket (ipc.IpcServer).

From the worker: `hello` (its data-plane addresses, announced in our peer record), `metrics`
(gossiped in our telemetry) and `throughput` (bandwidth it measured to a peer, a link sample).
To the worker: every plan the view accepts (with the run spec), and `stop` on shutdown.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import trio

from p2ptrain.control import wire
from p2ptrain.control.ipc import IpcServer
from p2ptrain.control.state import NodeState

log = logging.getLogger(__name__)

PLAN_POLL_S = 0.5
METRIC_FIELDS = ("step", "loss", "tokens_per_s", "stage", "replica")


class WorkerLink:
    """The control side of the control <-> worker IPC."""

    def __init__(self, state: NodeState, ipc_path: str) -> None:
        self.state = state
        self.ipc = IpcServer(ipc_path, self._on_message)

    async def serve_worker(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Listen on the socket (started once it listens) and send each new plan to the worker."""
        async with trio.open_nursery() as nursery:
            await nursery.start(self.ipc.serve)
            nursery.start_soon(self._serve_plans)
            task_status.started()

    async def stop_worker(self) -> None:
        """Ask a connected worker to checkpoint and exit."""
        await self.ipc.send({"type": "stop"})

    def _on_message(self, message: dict[str, Any]) -> None:
        """One message from the worker; raising KeyError, TypeError or ValueError drops it."""
        state = self.state
        kind = message["type"]
        now = time.monotonic()
        if kind == "hello":
            addrs = message["data_addrs"]
            if not wire.is_addr_list(addrs):
                raise ValueError("data_addrs must be a list of <= 16 address strings")
            if message.get("peer_id") != state.peer_id:
                log.warning(
                    "worker reports peer id %s, control is %s",
                    message.get("peer_id"),
                    state.peer_id,
                )
            state.data_addrs = list(addrs)
            state.publish_soon("record")
            log.info("worker is up with data addresses %s", state.data_addrs)
        elif kind == "metrics":
            state.view.own_metrics = {k: message.get(k) for k in METRIC_FIELDS}
        elif kind == "throughput":
            state.view.record_bandwidth(str(message["peer"]), float(message["mbps"]), now)
        else:
            raise ValueError(f"unknown message type {kind!r}")

    async def _serve_plans(self) -> None:
        view = self.state.view
        sent_version = 0
        while True:
            if view.plan_version != sent_version and view.plan is not None:
                sent_version = view.plan_version
                await self.ipc.send({"type": "plan", "plan": view.plan, "run": view.run})
            await trio.sleep(PLAN_POLL_S)
