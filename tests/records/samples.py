"""One valid instance of every record, as the dict a producer writes."""

from __future__ import annotations

from typing import Any

from p2ptrain.records import (
    Claim,
    ComputeReport,
    CopyReport,
    DaemonCheckReply,
    DialBackReply,
    DialBackRequest,
    DialResult,
    Health,
    Heartbeat,
    Hello,
    MetricsReport,
    OfferAnswer,
    PeerMetrics,
    PeerRecord,
    Plan,
    PlanMessage,
    RelayOffer,
    RelayReply,
    RelayRequest,
    Revocation,
    Revocations,
    RunMessage,
    RunSpec,
    SavedReport,
    SavedStage,
    SessionReport,
    StageCompute,
    StageCopy,
    StartReport,
    StepProfile,
    Stop,
    SwarmStatus,
    Telemetry,
    Token,
    issue_revocation,
    issue_token,
)
from p2ptrain.records.replies import (
    Cursor,
    PlanReply,
    PlanRequest,
    RunReply,
    StatusPage,
    SyncPage,
    SyncRequest,
)
from p2ptrain.records.stage_state import StateMeta
from p2ptrain.worker.pipeline.frames import FrameHeader
from p2ptrain.worker.resume.copies import CopyRequest
from p2ptrain.worker.resume.state_request import StateRequest

A = "12D3KooWA1111111111111111111111111111111111111111111"
B = "12D3KooWB2222222222222222222222222222222222222222222"
C = "12D3KooWC3333333333333333333333333333333333333333333"


def plan_dict() -> dict[str, Any]:
    return {
        "term": 2,
        "epoch": 5,
        "planner": A,
        "stages": 2,
        "pipelines": [[A, B]],
        "spares": [C],
        "data_addrs": {A: ["/ip4/127.0.0.1/tcp/4001"], B: ["/ip4/127.0.0.1/tcp/4002"]},
        "cost_s": 0.25,
        "network": {
            "max_rtt_s": 0.12,
            "min_rate_mbps": 50.0,
            "groups": [[0.0, 50.0], [0.0, 50.0]],  # one replica: no group links
            "hops": [[[0.08, 120.0]]],
        },
        "lineage": [["0123456789abcdef", 5], ["fedcba9876543210", 3]],
        "stage_layers": [3, 1],
        "reason": "drift",
        "previous_cost_s": 0.5,
        "predicted_step_s": 0.3,
    }


def peer_dict() -> dict[str, Any]:
    return {
        "addrs": [f"/ip4/127.0.0.1/tcp/4001/p2p/{A}"],
        "data_addrs": ["/ip4/127.0.0.1/tcp/4002"],
        "role": "trainer",
        "planner_capable": True,
        "version": "0.1.0",
        "hardware": {"cpu_count": 2, "gpus": [], "memory_bytes": 2**34},
        "compute_gflops": 12.5,
        "reachability": "private",
        "relay_addrs": ["/ip4/127.0.0.1/tcp/4003"],
        "relays": [B],
    }


def telemetry_dict() -> dict[str, Any]:
    return {
        "links": {
            B: {
                "rtt_ms": 0.4,
                "rtt_age_s": 1.0,
                "bandwidth_mbps": None,
                "bandwidth_age_s": None,
                "connection": "holepunched",
            }
        },
        "metrics": {
            "step": 3,
            "loss": 4.5,
            "tokens_per_s": 900.0,
            "stage": 1,
            "replica": 0,
            "bytes_sent": 123456,
            "bytes_received": 654321,
            "step_s": 0.7,
            "averaging": {"averaged": 3, "local": 1},
            "control_bytes_sent": 4096,
            "control_bytes_received": 8192,
            "relay_bytes": 4096,
            "start_step": 2,
            "start_lineage": "0123456789abcdef",
            "resume_never": False,
        },
    }


def copy_dict() -> dict[str, Any]:
    return {"first": 0, "end": 2, "holder": A, "step": 1320}


