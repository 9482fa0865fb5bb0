"""After a re-plan, a stage never trains on a frame that a neighbour of the old plan sent
(worker/pipeline/frame_inbox.py).

The case of an 8-peer WAN run: under plan epoch 2, peer 6 held stage 2 of replica 1 and accepted
the step-4 activations of its previous stage, peer 5. The swarm re-planned and re-ran from step 3;
under epoch 3 peer 6 held stage 3 of replica 1, behind peer 2. At step 4 it took the activations
peer 5 had sent under epoch 2 (the inbox was keyed by kind, step and micro-batch only), computed
a loss on them, and sent its gradient of step 4 back to peer 2, which was still averaging step 3
and had sent no activation of step 4 yet: refused, and the replica's pipeline stalled for 120 s.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from typing import Any, cast

import pytest
import torch

from p2ptrain.records import Plan, Role, RunSpec
from p2ptrain.train.data import get_batch, replica_rows
from p2ptrain.train.model import build_stage, loss_fn
from p2ptrain.train.reference import micro_batch_rows
from p2ptrain.worker.pipeline import frames, stage_step
from p2ptrain.worker.pipeline.frame_inbox import FrameInbox, PlanKey
from p2ptrain.worker.pipeline.frames import ACTIVATION, GRADIENT, FrameHeader, PeerLost, Stopped

SPEC = RunSpec().replace(
    stages=4,
    n_layer=4,
    n_head=2,
    n_embd=32,
    block_size=16,
    batch_size=8,
    micro_batches=2,
    compression="none",
)
PEERS = [f"peer-{i}" for i in range(8)]
PEER_2_LATE_S = 1.5  # how long after the step starts peer 2's activations arrive


def plan(epoch: int, pipelines: list[list[int]]) -> Plan:
    return Plan.from_dict(
        {
            "term": 1,
            "epoch": epoch,
            "planner": PEERS[5],
            "stages": 4,
            "pipelines": [[PEERS[i] for i in p] for p in pipelines],
            "spares": [],
            "data_addrs": {},
            "cost_s": 0.0,
        }
    )


EPOCH_2 = plan(2, [[1, 0, 3, 2], [4, 5, 6, 7]])
EPOCH_3 = plan(3, [[5, 1, 0, 7], [4, 3, 2, 6]])


def role(p: Plan, peer: int) -> Role:
    r = p.role_of(PEERS[peer])
    assert r is not None
    return r


def accept(
    inbox: FrameInbox, receiver: Role, step_now: int, header: FrameHeader, tensor: torch.Tensor
) -> None:
    """What the transport's handler does: the receiver's expectation checks the header, then
    the frame is filed."""
    expected = stage_step.expected_frame(
        SPEC, receiver, step_now, header.kind, header.step, header.micro
    )
    assert frames.check_header(header, header.sender, expected) is None
    payload = frames.encode_payload(tensor, header.dtype, header.scale_exp)  # as sent
    inbox.put(header, frames.decode_tensor(header, bytes(frames.tensor_bytes(payload))))


def activations(
    sender: int, p: Plan, step: int, seed: int
) -> list[tuple[FrameHeader, torch.Tensor]]:
    shapes = stage_step.micro_shapes(SPEC, role(p, 6))
    generator = torch.Generator().manual_seed(seed)
    out = []
    for micro, shape in enumerate(shapes):
        tensor = torch.randn(shape, generator=generator)
        header = frames.header_for(
            tensor, ACTIVATION, SPEC.run_id, p.key, step, micro, PEERS[sender]
        )
        out.append((header, tensor))
    return out


def inbox_after_epoch_2() -> FrameInbox:
    """Peer 6's inbox once its epoch-2 session accepted peer 5's step-4 activations."""
    inbox = FrameInbox()
    for header, tensor in activations(5, EPOCH_2, 4, seed=2):
        accept(inbox, role(EPOCH_2, 6), 4, header, tensor)
    return inbox


class FakeTransport:
    """The trainer's side of worker/pipeline/transport.py over a FrameInbox: sends are recorded."""

    def __init__(self, inbox: FrameInbox) -> None:
        self.inbox = inbox
        self.sent: list[tuple[str, FrameHeader]] = []

    def send(
        self,
        peer: str,
        tensor: torch.Tensor,
        kind: str,
        run_id: str,
        plan: PlanKey,
        step: int,
        micro: int,
        timeout_s: float,
        wire: str,
    ) -> Future[None]:
        header = frames.header_for(tensor, kind, run_id, plan, step, micro, "me", wire)
        self.sent.append((peer, header))
        done: Future[None] = Future()
        done.set_result(None)
        return done


