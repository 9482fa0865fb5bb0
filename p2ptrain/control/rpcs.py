"""The one-shot request/response protocols a control node answers: STATUS_PROTOCOL (the status
document, for observers) and RUN_PROTOCOL (the bootstrap's signed run spec, for joining peers)."""

from __future__ import annotations

import time
from typing import Any

from libp2p.custom_types import TProtocol

from p2ptrain.control.publishing import run_message
from p2ptrain.control.state import NodeState
from p2ptrain.control.status import swarm_status

STATUS_PROTOCOL = TProtocol("/p2ptrain/status/1.0.0")
RUN_PROTOCOL = TProtocol("/p2ptrain/run/1.0.0")


class RpcResponder:
    """Answers the status and run requests from the node's state (see net/rpc.make_handler)."""

    def __init__(self, state: NodeState) -> None:
        self.state = state

    async def respond_status(self, request: bytes) -> dict[str, Any]:
        return swarm_status(self.state.view, time.monotonic()).to_dict()

    async def respond_run(self, request: bytes) -> dict[str, Any]:
        if self.state.role != "bootstrap" or self.state.view.run is None:
            return {"error": "not a bootstrap"}
        return {"envelope": run_message(self.state).decode()}