def metrics_dict() -> dict[str, Any]:
    return {
        "type": "metrics",
        "step": 3,
        "loss": 4.5,
        "tokens_per_s": 900.0,
        "stage": 1,
        "replica": 0,
        "samples": 8,
        "averaging": "averaged",
        "step_s": 0.7,
        "epoch": 5,
        "term": 2,
        "num_replicas": 2,
        "bytes_sent": 3000,
        "bytes_received": 2000,
        "link_bytes": {B: {"sent": 1000, "received": 1500}, C: {"sent": 2000, "received": 500}},
        "group_size": 2,
        "forward_s": 0.1,
        "backward_s": 0.2,
        "update_s": 0.01,
        "averaging_s": 0.3,
        "start_step": 2,
        "start_lineage": "0123456789abcdef",
        "resume_never": False,
        "outer_steps": None,
        "inner_steps": None,
        "outer_round": "",
    }


def profile_dict() -> dict[str, Any]:
    return {
        "type": "profile",
        "step": 3,
        "term": 2,
        "epoch": 5,
        "stage": 1,
        "replica": 0,
        "forward_cpu_s": 0.02,
        "backward_cpu_s": 0.05,
        "update_cpu_s": 0.01,
        "frames": 8,
        "frames_cpu_s": 0.04,
        "helpers_cpu_s": 0.01,
        "averaging_cpu_s": 0.05,
        "averaging_cpu_before_s": 0.02,
        "averaging_cpu_after_s": 0.01,
    }


def status_dict() -> dict[str, Any]:
    peer = {
        "id": A,
        "alive": True,
        "planner": True,
        "last_seen_s": 0.0,
        "penalty": 0.0,
        "metrics": telemetry_dict()["metrics"],
        "health": {"ok": True, "reason": ""},
        "stage_compute": compute_dict(),
        "started": "resumed from step 2 (lineage 0123456789abcdef)",
        **peer_dict(),
    }
    del peer["planner_capable"], peer["relay_addrs"]
    plan = {k: v for k, v in plan_dict().items() if k not in ("data_addrs", "network", "lineage")}
    return {
        "run": "r",
        "planner": A,
        "peers": [peer],
        "links": [
            {
                "a": A,
                "b": B,
                "rtt_ms": 0.4,
                "bandwidth_mbps": 900.0,
                "age_s": 1.0,
                "connection": "relayed",
            }
        ],
        "plan": plan,
        "observed_by": A,
        "telemetry_age_s": {B: 0.5},
        "bootstrap": C,
        "term": 2,
        "relay_bytes": 123456,
        "waiting": "place",
        "waiting_for": "a place in the plan",
        "finished": False,
    }


def dial_back_reply_dict() -> dict[str, Any]:
    return {
        "observed": "/ip4/203.0.113.7/tcp/40123",
        "results": [
            {"addr": "/ip4/203.0.113.7/tcp/7401", "ok": True, "error": ""},
            {"addr": "/ip4/203.0.113.7/tcp/7411", "ok": False, "error": "timed out"},
        ],
        "time_s": 1_790_000_000.25,
        "error": "rate limited",
    }


def daemon_check_dict() -> dict[str, Any]:
    device = {"name": "cuda NVIDIA H200", "memory_bytes": 2**37, "precision": "bfloat16"}
    return {
        "ok": True,
        "addrs": ["/ip4/127.0.0.1/tcp/4001"],
        "p2pd": "/venv/hivemind/hivemind_cli/p2pd",
        "go_runtime": {"GOGC": "off", "GOMEMLIMIT": "256MiB"},
        "device": {**device, "precision_scaled": "bfloat16"},
    }


def token_dict() -> dict[str, Any]:
    return issue_token(bytes(range(32)), A, True, 2e9).to_dict()


def compute_dict() -> dict[str, Any]:
    return {
        "block_row_s": 0.0004,
        "embed_row_s": 2e-5,
        "head_row_s": 0.0003,
        "rows": 8,
        "device": "cuda NVIDIA H100",
        "run_id": "p2ptrain-default",
        "memory_bytes": 85_000_000_000,
        "precision": "bfloat16",
    }


def llama_run_dict() -> dict[str, Any]:
    """A Llama run with every model field set."""
    return (
        RunSpec()
        .replace(
            run_id="llama",
            stages=1,
            model="llama",
            n_layer=3,
            n_head=8,
            n_embd=128,
            intermediate_size=384,
            num_key_value_heads=2,
            rms_norm_eps=1e-6,
            rope_theta=500_000.0,
            tie_word_embeddings=True,
        )
        .to_dict()
    )


