"""The data plane over real processes on 127.0.0.1: compressed 2 x 2 training, a peer killed
mid-averaging, no orphaned processes. Every worker is its own process tree (worker, watchdog, hivemind DHT + averager
children, p2pd); LocalSwarm kills every process group on exit, even when a test fails.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from p2ptrain.harness.direct_swarm import LocalSwarm, SwarmResult, plan_for
from p2ptrain.records import MetricsReport, RunSpec
from p2ptrain.train.checkpoint_folder import checkpoint_path
from p2ptrain.train.checkpoint_read import read_file
from p2ptrain.train.data import get_batch, load_corpus, replica_rows
from p2ptrain.train.model import build_model, stage_layer_ranges
from p2ptrain.train.optim import lr_at, make_optimizer, set_lr
from p2ptrain.train.reference import forward_backward, train_reference
from p2ptrain.worker.faults import DIE_WHILE_AVERAGING, SKIP_AVERAGING, Fault, Faults
from tests.conftest import live_group_members
from tests.integration.tiny_specs import TINY_TWO_STAGES

pytestmark = pytest.mark.integration

TINY = TINY_TWO_STAGES.replace(run_id="data-plane-test", averaging_timeout_s=10.0)


def test_two_by_two_with_fp16_wire_formats_tracks_one_process(tmp_path: Path) -> None:
    """fp16 activations, gradients and averaging: every round verified, losses near exact.
    (The exact-mode equivalence runs through the CLI in test_local.py.)"""
    spec = TINY.replace(steps=6, compression="fp16", checkpoint_dir=str(tmp_path / "ckpt"))
    with LocalSwarm(spec, 4, tmp_path) as swarm:
        swarm.send_plan(plan_for(spec, swarm.wait_hellos()))
        result = swarm.train()
        exit_codes = swarm.wait_exit()
    assert [len(p) for p in result.plan.pipelines] == [2, 2]  # 2 stages x 2 replicas
    assert result.averaging == {"averaged": 4 * 6}, result.averaging  # every round verified
    assert exit_codes == [0, 0, 0, 0]
    reference = train_reference(spec, steps=6)
    torch.testing.assert_close(result.loss, reference, rtol=1e-2, atol=0)
    assert result.loss != reference  # the wire formats really were compressed
    for layers in stage_layer_ranges(spec.model.n_layer, 2):  # both stages checkpointed on exit
        assert read_file(checkpoint_path(tmp_path / "ckpt", layers))["step"] == 6


def test_killing_a_peer_mid_averaging_leaves_its_stage_intact_on_the_others(tmp_path: Path) -> None:
    """Stage 1 of replica 1 SIGKILLs its process tree 3 ms into averaging step 2. Its stage-mate
    must apply either the full average or its own local gradient, never a half-averaged one,
    and report which."""
    kill_step, victim_stage, victim_replica = 2, 1, 1
    spec = TINY.replace(
        steps=kill_step + 1, averaging_timeout_s=4.0, checkpoint_dir=str(tmp_path / "c")
    )
    fault = Fault(DIE_WHILE_AVERAGING, kill_step, victim_stage, victim_replica)
    flags = {i: Faults((fault,)).to_argv() for i in range(4)}
    # on the CPU, as the one-process reference: a GPU's bf16 passes are not exact
    with LocalSwarm(spec, 4, tmp_path, worker_flags=flags, device="cpu") as swarm:
        hellos = swarm.wait_hellos()
        plan = plan_for(spec, hellos)
        victim = plan.pipelines[victim_replica][victim_stage]
        victim_index = [h.peer_id for h in hellos].index(victim)
        swarm.may_die = {victim_index}
        swarm.send_plan(plan)
        messages = swarm.collect_until_exit(timeout_s=120)
        exit_codes = swarm.wait_exit()
        victim_pgid = swarm.procs[victim_index].pid
    assert exit_codes[victim_index] == -signal.SIGKILL
    assert all(code == 0 for i, code in enumerate(exit_codes) if i != victim_index), exit_codes
    # nothing of the victim's tree survived (zombies wait for init to reap them: they are dead)
    assert live_group_members(victim_pgid) == []

    outcomes = {
        (m.stage, m.replica): m.averaging
        for _, m in messages
        if isinstance(m, MetricsReport) and m.step == kill_step
    }
    assert outcomes[(0, 0)] == outcomes[(0, 1)] == "averaged"  # the other swarm is unaffected
    # the round broke and was not applied, or (rarely: a loopback round of the plan's group
    # takes ~10 ms) it completed before the victim died
    survivor_outcome = outcomes[(1, 0)]
    assert survivor_outcome in ("averaged", "local"), outcomes
    assert outcomes.get((1, 1), "averaged") == "averaged" or survivor_outcome == "local"

    # Recompute both admissible results of step 2 in one process and compare the survivor's stage.
    stage_layers = stage_layer_ranges(spec.model.n_layer, 2)
    survivor = read_file(checkpoint_path(Path(spec.checkpoint.checkpoint_dir), stage_layers[1]))
    assert survivor["step"] == kill_step + 1
    averaged = _reference_state(spec, kill_step, stage1_rows=None)
    local = _reference_state(spec, kill_step, stage1_rows=replica_rows(spec.optim.batch_size, 2, 0))
    first_block = stage_layers[1].start
    diffs = {"averaged": 0.0, "local": 0.0}
    for name, tensor in survivor["model_state"].items():
        whole_name = _whole_model_name(name, first_block)
        for label, state in (("averaged", averaged), ("local", local)):
            diffs[label] = max(diffs[label], (tensor - state[whole_name]).abs().max().item())
    other = "averaged" if survivor_outcome == "local" else "local"
    assert diffs[survivor_outcome] < 1e-5, diffs  # the update it reported (up to fp rounding)...
    assert diffs[other] > 1e-4, diffs  # ...which is measurably not the other one


def test_replicas_that_diverged_are_re_synced(tmp_path: Path) -> None:
    """Replica 1 keeps its local gradient at step 2 (so its stage-mate, finding no group, keeps
    its own too): the replicas now differ. The next round's parameter digests show it to both,
    they average their parameters once, and from then on the digests agree again."""
    skip_step = 2
    spec = TINY.replace(
        stages=1, steps=6, averaging_timeout_s=3.0, checkpoint_dir=str(tmp_path / "c")
    )
    result = _two_replicas_with_a_skip(spec, skip_step, tmp_path)
    assert result.averaging == {"averaged": 2 * 5, "local": 2}, result.averaging
    logs = [(tmp_path / f"worker-{i}.log").read_text() for i in range(2)]
    for log in logs:  # once each, right after the divergence; not again: back in sync
        synced = [line for line in log.splitlines() if "parameters re-synced" in line]
        assert len(synced) == 1 and f"step {skip_step + 1}:" in synced[0], synced
        assert "re-syncing failed" not in log


def test_worker_process_tree_dies_with_the_worker(tmp_path: Path) -> None:
    """SIGKILL only the worker's main process: its watchdog kills hivemind's children and p2pd."""
    sock = tmp_path / "none.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(sock))
    listener.listen(1)
    proc = subprocess.Popen(
        [sys.executable, "-m", "p2ptrain.worker", "--ipc", str(sock)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        conn, _ = listener.accept()
        conn.settimeout(120)
        received = b""
        while b'"hello"' not in received:  # heartbeats come first; hello once DHT and p2pd are up
            chunk = conn.recv(65536)
            assert chunk, received
            received += chunk
        members = live_group_members(proc.pid)
        assert len(members) >= 4, members  # worker, watchdog, DHT process, p2pd
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 10
        while live_group_members(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert live_group_members(proc.pid) == []
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        listener.close()


def _whole_model_name(stage_name: str, first_block: int) -> str:
    if stage_name.startswith("blocks."):
        _, index, rest = stage_name.split(".", 2)
        return f"blocks.{int(index) + first_block}.{rest}"
    return stage_name


def _reference_state(
    spec: RunSpec, last_step: int, stage1_rows: range | None
) -> dict[str, torch.Tensor]:
    """The whole model after steps 0..last_step in one process; on the last step, stage 1 uses
    the gradient of `stage1_rows` only (None: the whole batch, i.e. a complete average)."""
    torch.manual_seed(spec.optim.seed)
    model = build_model(spec)
    optimizer = make_optimizer(model, spec)
    corpus = load_corpus(spec)
    stage1_start = stage_layer_ranges(spec.model.n_layer, 2)[1].start
    for step in range(last_step + 1):
        set_lr(optimizer, lr_at(step, spec))
        x, y = get_batch(corpus, spec, step)
        forward_backward(model, x, y, spec.optim.micro_batches)
        if step == last_step and stage1_rows is not None:
            full = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
            optimizer.zero_grad(set_to_none=True)
            rows = slice(stage1_rows.start, stage1_rows.stop)
            forward_backward(model, x[rows], y[rows], spec.optim.micro_batches)
            for name, param in model.named_parameters():
                if not _in_stage1(name, stage1_start):
                    param.grad = full[name]
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _in_stage1(name: str, stage1_start: int) -> bool:
    if name.startswith("head."):
        return True
    return name.startswith("blocks.") and int(name.split(".")[1]) >= stage1_start


def test_diloco_replicas_whose_anchors_diverged_are_re_synced(tmp_path: Path) -> None:
    """sync = "diloco", 1 stage x 2 replicas, H 2: replica 1 takes part in the round of step
    `skip_step` but does not apply its mean (skip-averaging), so the anchors differ. The next
    round carries both anchors' digests: each replica sees the divergence, opens hivemind's
    averager (only now: replica_rounds.open_replicas) and averages anchors and outer momenta
    once; the rounds after it find them agreeing again."""
    skip_step = 3
    spec = TINY.replace(
        stages=1,
        steps=10,
        sync="diloco",
        inner_steps=2,
        averaging_timeout_s=5.0,
        checkpoint_dir=str(tmp_path / "c"),
    )
    _two_replicas_with_a_skip(spec, skip_step, tmp_path)
    logs = [(tmp_path / f"worker-{i}.log").read_text() for i in range(2)]
    skipped = [i for i, log in enumerate(logs) if f"outer round of step {skip_step} skipped" in log]
    assert len(skipped) == 1, skipped  # the replica-1 role's worker, whichever peer holds it
    for i, log in enumerate(logs):  # rounds of steps 1, 3, 5, 7 and 9, all over both replicas
        applied = 4 if i in skipped else 5
        assert log.count("2 replicas)") == applied, log
        assert "re-syncing failed" not in log and "not applied" not in log
        synced = [line for line in log.splitlines() if "anchors had diverged: re-synced" in line]
        # the round of step 5 (applied at step 6, or at 7 as the next round is due); once
        assert len(synced) == 1 and ("step 6:" in synced[0] or "step 7:" in synced[0]), synced


def _two_replicas_with_a_skip(spec: RunSpec, skip_step: int, tmp_path: Path) -> SwarmResult:
    """Train 1 stage x 2 replicas over real processes, replica 1 skipping its round of
    `skip_step` (skip-averaging); the swarm's result (workers' logs in tmp_path)."""
    flags = {i: Faults((Fault(SKIP_AVERAGING, skip_step, 0, 1),)).to_argv() for i in range(2)}
    with LocalSwarm(spec, 2, tmp_path, worker_flags=flags) as swarm:
        swarm.send_plan(plan_for(spec, swarm.wait_hellos()))
        result = swarm.train()
        assert swarm.wait_exit() == [0, 0]
    assert [len(p) for p in result.plan.pipelines] == [1, 1]
    return result
