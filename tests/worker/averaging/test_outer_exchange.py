"""Outer rounds over our own exchange (worker/averaging/outer_exchange.py), members in threads
joined by an in-memory link: the result is the weighted mean within the codec's error, every
member holds the same bytes, the wire carries the codec's bytes, a dead member does not block
the others past the timeouts, and a lying member fails the round."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from dataclasses import replace

import pytest
import torch

from p2ptrain.errors import WireError
from p2ptrain.train import codecs
from p2ptrain.worker.averaging import outer_wire as wire
from p2ptrain.worker.averaging.checks import Checksums
from p2ptrain.worker.averaging.outer_exchange import (
    SEND_SHARE,
    ExchangeTimeouts,
    OuterExchange,
    paced_sends,
)
from p2ptrain.worker.averaging.round_inbox import RoundInbox
from p2ptrain.worker.averaging.stage_averager import Outcome

PEERS = [f"12D3KooWPeer{c}" for c in "ABC"]
NUMEL = 10_000
FAST = ExchangeTimeouts(join_s=2.0, transfer_s=2.0, retry_s=1.0)
PREFIX = "run/1/1/0"


class MemoryLink:
    """Delivers into the other members' inboxes at once; a dead member's link drops all."""

    def __init__(self, peer_id: str, net: dict[str, MemoryLink]) -> None:
        self.peer_id, self.net = peer_id, net
        self.inbox = RoundInbox()
        self.dead = False
        self.bytes_sent = 0
        self.payload_bytes_sent = 0

    def send(
        self, peer: str, header: wire.RoundHeader, payload: torch.Tensor, timeout_s: float
    ) -> Future[None]:
        done: Future[None] = Future()
        target = self.net[peer]
        if not self.dead and not target.dead:
            data = payload.numpy().tobytes()
            self.bytes_sent += len(header.encode()) + len(data)
            self.payload_bytes_sent += len(data)
            if target.inbox.screen(header, self.peer_id) is None:
                target.inbox.put(header, data)
        done.set_result(None)
        return done


def members(
    num: int, codec: str, weights: list[float] | None = None
) -> list[tuple[MemoryLink, OuterExchange]]:
    net: dict[str, MemoryLink] = {}
    group = dict(zip(PEERS[:num], weights or [1.0] * num, strict=True))
    out = []
    for peer in PEERS[:num]:
        net[peer] = MemoryLink(peer, net)
    for peer in PEERS[:num]:
        out.append(
            (net[peer], OuterExchange(net[peer], group, codec, NUMEL, PREFIX, FAST, inner_steps=1))
        )
    return out


def run_round(
    group: list[tuple[MemoryLink, OuterExchange]],
    grads: list[torch.Tensor],
    skip: set[int] = frozenset(),  # type: ignore[assignment]
    step: int = 9,
    spread_s: float = 0.0,
    cpu_rate: float = 0.0,
) -> dict[int, tuple[torch.Tensor, Outcome, float]]:
    results: dict[int, tuple[torch.Tensor, Outcome, float]] = {}
    anchor = torch.ones(NUMEL)

    def one(i: int) -> None:
        started = time.monotonic()
        run = group[i][1].run
        mean, outcome = run(grads[i], step, lambda: False, anchor, spread_s, cpu_rate)
        results[i] = (mean, outcome, time.monotonic() - started)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(group)) if i not in skip]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return results


def grads(num: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    base = torch.randn(NUMEL, generator=gen)
    return [base + 0.3 * torch.randn(NUMEL, generator=gen) for _ in range(num)]


@pytest.mark.parametrize("codec", ["fp16", "int8"])
@pytest.mark.parametrize("num", [2, 3])
def test_dense_round_gives_every_member_the_same_weighted_mean(codec: str, num: int) -> None:
    weights = [1.0, 3.0, 2.0][:num]
    group = members(num, codec, weights)
    g = grads(num)
    results = run_round(group, g)
    want = sum(w * x for w, x in zip(weights, g, strict=True)) / sum(weights)
    first = results[0][0]
    for mean, outcome, _ in results.values():
        assert outcome.kind == "averaged" and outcome.group_size == num, outcome
        assert torch.equal(mean, first)  # bit for bit: one reducer's bytes per shard
    error = float((first - want).norm() / want.norm())
    assert error < (2e-3 if codec == "fp16" else 2e-2)


class TimedLink(MemoryLink):
    """A MemoryLink that notes when each send left."""

    def __init__(self, peer_id: str, net: dict[str, MemoryLink]) -> None:
        super().__init__(peer_id, net)
        self.sent_at: list[float] = []
        self.sent_to: list[str] = []

    def send(
        self, peer: str, header: wire.RoundHeader, payload: torch.Tensor, timeout_s: float
    ) -> Future[None]:
        self.sent_at.append(time.monotonic())
        self.sent_to.append(peer)
        return super().send(peer, header, payload, timeout_s)


def timed_members(codec: str) -> list[tuple[TimedLink, OuterExchange]]:
    net: dict[str, MemoryLink] = {}
    group = {peer: 1.0 for peer in PEERS}
    links = [TimedLink(peer, net) for peer in PEERS]
    net.update({link.peer_id: link for link in links})
    return [
        (link, OuterExchange(link, group, codec, NUMEL, PREFIX, FAST, inner_steps=1))
        for link in links
    ]


@pytest.mark.parametrize("codec", ["int8", "topk"])
def test_a_spread_round_paces_its_sends_and_still_agrees(codec: str) -> None:
    """spread_s: our sends go one at a time (the daemon that carries them shares the passes'
    CPU), within the timeouts' bound, and the round's result is the same."""
    exchanges = timed_members(codec)
    spread_s = 0.8  # within min(join_s, transfer_s) / 2 = 1.0
    results = run_round(exchanges, grads(3), spread_s=spread_s)  # type: ignore[arg-type]
    first = results[0][0]
    for mean, outcome, _ in results.values():
        assert outcome.kind == "averaged" and outcome.group_size == 3, outcome
        assert torch.equal(mean, first)
    gap_s = SEND_SHARE * spread_s / paced_sends(len(PEERS))
    for link, _ in exchanges:
        gaps = [b - a for a, b in zip(link.sent_at, link.sent_at[1:], strict=False)]
        # each kind's second send waits the gap (dense: parts, reduced shards, confirmations)
        assert max(gaps) >= 0.9 * gap_s
    # a ring: every member's first message goes to a different member
    assert len({link.sent_to[0] for link, _ in exchanges}) == len(exchanges)
    unpaced = members(3, codec)
    again = run_round(unpaced, grads(3))
    assert all(torch.equal(again[i][0], results[i][0]) for i in results)


def test_a_rounds_own_cpu_is_paced_but_never_past_its_window() -> None:
    """cpu_rate: each piece of the round's work is followed by a pause that spans its CPU at
    that rate (round_pacing.py), cut at the window's end: at a rate far below what the work
    needs, the first send waits until about the window's end, and the round still agrees."""
    exchanges = timed_members("int8")
    spread_s = 0.8
    began = time.monotonic()
    results = run_round(exchanges, grads(3), spread_s=spread_s, cpu_rate=1e-6)  # type: ignore[arg-type]
    for mean, outcome, _ in results.values():
        assert outcome.kind == "averaged" and torch.equal(mean, results[0][0]), outcome
    for link, _ in exchanges:
        assert min(link.sent_at) - began >= 0.9 * spread_s
        assert max(link.sent_at) - began < spread_s + 1.0  # past the window: at once