def frame_header_dict() -> dict[str, Any]:
    return {
        "kind": "act",
        "run_id": "p2ptrain-default",
        "term": 2,
        "epoch": 5,
        "step": 3,
        "micro": 1,
        "sender": A,
        "dtype": "bfloat16",
        "shape": [4, 64, 768],
        "num_bytes": 4 * 64 * 768 * 2,
    }


def stage_state_dict() -> dict[str, Any]:
    """The metadata of a saved stage state (train/state_file.py), as torch's AdamW has it."""
    adamw = {
        "lr": 6e-4,
        "betas": [0.9, 0.95],
        "eps": 1e-8,
        "weight_decay": 0.1,
        "amsgrad": False,
        "maximize": False,
        "foreach": False,
        "capturable": False,
        "differentiable": False,
        "fused": None,
        "decoupled_weight_decay": True,
    }
    return {
        "format": "p2ptrain.stage-checkpoint/3",
        "run_id": "r",
        "data_sha256": "ab" * 32,
        "model": {
            "family": "nanogpt",
            "n_layer": 4,
            "n_head": 2,
            "n_embd": 16,
            "block_size": 8,
            "vocab_size": 256,
            "n_kv_head": 2,
            "n_inner": 64,
            "rms_norm_eps": 0.0,
            "rope_theta": 0.0,
            "tie_word_embeddings": False,
        },
        "layers": [1, 3],
        "step": 12,
        "param_groups": [{**adamw, "params": [0, 1, 2]}, {**adamw, "params": [3, 4]}],
        "scalars": {"3": {"step": 12.0}},
    }