def test_the_new_plan_never_takes_a_frame_of_the_old_one() -> None:
    inbox = inbox_after_epoch_2()
    new = role(EPOCH_3, 6)
    assert (new.prev_peer, new.is_last) == (PEERS[2], True)
    with pytest.raises(PeerLost, match="no act for step 4 micro-batch 0"):
        inbox.take(new.plan_key, ACTIVATION, 4, 0, 0.3, lambda: False)
    # peer 2's activation of step 4 under epoch 3 is the one handed over
    (header, tensor), _ = activations(2, EPOCH_3, 4, seed=3)
    accept(inbox, new, 4, header, tensor)
    assert torch.equal(inbox.take(new.plan_key, ACTIVATION, 4, 0, 1.0, lambda: False), tensor)


def test_a_new_session_drops_the_old_plans_frames_and_keeps_its_own() -> None:
    inbox = inbox_after_epoch_2()
    new = role(EPOCH_3, 6)
    for header, tensor in activations(2, EPOCH_3, 3, seed=3):
        accept(inbox, new, 3, header, tensor)
    assert len(inbox) == 4
    inbox.forget(new.plan_key, 3)  # what Session.train does first
    assert len(inbox) == 2
    inbox.forget(new.plan_key, 4)  # and after each step
    assert len(inbox) == 0


def test_a_frame_of_another_term_with_the_same_epoch_is_refused() -> None:
    new = role(EPOCH_3, 6)
    (header, _), _ = activations(2, EPOCH_3.replace(term=2), 4, seed=3)
    expected = stage_step.expected_frame(SPEC, new, 4, ACTIVATION, 4, 0)
    assert "term" in (frames.check_header(header, PEERS[2], expected) or "")


def test_the_last_stage_waits_for_its_new_neighbour_instead_of_training_on_stale_inputs() -> None:
    """The real pipeline step of the last stage, under epoch 3 at step 4, with peer 5's epoch-2
    activations in the inbox: it sends nothing until peer 2's activations arrive, then trains on
    those."""
    new = role(EPOCH_3, 6)
    torch.manual_seed(0)
    model = build_stage(SPEC, new.stage, new.num_stages)
    corpus = torch.randint(0, SPEC.model.vocab_size, (4096,))
    transport = FakeTransport(inbox_after_epoch_2())
    fresh = activations(2, EPOCH_3, 4, seed=3)

    sent_before: list[Any] = []

    def peer_2_sends_later() -> None:
        time.sleep(PEER_2_LATE_S)
        sent_before.extend(transport.sent)  # (asserted by the test's own thread)
        for header, tensor in fresh:
            accept(transport.inbox, new, 4, header, tensor)

    sender = threading.Thread(target=peer_2_sends_later)
    sender.start()
    timing = stage_step.StageTiming()
    loss = stage_step.run_step(
        model, SPEC, new, cast(Any, transport), corpus, 4, lambda: False, timing=timing
    )
    sender.join()
    assert sent_before == []  # nothing went out on the stale frames
    # the passes' compute is timed without the wait for peer 2's frames (a pass takes 0.01-0.1 s
    # of CPU; its wall time on a box with more busy threads than cores reached 0.56-0.87 s)
    assert 0 < timing.forward_s < PEER_2_LATE_S and 0 < timing.backward_s < PEER_2_LATE_S
    assert [(peer, h.kind, h.step, h.micro, (h.term, h.epoch)) for peer, h in transport.sent] == [
        (PEERS[2], GRADIENT, 4, 1, (1, 3)),
        (PEERS[2], GRADIENT, 4, 0, (1, 3)),
    ]
    # the loss is the one of peer 2's activations
    rows = replica_rows(SPEC.optim.batch_size, new.num_replicas, new.replica)
    _, targets = get_batch(corpus, SPEC, 4, rows)
    with torch.no_grad():
        expected = sum(
            float(loss_fn(model(tensor), targets[m.start : m.stop])) * len(m) / len(rows)
            for m, (_, tensor) in zip(
                micro_batch_rows(len(rows), SPEC.optim.micro_batches), fresh, strict=True
            )
        )
    assert loss == pytest.approx(expected, rel=1e-6)


def test_with_only_the_old_plans_frames_the_step_ends_without_sending() -> None:
    new = role(EPOCH_3, 6)
    model = build_stage(SPEC, new.stage, new.num_stages)
    transport = FakeTransport(inbox_after_epoch_2())
    corpus = torch.randint(0, SPEC.model.vocab_size, (4096,))
    stop_at = time.monotonic() + 0.5
    with pytest.raises(Stopped):
        stage_step.run_step(
            model, SPEC, new, cast(Any, transport), corpus, 4, lambda: time.monotonic() > stop_at
        )
    assert transport.sent == []
