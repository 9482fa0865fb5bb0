"""Every record that crosses a process or a network, one frozen dataclass each (stdlib only).

Each is declared once, its fields annotated with their bounds; records/codec.py derives its
`to_dict()` and a `from_dict()` that is total: whatever JSON-like value it is given, it returns a
valid record or raises `p2ptrain.errors.WireError`, never anything else. Producers build
records; nobody builds or reads a bare dict of one.

| record          | module                 | travels                                             |
|-----------------|------------------------|-----------------------------------------------------|
| RunSpec         | records/run.py (sections: run_sections.py) | organiser's TOML -> bootstrap -> gossip -> worker |
| PeerRecord      | records/peer.py        | gossip + DHT (envelope kind "peer")                 |
| Telemetry       | records/peer.py        | gossip (kind "telemetry"): link row, PeerMetrics, Health |
| Claim           | records/peer.py        | gossip (kind "claim"): a planner's term             |
| Plan            | records/plan.py        | gossip (kind "plan") -> worker socket -> metrics log|
| NetworkFacts    | records/network.py     | inside a Plan: the links it was made for, per group and hop |
| (lineage)       | records/lineage.py     | inside a Plan: whose stage states it may use        |
| DaemonCheckReply, DeviceFacts | records/messages.py | `doctor`'s daemon-check child -> doctor (one stdout line) |
| Hello, MetricsReport, Heartbeat, ComputeReport, SavedReport, CopyReport, SessionReport, StartReport, PlanMessage, RunMessage, Stop | records/messages.py | worker socket, metrics logs |
| SavedStage      | records/peer.py        | worker socket (SavedReport) -> PeerRecord -> the first plan |
| StageCopy       | records/peer.py        | worker socket (CopyReport) -> PeerMetrics -> status |
| StepProfile     | records/profile.py     | metrics logs only (`join --profile`)                |
| StageCompute    | records/peer.py        | worker socket (ComputeReport) -> PeerRecord -> status |
| SwarmStatus     | records/status.py      | the status RPC, `status --json`                     |
| DialBackRequest, DialBackReply (DialResult) | records/reachability.py | the dial-back RPC; `reachability` in PeerRecord |
| (UDP query/answer) | records/reachability.py | the UDP observed-address responder (32-byte datagrams) |
| RelayRequest, RelayOffer, OfferAnswer, RelayReply, RawHello | records/relay.py | relay signalling (control plane); raw relay/punch connections' first bytes |
| Token           | records/token.py       | organiser -> volunteer -> `join --token` -> record  |
| Revocations     | records/token.py       | `token revoke` -> bootstrap -> gossip ("revoked")   |

The signed envelope around gossiped bodies is control/wire.py's; the data plane's frames
(worker/pipeline/frames.py) and averaging metadata (worker/averaging/planned_group.py) are defined beside their
protocols.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from p2ptrain.records.messages import (
        PHASES,
        ComputeReport,
        CopyReport,
        DaemonCheckReply,
        DeviceFacts,
        Heartbeat,
        Hello,
        LinkBytes,
        Message,
        MetricsReport,
        PlanMessage,
        RunMessage,
        SavedReport,
        SessionReport,
        StartReport,
        Stop,
        WorkerReport,
        message_from_dict,
    )
    from p2ptrain.records.network import LinkFacts, NetworkFacts
    from p2ptrain.records.peer import (
        MEMBER_ROLES,
        PROTOCOL_LEVEL,
        ROLES,
        Claim,
        Health,
        LinkReport,
        PeerMetrics,
        PeerRecord,
        SavedStage,
        StageCompute,
        StageCopy,
        Telemetry,
    )
    from p2ptrain.records.plan import Plan, Role
    from p2ptrain.records.profile import StepProfile
    from p2ptrain.records.reachability import (
        REACHABILITY,
        DialBackReply,
        DialBackRequest,
        DialResult,
    )
    from p2ptrain.records.relay import (
        OfferAnswer,
        RawHello,
        RelayOffer,
        RelayReply,
        RelayRequest,
    )
    from p2ptrain.records.run import RunSpec, load_run_spec
    from p2ptrain.records.status import LinkStatus, PeerStatus, PlanSummary, SwarmStatus
    from p2ptrain.records.token import (
        Revocation,
        Revocations,
        Token,
        issue_revocation,
        issue_token,
        revocation_problem,
        token_problem,
    )

# name -> the module that defines it: a name is imported on first use, so that a process that
# needs one small record (the node supervisor: records/fields.py's bounds) does not load them
# all, nor what they import (cryptography's bindings for tokens: ~18 MiB resident in all)
_HOMES = {
    "Claim": "peer",
    "ComputeReport": "messages",
    "CopyReport": "messages",
    "DialBackReply": "reachability",
    "DialBackRequest": "reachability",
    "DialResult": "reachability",
    "Health": "peer",
    "Heartbeat": "messages",
    "DaemonCheckReply": "messages",
    "DeviceFacts": "messages",
    "Hello": "messages",
    "LinkBytes": "messages",
    "LinkFacts": "network",
    "LinkReport": "peer",
    "LinkStatus": "status",
    "MEMBER_ROLES": "peer",
    "PROTOCOL_LEVEL": "peer",
    "Message": "messages",
    "MetricsReport": "messages",
    "NetworkFacts": "network",
    "OfferAnswer": "relay",
    "PHASES": "messages",
    "PeerMetrics": "peer",
    "PeerRecord": "peer",
    "PeerStatus": "status",
    "Plan": "plan",
    "PlanMessage": "messages",
    "PlanSummary": "status",
    "REACHABILITY": "reachability",
    "ROLES": "peer",
    "RawHello": "relay",
    "RelayOffer": "relay",
    "RelayReply": "relay",
    "RelayRequest": "relay",
    "Revocation": "token",
    "Revocations": "token",
    "Role": "plan",
    "RunMessage": "messages",
    "RunSpec": "run",
    "SavedReport": "messages",
    "SavedStage": "peer",
    "SessionReport": "messages",
    "StartReport": "messages",
    "WorkerReport": "messages",
    "StageCompute": "peer",
    "StageCopy": "peer",
    "StepProfile": "profile",
    "Stop": "messages",
    "SwarmStatus": "status",
    "Telemetry": "peer",
    "Token": "token",
    "issue_revocation": "token",
    "issue_token": "token",
    "load_run_spec": "run",
    "message_from_dict": "messages",
    "revocation_problem": "token",
    "token_problem": "token",
}

__all__ = [
    "MEMBER_ROLES",
    "PHASES",
    "PROTOCOL_LEVEL",
    "REACHABILITY",
    "ROLES",
    "Claim",
    "ComputeReport",
    "CopyReport",
    "DaemonCheckReply",
    "DeviceFacts",
    "DialBackReply",
    "DialBackRequest",
    "DialResult",
    "Health",
    "Heartbeat",
    "Hello",
    "LinkBytes",
    "LinkFacts",
    "LinkReport",
    "LinkStatus",
    "Message",
    "MetricsReport",
    "NetworkFacts",
    "OfferAnswer",
    "PeerMetrics",
    "PeerRecord",
    "PeerStatus",
    "Plan",
    "PlanMessage",
    "PlanSummary",
    "RawHello",
    "RelayOffer",
    "RelayReply",
    "RelayRequest",
    "Revocation",
    "Revocations",
    "Role",
    "RunMessage",
    "RunSpec",
    "SavedReport",
    "SavedStage",
    "SessionReport",
    "StageCompute",
    "StageCopy",
    "StartReport",
    "StepProfile",
    "Stop",
    "SwarmStatus",
    "Telemetry",
    "Token",
    "WorkerReport",
    "issue_revocation",
    "issue_token",
    "load_run_spec",
    "message_from_dict",
    "revocation_problem",
    "token_problem",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value