# (record class, a valid dict of it)
SAMPLES: list[tuple[Any, dict[str, Any]]] = [
    (Plan, plan_dict()),
    (Plan, {**plan_dict(), "donors": [C]}),
    (Plan, {**plan_dict(), "donors": [C], "donor_blocks": {C: [2, 4]}}),
    (PeerRecord, peer_dict()),
    (PeerRecord, {**peer_dict(), "token": Token.from_dict(token_dict()).encode()}),
    (PeerRecord, {**peer_dict(), "stage_compute": compute_dict()}),
    (StageCompute, compute_dict()),
    (ComputeReport, {"type": "compute", "compute": compute_dict()}),
    (Token, token_dict()),
    (Revocation, issue_revocation(bytes(range(32)), B).to_dict()),
    (
        Revocations,
        {"entries": [issue_revocation(bytes(range(32)), B).to_dict()], "page": 0, "num_pages": 1},
    ),
    (Revocations, {"entries": [], "page": 2, "num_pages": 3}),
    (Token, issue_token(bytes(range(32)), A, False, 2e9, run_id="r").to_dict()),
    (Telemetry, telemetry_dict()),
    (Telemetry, {**telemetry_dict(), "health": {"ok": False, "reason": "worker silent for 61 s"}}),
    (Health, {"ok": True, "reason": ""}),
    (DaemonCheckReply, daemon_check_dict()),
    (DaemonCheckReply, {"ok": False, "error": "OSError: port taken", "device": {"error": "no"}}),
    (
        Health,
        {"ok": False, "reason": "the node has handed its stage over and exits", "plan": [1, 2]},
    ),
    (Heartbeat, {"type": "heartbeat", "phase": "training", "step": 7, "term": 2, "epoch": 5}),
    (Claim, {"term": 3}),
    (RunSpec, RunSpec().replace(run_id="r", steps=7).to_dict()),
    (RunSpec, llama_run_dict()),
    (RunSpec, RunSpec().replace(run_id="r", resume="never").to_dict()),
    (Hello, {"type": "hello", "peer_id": A, "data_addrs": ["/ip4/127.0.0.1/tcp/1"], "pid": 42}),
    (MetricsReport, metrics_dict()),
    (SessionReport, {"type": "session", "plan": plan_dict(), "step": 4}),
    (StartReport, {"type": "start", "term": 2, "epoch": 3, "silent": [A]}),
    (
        CopyReport,
        {
            "type": "copies",
            "copies": [copy_dict(), {**copy_dict(), "step": None}],
            "term": 2,
            "epoch": 5,
        },
    ),
    (StageCopy, copy_dict()),
    (SavedStage, {"first": 0, "end": 4, "step": 120, "lineage": "0123456789abcdef"}),
    (
        SavedReport,
        {
            "type": "saved",
            "run_id": "r",
            "saved": [
                {"first": 0, "end": 4, "step": 120, "lineage": "0123456789abcdef"},
                {"first": 4, "end": 8, "step": 7, "lineage": "root"},
            ],
        },
    ),
    (SavedReport, {"type": "saved", "run_id": "r", "saved": []}),
    (PeerRecord, {**peer_dict(), "saved": [{"first": 2, "end": 3, "step": 0, "lineage": "root"}]}),
    (
        PeerMetrics,
        PeerMetrics(copies=(StageCopy.from_dict(copy_dict()),), copies_plan=(2, 5)).to_dict(),
    ),
    (PeerMetrics, PeerMetrics(silent=(A, B), silent_plan=(2, 5)).to_dict()),
    (PlanMessage, {"type": "plan", "plan": plan_dict(), "run": RunSpec().to_dict()}),
    (StepProfile, profile_dict()),
    (StepProfile, {**profile_dict(), "averaging_cpu_before_s": None, "frames_cpu_s": None}),
    (
        PlanMessage,
        {"type": "plan", "plan": plan_dict(), "run": None, "routes": {B: ["/ip4/127.0.0.1/tcp/9"]}},
    ),
    (RunMessage, {"type": "run", "run": RunSpec().to_dict()}),
    (Stop, {"type": "stop"}),
    (SwarmStatus, status_dict()),
    (DialBackRequest, {"addrs": [f"/ip4/203.0.113.7/tcp/7401/p2p/{A}", "/ip4/10.0.0.2/tcp/7401"]}),
    (DialBackReply, dial_back_reply_dict()),
    (DialResult, {"addr": "/ip4/203.0.113.7/tcp/7401", "ok": False, "error": "refused"}),
    (
        RelayRequest,
        {"op": "connect", "target": B, "plane": "control", "endpoint": "10.78.0.2:40000"},
    ),
    (RelayOffer, {"source": A, "plane": "data", "token": "ab" * 16, "endpoint": "10.78.0.3:5"}),
    (OfferAnswer, {"accept": True, "endpoint": "10.78.0.3:41000"}),
    (RelayReply, {"error": "", "token": "cd" * 16, "endpoint": "1.2.3.4:5", "expires_s": 120.0}),
    (FrameHeader, frame_header_dict()),
    (FrameHeader, {**frame_header_dict(), "dtype": "int8_rows", "num_bytes": 4 * 64 * (4 + 768)}),
    (StateRequest, {"layers": "L0-2", "step": 7, "digest": "0f" * 32}),
    (CopyRequest, {"layers": "L0-2", "min_step": 40}),
    (StateMeta, stage_state_dict()),
    (SyncRequest, {"cursor": 0, "telemetry": False, "digests": ["0f" * 8] * 32, "asker": A}),
    (SyncRequest, {"cursor": 0, "keys": [[A, "peer"], [f"{A}/2", "revoked"]]}),
    (
        SyncPage,
        {
            "envelopes": [],
            "next": None,
            "term": None,
            "finished": False,
            "entries": [[A, "peer", "0f" * 8]],
        },
    ),
    (PlanRequest, {"term": 3, "epoch": 7}),
    (PlanRequest, {"term": 3, "epoch": 7, "have": [3, 6]}),
    (PlanReply, {"envelope": "{}"}),
    (PlanReply, {"delta": {"envelope": {}, "changed": {"epoch": 7}, "dropped": []}}),
    (Claim, {"term": 3, "plan": [3, 7]}),
    (Claim, {"term": 3, "sees": 12}),
    (
        Telemetry,
        {
            **telemetry_dict(),
            "coord": {"v": [1.0, -2.5, 3.0], "h": 4.2, "e": 0.5},
            "cap": {"up_mbps": 90.0, "down_mbps": None},
        },
    ),
    (RunReply, {"envelope": "{}"}),
    (RunReply, {"error": "no run yet"}),
    (StatusPage, {"peers": status_dict()["peers"], "links": status_dict()["links"], "next": 3}),
    (Cursor, {"cursor": 5}),
]
