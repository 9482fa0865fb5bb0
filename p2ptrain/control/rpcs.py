"""The one-shot request/response protocols a control node answers: STATUS_PROTOCOL (the status
document, for observers) and RUN_PROTOCOL (the bootstrap's signed run spec, for joining peers).

The status document is paged (net/paging.py): page 0 holds its scalar fields and the first peers
and links, each later page more of them; the observer joins them (observer.fetch_status_doc)."""

from __future__ import annotations

import time
from typing import Any

from libp2p.custom_types import TProtocol

from p2ptrain.control.publishing import run_message
from p2ptrain.control.state import NodeState
from p2ptrain.control.status import swarm_status
from p2ptrain.net.paging import page_of, read_cursor

STATUS_PROTOCOL = TProtocol("/p2ptrain/status/1.0.0")
RUN_PROTOCOL = TProtocol("/p2ptrain/run/1.0.0")
STATUS_PAGE_BYTES = 1024 * 1024  # of peers and links as JSON; far inside rpc.MAX_REPLY_BYTES


class RpcResponder:
    """Answers the status and run requests from the node's state (see net/rpc.make_handler)."""

    def __init__(self, state: NodeState) -> None:
        self.state = state

    async def respond_status(self, request: bytes) -> dict[str, Any]:
        cursor = read_cursor(request)
        doc = swarm_status(
            self.state.view, time.monotonic(), self.state.relay.bytes_relayed
        ).to_dict()
        items = [("peers", p) for p in doc.pop("peers")] + [("links", x) for x in doc.pop("links")]
        page, nxt = page_of(items, cursor, STATUS_PAGE_BYTES)
        reply = doc if cursor == 0 else {}
        reply["peers"] = [item for section, item in page if section == "peers"]
        reply["links"] = [item for section, item in page if section == "links"]
        reply["next"] = nxt
        return reply

    async def respond_run(self, request: bytes) -> dict[str, Any]:
        if self.state.role != "bootstrap" or self.state.view.run is None:
            return {"error": "not a bootstrap"}
        return {"envelope": run_message(self.state).decode()}
