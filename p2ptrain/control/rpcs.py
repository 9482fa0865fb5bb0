"""The one-shot request/response protocols a control node answers: STATUS_PROTOCOL (the status
document, for observers) and RUN_PROTOCOL (the organiser's signed run spec, for joining peers:
the bootstrap signs it afresh; a joined member sends the latest one it holds, so a new node can
join through it while the bootstrap is down, control/rejoin.py).

The status document is paged (control/status.StatusPages, built at most once a second): page 0
holds its scalar fields and the first peers and links, each later page more of them; the observer
joins them (observer.fetch_status_doc)."""

from __future__ import annotations

from typing import Any

from libp2p.custom_types import TProtocol

from p2ptrain.control import wire
from p2ptrain.control.authored import run_message
from p2ptrain.control.state import NodeState
from p2ptrain.control.status import StatusPages, swarm_status
from p2ptrain.net import rpc
from p2ptrain.net.paging import read_cursor
from p2ptrain.records.replies import RunReply

STATUS_PROTOCOL = TProtocol("/p2ptrain/status/1.0.0")
RUN_PROTOCOL = TProtocol("/p2ptrain/run/1.0.0")
STATUS_PAGE_BYTES = 1024 * 1024  # of peers and links as JSON; far inside rpc.MAX_REPLY_BYTES
# the largest run reply, both ends (rpc.cap_replies: a client refuses a larger one unread): a
# run envelope of at most wire.MAX_ENVELOPE_BYTES as a JSON string (escaping at most triples
# it, even a non-ASCII one), and the reply's braces; status pages keep rpc.MAX_REPLY_BYTES
RUN_REPLY_BYTES = 3 * wire.MAX_ENVELOPE_BYTES + 1024
rpc.cap_replies(RUN_PROTOCOL, RUN_REPLY_BYTES)


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
        state = self.state
        if state.view.run is None or not state.joined.is_set():
            return RunReply(error="not in a run yet").to_dict()
        if state.role == "bootstrap":
            return RunReply(envelope=run_message(state).decode()).to_dict()
        held = state.newest_run_envelope()
        if held is None:
            return RunReply(error="no run spec of the organiser held").to_dict()
        return RunReply(envelope=held.decode()).to_dict()
