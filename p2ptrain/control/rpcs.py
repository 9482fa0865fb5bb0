"""The one-shot request/response protocols a control node answers: STATUS_PROTOCOL (the status
document, for observers) and RUN_PROTOCOL (the bootstrap's signed run spec, for joining peers).

The status document is paged (control/status.StatusPages, built at most once a second): page 0
holds its scalar fields and the first peers and links, each later page more of them; the observer
joins them (observer.fetch_status_doc)."""

from __future__ import annotations

from typing import Any

from libp2p.custom_types import TProtocol

from p2ptrain.control.publishing import run_message
from p2ptrain.control.state import NodeState
from p2ptrain.control.status import StatusPages, swarm_status
from p2ptrain.net.paging import read_cursor
from p2ptrain.records.replies import RunReply

STATUS_PROTOCOL = TProtocol("/p2ptrain/status/1.0.0")
RUN_PROTOCOL = TProtocol("/p2ptrain/run/1.0.0")
STATUS_PAGE_BYTES = 1024 * 1024  # of peers and links as JSON; far inside rpc.MAX_REPLY_BYTES


class RpcResponder:
    """Answers the status and run requests from the node's state (see net/rpc.make_handler)."""

    def __init__(self, state: NodeState) -> None:
        self.state = state
        self.status_pages = StatusPages(
            lambda now: swarm_status(state.view, now, state.relay.bytes_relayed), STATUS_PAGE_BYTES
        )

    async def respond_status(self, request: bytes) -> dict[str, Any]:
        return self.status_pages.page(read_cursor(request))

    async def respond_run(self, request: bytes) -> dict[str, Any]:
        if self.state.role != "bootstrap" or self.state.view.run is None:
            return RunReply(error="not a bootstrap").to_dict()
        return RunReply(envelope=run_message(self.state).decode()).to_dict()
