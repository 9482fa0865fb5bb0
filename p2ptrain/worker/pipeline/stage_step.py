"""One training step of one pipeline stage, GPipe schedule.

Forward every micro-batch (receive activations from the previous stage or read the batch, run the
stage, send activations on or compute the loss), then backward in reverse order (receive output
gradients or start from the loss, send input gradients back). Activations and gradients travel in
the run's wire type (fp16/bf16, int8 with an fp32 scale a row, or fp32 for exact runs: frames.py);
compute is fp32, or autocast to bf16/fp16 on a GPU (worker/device.py).

Loss scaling matches the reference trainer: micro-batch m of a replica with b rows weighs
len(m)/b, and replicas are later averaged with weight b, so the sum is the global-batch mean.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from p2ptrain.records import NetworkFacts, Role
from p2ptrain.records.run import RunSpec
from p2ptrain.train.data import get_batch, replica_rows
from p2ptrain.train.model import Stage, loss_fn
from p2ptrain.train.reference import micro_batch_rows
from p2ptrain.worker.device import FP32, Precision, sync
from p2ptrain.worker.pipeline.frames import (
    ACTIVATION,
    COMPRESSION_DTYPES,
    GRADIENT,
    AlreadyHave,
    Expected,
    FrameHeader,
    NotReady,
    PeerLost,
    Stopped,
    max_abs_of,
    payload_bytes,
)
from p2ptrain.worker.pipeline.link_bounds import RECEIVE_TIMEOUT_S, frame_waits_s

SEND_POLL_S = 0.1  # how often a wait for the step's sent frames asks whether to stop

if TYPE_CHECKING:  # the transport imports hivemind; this module stays importable without it
    from p2ptrain.worker.pipeline.transport import Transport


@dataclass
class StageTiming:
    """Seconds one step's passes computed (waits for frames left out): what the stage costs on
    this device, reported with the step (the bench's step simulation takes it)."""

    forward_s: float = 0.0  # every micro-batch's forward, with the loss on the last stage
    backward_s: float = 0.0
    forward_cpu_s: float = 0.0  # this thread's CPU seconds in those passes
    backward_cpu_s: float = 0.0
    frames: int = 0  # frames sent and received


def _computed_since(started: float, out: torch.Tensor) -> float:
    sync(out.device)  # a GPU's kernels run asynchronously: wait for them before the clock
    return time.perf_counter() - started


def wire_type(spec: RunSpec) -> str:
    """The frames' wire type (frames.WIRE_DTYPES) of the run's `compression`."""
    return COMPRESSION_DTYPES[spec.wire.compression]


def replica_batch(spec: RunSpec, role: Role) -> tuple[RunSpec, range]:
    """The batch a replica's rows index (as a spec for get_batch) and its rows. Under
    sync = "step" the replicas split one batch of `batch_size` rows; under diloco each has
    `batch_size` rows of its own: rows r·b..(r+1)·b of a batch of R·b, so a replica's data stays
    a pure function of (seed, step, replica) and adding replicas adds tokens per step."""
    if spec.optim.sync == "diloco":
        spec = spec.replace(batch_size=spec.optim.batch_size * role.num_replicas)
    return spec, replica_rows(spec.optim.batch_size, role.num_replicas, role.replica)


def replica_weights(spec: RunSpec, role: Role) -> dict[str, float]:
    """Each replica of the stage (by peer) with its weight in averaging: its rows of the step."""
    return {
        peer: float(len(replica_batch(spec, dataclasses.replace(role, replica=i))[1]))
        for i, peer in enumerate(role.stage_peers)
    }


def micro_shapes(spec: RunSpec, role: Role) -> list[tuple[int, int, int]]:
    """Shape of the activation (= gradient) tensor of each micro-batch at a stage boundary."""
    _, rows = replica_batch(spec, role)
    return [
        (len(m), spec.model.block_size, spec.model.n_embd)
        for m in micro_batch_rows(len(rows), spec.optim.micro_batches)
    ]


def hop_waits_s(
    spec: RunSpec, role: Role, network: NetworkFacts | None
) -> dict[str, tuple[float, float]]:
    """Neighbour -> (receive, send) bounds of its frames, from the hop between us as the plan
    states it (worker/pipeline/link_bounds.py)."""
    wire = wire_type(spec)
    frame_bytes = max((payload_bytes(wire, s) for s in micro_shapes(spec, role)), default=0)
    return {
        peer: frame_waits_s(
            None if network is None else network.hop(role.replica, role.stage + offset),
            frame_bytes,
        )
        for peer, offset in ((role.prev_peer, -1), (role.next_peer, 0))  # the hop before us, after
        if peer is not None
    }


def expected_frame(
    spec: RunSpec, role: Role, current_step: int, kind: str, step: int, micro: int
) -> Expected | None:
    """What this stage accepts for (kind, step, micro) while working on `current_step`."""
    shapes = micro_shapes(spec, role)
    if not 0 <= micro < len(shapes):
        return None
    if kind == ACTIVATION and role.prev_peer and current_step <= step <= current_step + 1:
        sender = role.prev_peer  # the previous stage may run one step ahead of us
    elif kind == GRADIENT and role.next_peer and step == current_step:
        sender = role.next_peer
    else:
        return None
    wire, max_abs = wire_type(spec), max_abs_of(kind, spec.optim.loss_scale)
    return Expected(kind, spec.run_id, role.term, role.epoch, sender, wire, shapes[micro], max_abs)


def accepted_frame(
    spec: RunSpec, role: Role, current_step: int, start_step: int, header: FrameHeader
) -> Expected | None:
    """What an incoming frame is to a stage working on `current_step` of a session that
    started at `start_step`: Expected, None (not ours), NotReady (a step ahead: a neighbour
    resumed from a later checkpoint, or we are slow) or AlreadyHave (a retried copy)."""
    if header.step > current_step + 1:
        raise NotReady()
    expected = expected_frame(spec, role, current_step, header.kind, header.step, header.micro)
    if expected is None and header.step < current_step:
        # from the right neighbour for an earlier step of this session: a retried copy
        earlier = expected_frame(spec, role, header.step, header.kind, header.step, header.micro)
        if (
            earlier is not None
            and earlier.sender == header.sender
            and (header.term, header.epoch) == role.plan_key
            and start_step <= header.step
        ):
            raise AlreadyHave()
    return expected


def run_step(
    model: Stage,
    spec: RunSpec,
    role: Role,
    transport: Transport | None,
    corpus: torch.Tensor | None,
    step: int,
    should_stop: Callable[[], bool],
    network: NetworkFacts | None = None,
    timing: StageTiming | None = None,
    precision: Precision = FP32,
) -> float | None:
    """Accumulate this stage's gradients for `step`; the replica's mean loss on the last stage.
    network: the plan's, whose hops bound the frame waits; timing: gets the passes' seconds;
    precision: the autocast of the passes (worker/device.py). The model's device is where the
    passes run: frames arrive on the CPU and go there, and leave from the CPU."""
    timing = timing if timing is not None else StageTiming()
    device = next(model.parameters()).device
    data_spec, rows = replica_batch(spec, role)
    micro = micro_batch_rows(len(rows), spec.optim.micro_batches)
    x = y = None
    if corpus is not None:
        x, y = (t.to(device) for t in get_batch(corpus, data_spec, step, rows))
    wire = wire_type(spec)
    sends: list[Future[None]] = []
    waits = hop_waits_s(spec, role, network)

    def send(peer: str | None, tensor: torch.Tensor, kind: str, m: int) -> None:
        assert transport is not None and peer is not None
        timing.frames += 1
        sends.append(
            transport.send(
                peer, tensor, kind, spec.run_id, role.plan_key, step, m, waits[peer][1], wire
            )
        )

    def stop_waiting() -> bool:
        _raise_failed_send(sends)  # a lost frame of ours means the answer will never come
        return should_stop()

    def receive(kind: str, m: int) -> torch.Tensor:
        assert transport is not None
        sender = role.prev_peer if kind == ACTIVATION else role.next_peer
        wait_s = waits[sender][0] if sender in waits else RECEIVE_TIMEOUT_S
        frame = transport.inbox.take(
            role.plan_key, kind, step, m, wait_s, stop_waiting, sender or ""
        )
        timing.frames += 1
        return frame.to(device, torch.float32)

    inputs: list[torch.Tensor] = []
    outputs: list[torch.Tensor] = []
    loss_total = 0.0
    for m, m_rows in enumerate(micro):
        if role.is_first:
            assert x is not None
            inp = x[m_rows.start : m_rows.stop]
        else:
            inp = receive(ACTIVATION, m).requires_grad_()
        started, cpu = time.perf_counter(), time.thread_time()
        with precision.passes():
            out = model(inp)
        if role.is_last:
            assert y is not None
            # the loss in fp32 whatever the passes' dtype
            loss = loss_fn(out.float(), y[m_rows.start : m_rows.stop]) * (len(m_rows) / len(rows))
            loss_total += loss.item()
            # scaled for backward: every stage's gradients (and the frames between them) carry
            # the run's loss_scale, which each stage divides out of its own (unscale_grads)
            out = loss * spec.optim.loss_scale if spec.optim.loss_scale != 1.0 else loss
        else:
            out = out.float()  # frames, and the gradient that comes back, are fp32 on our side
        timing.forward_s += _computed_since(started, out)
        timing.forward_cpu_s += time.thread_time() - cpu
        if not role.is_last:
            send(role.next_peer, out.detach(), ACTIVATION, m)
        inputs.append(inp)
        outputs.append(out)

    for m in reversed(range(len(micro))):
        upstream = None if role.is_last else receive(GRADIENT, m)
        started, cpu = time.perf_counter(), time.thread_time()
        outputs[m].backward(upstream)
        timing.backward_s += _computed_since(started, outputs[m])
        timing.backward_cpu_s += time.thread_time() - cpu
        if not role.is_first:
            grad = inputs[m].grad
            assert grad is not None
            send(role.prev_peer, grad, GRADIENT, m)

    wait_sends(sends, max([RECEIVE_TIMEOUT_S, *(w[0] for w in waits.values())]), should_stop)
    return loss_total if role.is_last else None


def wait_sends(
    sends: list[Future[None]], timeout_s: float, should_stop: Callable[[], bool]
) -> None:
    """Until the step's frames are accepted: PeerLost if one is not within timeout_s, Stopped
    as soon as should_stop() holds. A worker re-planned (or stopped) while its last frame waited
    on a busy neighbour sat out the whole send deadline, a minute, and held up the next plan."""
    deadline = time.monotonic() + timeout_s
    for future in sends:
        while True:
            try:
                future.result(timeout=SEND_POLL_S)
                break
            except PeerLost:
                raise
            except TimeoutError:
                if should_stop():
                    raise Stopped() from None
                if time.monotonic() > deadline:
                    raise PeerLost(f"send did not finish in {timeout_s:.0f} s") from None
            except Exception as exc:  # p2pd's own failures
                raise PeerLost(f"send did not finish: {exc!r}") from exc


def warm_up(model: Stage, spec: RunSpec, role: Role, precision: Precision = FP32) -> None:
    """The stage's passes, twice, on zeros of its micro-batches' shapes, their gradients then
    dropped (nothing else changes: no update, no random draw). A step's first allocations
    fault in their pages (16 K on the default model at 16 rows, most of it in the first two
    steps): paid here, not in steps 0 and 1, which took 1.3-1.6x the median step on a
    1/8-core worker (bench scaleout)."""
    device = next(model.parameters()).device
    config, (_, rows) = model.config, replica_batch(spec, role)
    for _ in range(2):
        for m_rows in micro_batch_rows(len(rows), spec.optim.micro_batches):
            shape = (len(m_rows), config.block_size)
            if role.is_first:
                inp = torch.zeros(shape, dtype=torch.long, device=device)
            else:
                inp = torch.zeros((*shape, config.n_embd), device=device, requires_grad=True)
            with precision.passes():
                out = model(inp)
            if role.is_last:
                loss_fn(out.float(), torch.zeros(shape, dtype=torch.long, device=device)).backward()
            else:
                out.float().backward(torch.zeros(out.shape, device=device))
    model.zero_grad(set_to_none=True)


def unscale_grads(model: Stage, spec: RunSpec) -> None:
    """Divide the run's loss_scale out of this stage's gradients (after run_step's backward)."""
    if spec.optim.loss_scale == 1.0:
        return
    for param in model.parameters():
        if param.grad is not None:
            param.grad.div_(spec.optim.loss_scale)


def _raise_failed_send(sends: list[Future[None]]) -> None:
    for future in sends:
        if future.done() and future.exception() is not None:
            raise PeerLost(str(future.exception()))