def test_topk_gather_applies_error_feedback_and_agrees() -> None:
    group = members(3, "topk")
    g = grads(3)
    results = run_round(group, g)
    first = results[0][0]
    for mean, outcome, _ in results.values():
        assert outcome.kind == "averaged" and outcome.group_size == 3
        assert torch.equal(mean, first)
    # what was not sent stays with each replica for the next round
    for (_, exchange), x in zip(group, g, strict=True):
        assert exchange.topk is not None
        assert float(exchange.topk.residual.norm()) > 0.5 * float(x.norm())
    assert 0 < int((first != 0).sum()) <= 3 * codecs.topk_count(codecs.TOPK_CHUNK, 0.03) * 3


def test_the_wire_shrinks_by_the_codec_factor() -> None:
    sent = {}
    for codec in ("fp16", "int8", "topk"):
        group = members(2, codec)
        run_round(group, grads(2))
        sent[codec] = sum(link.payload_bytes_sent for link, _ in group)
        headers = sum(link.bytes_sent - link.payload_bytes_sent for link, _ in group)
        assert headers < 4000  # a few hundred bytes a message, whatever the stage's size
    # fp16: each member sends half its vector and gets half back: 2 B a value over the pair
    assert sent["fp16"] == 2 * NUMEL * 2
    # int8 in blocks of 256 (a shard's last block padded): about half of fp16
    assert sent["int8"] == 4 * wire.dense_bytes("int8", NUMEL // 2)
    assert sent["fp16"] / sent["int8"] > 1.9
    # top-k 3%: each member's whole payload to the other, 0.05 B a value
    assert sent["topk"] == 2 * codecs.topk_payload_bytes(NUMEL, 0.03)
    assert sent["fp16"] / sent["topk"] > 30


def test_a_dead_member_does_not_block_the_others() -> None:
    group = members(3, "int8")
    group[2][0].dead = True
    results = run_round(group, grads(3), skip={2})
    assert set(results) == {0, 1}
    for _, outcome, took_s in results.values():
        # the first attempt waits join_s for the dead one, the second runs without it
        assert outcome.kind == "averaged" and outcome.group_size == 2, outcome
        assert "no part from" in outcome.detail
        assert took_s < FAST.join_s + FAST.transfer_s + FAST.retry_s + 2
    assert torch.equal(results[0][0], results[1][0])


def test_a_lone_survivor_keeps_its_own_pseudo_gradient() -> None:
    group = members(2, "fp16")
    group[1][0].dead = True
    g = grads(2)
    results = run_round(group, g, skip={1})
    mean, outcome, took_s = results[0]
    assert outcome.kind == "local" and torch.equal(mean, g[0])
    assert took_s < FAST.join_s + FAST.transfer_s + 2


def test_a_part_with_a_huge_norm_fails_the_round_everywhere() -> None:
    group = members(3, "fp16")
    g = grads(3)
    g[2] = g[2] * 1e3  # a liar (or a broken replica): the centred clip catches it
    results = run_round(group, g)
    assert {outcome.kind for _, outcome, _ in results.values()} == {"local"}


def test_diverged_anchors_are_reported() -> None:
    group = members(2, "fp16")
    g = grads(2)
    results: dict[int, Outcome] = {}

    def one(i: int, anchor: torch.Tensor) -> None:
        results[i] = group[i][1].run(g[i], 4, lambda: False, anchor)[1]

    threads = [
        threading.Thread(target=one, args=(0, torch.ones(NUMEL))),
        threading.Thread(target=one, args=(1, torch.ones(NUMEL) * 1.5)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert all(o.kind == "averaged" and o.diverged for o in results.values())


def test_messages_from_strangers_or_oversized_are_not_read() -> None:
    inbox = RoundInbox()
    inbox.admit_group(PEERS[:2], 1000)
    key = wire.round_key(PREFIX, 9, 0, PEERS[:2])
    sent = wire.RoundHeader(key, wire.PART, PEERS[0], 1, 10, Checksums(1, 1.0, 0.0, 0.0, 1.0))
    header = wire.RoundHeader.decode(sent.encode()[wire.HEADER_LEN.size :])
    assert header == sent
    assert inbox.screen(header, PEERS[0]) is None
    assert inbox.screen(header, PEERS[1]) == wire.BUSY  # not the sender the header names
    assert inbox.screen(replace(header, num_bytes=10_000), PEERS[0]) == wire.REJECTED
    assert inbox.screen(replace(header, sender=PEERS[2]), PEERS[2]) == wire.BUSY  # a stranger
    assert inbox.screen(header, PEERS[0]) == wire.BUSY  # a copy is being read: retry later
    inbox.put(header, b"x" * 10)
    assert inbox.screen(header, PEERS[0]) == wire.ACCEPTED  # a retried copy: the first stays


@pytest.mark.parametrize(
    "raw",
    [b"", b"[]", b"{}", b'{"round": 1}', b"\xff", b'{"round":"k","kind":"x","sender":"a"}'],
)
def test_hostile_headers_raise_wire_error(raw: bytes) -> None:
    with pytest.raises(WireError):
        wire.RoundHeader.decode(raw)


def test_a_round_forgets_its_own_and_strangers_keys_not_its_sibling_fragments() -> None:
    """After the round of step 9 of fragment `s/0`, the inbox keeps later rounds' messages
    and every round of the stage's other fragment (the last step runs them one after the
    other, and a faster groupmate's may already be in), nothing of older plans."""
    members = ["a", "b"]
    keep = wire.kept_after("run/1/1/0", 9, ["run/1/1/0.1"], max_ahead=30)
    assert keep(wire.round_key("run/1/1/0", 10, 0, members))
    assert not keep(wire.round_key("run/1/1/0", 9, 1, members))
    assert not keep(wire.round_key("run/1/1/0", 3, 0, members))
    assert keep(wire.round_key("run/1/1/0.1", 9, 0, members))
    assert keep(wire.round_key("run/1/1/0.1", 4, 0, members))
    assert not keep(wire.round_key("run/0/1/0", 12, 0, members))  # an older plan's
    assert not keep(wire.round_key("run/1/1/0.10", 12, 0, members))  # not a sibling
    assert keep(wire.round_key("run/1/1/0", 39, 0, members))
    assert not keep(wire.round_key("run/1/1/0", 40, 0, members))  # past the window: never run
    assert not keep(wire.round_key("run/1/1/0.1", 40, 0, members))


def test_a_failed_topk_round_leaves_the_error_feedback_as_it_was() -> None:
    """The anchor stays after a failed round, so the next pseudo-gradient holds its movement
    again: a residual moved by the failed round counted it twice (ten failures, then a round
    that passed, left the anchor 3.8x its target's length off)."""
    group = members(2, "topk")
    exchange = group[0][1]
    assert exchange.topk is not None
    exchange.topk.residual += 0.25  # what earlier rounds left out
    before = exchange.topk.residual.clone()
    group[1][0].dead = True
    for _ in range(2):
        results = run_round(group, grads(2), skip={1})
        assert results[0][1].kind == "local"
        assert torch.equal(exchange.topk.residual, before)
