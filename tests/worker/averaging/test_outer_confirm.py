"""An outer round's confirmation (worker/averaging/outer_confirm.py: `confirmed`): a member
that tells its groupmates different things (another top-k payload, or another reduced shard,
to one of them, each consistent with its own claims) cannot make honest members apply
different means; honest rounds still agree, and a confirmation that never comes drops
nothing."""

from __future__ import annotations

import threading
from concurrent.futures import Future

import pytest
import torch

from p2ptrain.worker.averaging import outer_wire as wire
from p2ptrain.worker.averaging.outer_attempt import Attempt
from p2ptrain.worker.averaging.outer_confirm import send_confirmations
from p2ptrain.worker.averaging.outer_exchange import OuterExchange
from p2ptrain.worker.averaging.stage_averager import Outcome
from tests.worker.averaging.test_outer_exchange import FAST, NUMEL, PREFIX, MemoryLink
from tests.worker.averaging.test_round_pacing import Clocks

PEERS = [f"12D3KooWPeer{c}" for c in "ABCD"]
LIAR = PEERS[0]
VICTIM = PEERS[3]
STEP = 9

_Sent = tuple[wire.RoundHeader, torch.Tensor]


class RecordingLink(MemoryLink):
    """Notes every message it sends, by (receiver, kind, shard, attempt key)."""

    def __init__(self, peer_id: str, net: dict[str, MemoryLink]) -> None:
        super().__init__(peer_id, net)
        self.sent: dict[tuple[str, str, int, str], _Sent] = {}

    def send(
        self, peer: str, header: wire.RoundHeader, payload: torch.Tensor, timeout_s: float
    ) -> Future[None]:
        self.sent[(peer, header.kind, header.shard, header.round)] = (header, payload.clone())
        return super().send(peer, header, payload, timeout_s)


class TwoFacedLink(MemoryLink):
    """Sends VICTIM the messages of another story (recorded), everyone else the real ones."""

    def __init__(self, peer_id: str, net: dict[str, MemoryLink], story: dict) -> None:
        super().__init__(peer_id, net)
        self.story = story

    def send(
        self, peer: str, header: wire.RoundHeader, payload: torch.Tensor, timeout_s: float
    ) -> Future[None]:
        other = self.story.get((peer, header.kind, header.shard, header.round))
        if peer == VICTIM and other is not None:
            header, payload = other
        return super().send(peer, header, payload, timeout_s)


def _group(codec: str, liar_link: type[MemoryLink], **liar_kw: object) -> list:
    net: dict[str, MemoryLink] = {}
    group = dict.fromkeys(PEERS, 1.0)
    for peer in PEERS:
        net[peer] = liar_link(peer, net, **liar_kw) if peer == LIAR else MemoryLink(peer, net)
    return [
        (net[p], OuterExchange(net[p], group, codec, NUMEL, PREFIX, FAST, inner_steps=1))
        for p in PEERS
    ]


def _round(group: list, grads: list[torch.Tensor]) -> dict[int, tuple[torch.Tensor, Outcome]]:
    results: dict[int, tuple[torch.Tensor, Outcome]] = {}
    anchor = torch.ones(NUMEL)

    def one(i: int) -> None:
        results[i] = group[i][1].run(grads[i], STEP, lambda: False, anchor)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(group))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


def _grads() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(5)
    base = torch.randn(NUMEL, generator=gen)
    return [base + 0.3 * torch.randn(NUMEL, generator=gen) for _ in PEERS]


@pytest.mark.parametrize("codec", ["topk", "fp16"])
def test_a_member_telling_one_groupmate_another_story_splits_no_means(codec: str) -> None:
    honest = _grads()
    # the other story: the liar's pseudo-gradient reversed, its messages consistent with it
    # (its claims match what it sends), recorded from a round of the same step and group
    recorder = _group(codec, RecordingLink)
    _round(recorder, [-honest[0], *honest[1:]])
    story = recorder[0][0].sent  # type: ignore[attr-defined]
    assert any(key[0] == VICTIM for key in story)

    results = _round(_group(codec, TwoFacedLink, story=story), honest)
    means = {
        i: mean for i, (mean, outcome) in results.items() if i > 0 and outcome.kind == "averaged"
    }
    # whoever applied a mean applied the same one: never the victim one and the others another
    firsts = list(means.values())
    assert all(torch.equal(m, firsts[0]) for m in firsts), {i: results[i][1] for i in results}
    if codec == "topk":  # the gather's story reached the victim alone: everyone noticed
        for i in (1, 2, 3):
            mean, outcome = results[i]
            assert outcome.kind == "local" and torch.equal(mean, honest[i]), outcome
            assert "combined other messages" in outcome.detail or "failed" in outcome.detail


@pytest.mark.parametrize("codec", ["topk", "int8"])
def test_an_honest_group_of_four_confirms_and_agrees(codec: str) -> None:
    group = _group(codec, MemoryLink)
    results = _round(group, _grads())
    first = results[0][0]
    for mean, outcome in results.values():
        assert outcome.kind == "averaged" and outcome.group_size == 4, outcome
        assert torch.equal(mean, first)
    # each member confirmed to each other one: 32 bytes each
    for link, _ in group:
        assert link.inbox._held == {}  # every confirmation was taken


class SilentConfirmLink(MemoryLink):
    """Sends every message but its confirmations."""

    def send(
        self, peer: str, header: wire.RoundHeader, payload: torch.Tensor, timeout_s: float
    ) -> Future[None]:
        if header.kind == wire.CONFIRM:
            done: Future[None] = Future()
            done.set_result(None)
            return done
        return super().send(peer, header, payload, timeout_s)


def test_a_withheld_confirmation_drops_no_result() -> None:
    results = _round(_group("topk", SilentConfirmLink), _grads())
    first = results[1][0]
    for mean, outcome in results.values():
        assert outcome.kind == "averaged" and outcome.group_size == 4, outcome
        assert torch.equal(mean, first)


def test_confirmation_digests_cover_the_header_and_the_payload() -> None:
    from p2ptrain.worker.averaging.checks import Checksums

    claims = Checksums(1, 1.0, 0.5, 0.25, 2.0)
    header = wire.RoundHeader("r/1/0/0123456789abcdef", wire.SPARSE, PEERS[1], 0, 3, claims)
    base = wire.message_digest(header, b"abc")
    decoded = wire.RoundHeader.decode(header.encode()[wire.HEADER_LEN.size :])
    assert wire.message_digest(decoded, b"abc") == base  # the sender's copy and a receiver's
    assert wire.message_digest(header, b"abd") != base
    other = wire.RoundHeader(
        header.round, wire.SPARSE, PEERS[1], 0, 3, Checksums(1, 1.0, 0.5, 0.25, 2.5)
    )
    assert wire.message_digest(other, b"abc") != base
    assert wire.combined_digest({"a": base, "b": base}) != wire.combined_digest({"a": base})
    assert wire.claims_disagree([{"x": claims}, {"x": claims}]) is None
    assert wire.claims_disagree([{"x": claims}, {"x": other.claims}]) is not None


def test_a_confirmation_of_another_size_is_refused_unread() -> None:
    from p2ptrain.worker.averaging.checks import Checksums
    from p2ptrain.worker.averaging.round_inbox import RoundInbox

    inbox = RoundInbox()
    inbox.admit_group(PEERS, 1 << 20)
    claims = Checksums(1, 1.0, 0.0, 0.0, 0.0)
    key = wire.round_key(PREFIX, STEP, 0, sorted(PEERS))
    big = wire.RoundHeader(key, wire.CONFIRM, PEERS[1], 0, 1 << 19, claims)
    assert inbox.screen(big, PEERS[1]) == wire.REJECTED
    # confirmations are counted apart: a sender's full payload quota leaves room for them
    for shard in range(8):
        part = wire.RoundHeader(key, wire.PART, PEERS[1], shard, 10, claims)
        assert inbox.screen(part, PEERS[1]) is None
    confirm = wire.RoundHeader(key, wire.CONFIRM, PEERS[1], 0, wire.DIGEST_BYTES, claims)
    assert inbox.screen(confirm, PEERS[1]) is None


class DroppingLink(MemoryLink):
    """Loses its payload to VICTIM (one lost message; everything else arrives)."""

    def send(
        self, peer: str, header: wire.RoundHeader, payload: torch.Tensor, timeout_s: float
    ) -> Future[None]:
        if peer == VICTIM and header.kind == wire.SPARSE:
            done: Future[None] = Future()
            done.set_result(None)
            return done
        return super().send(peer, header, payload, timeout_s)


def test_a_member_that_missed_a_message_makes_the_round_local_for_all_not_for_it_alone() -> None:
    """It fails only once its own waits are over, after the others had their result: its
    word (a confirmation of zeros) must still reach them, or they average and it stays local,
    and the replicas' anchors part until a re-sync."""
    results = _round(_group("topk", DroppingLink), _grads())
    outcomes = {i: outcome for i, (_, outcome) in results.items()}
    assert all(outcome.kind == "local" for outcome in outcomes.values()), outcomes
    assert "failed the attempt" in outcomes[1].detail


def test_confirmations_go_out_paced_in_ring_order_and_a_failure_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # every member reaches its confirmations within moments of the others: sent at once, a
    # group's confirmations were one burst of streams on every member
    clocks = Clocks(monkeypatch)
    net: dict[str, MemoryLink] = {}
    for peer in PEERS:
        net[peer] = SendTimes(peer, net, clocks)
    me = net[PEERS[1]]
    assert isinstance(me, SendTimes)
    pacer = clocks.pacer(window_s=10.0, gap_s=0.5, cpu_rate=0.0)
    this = Attempt("round", list(PEERS), STEP, 2.0, 2.0, (0.0, 1.0), lambda: False, pacer)
    send_confirmations(me, dict.fromkeys(PEERS, 1.0), this, b"\x01" * wire.DIGEST_BYTES)
    # from the member after us round the ring, the pacer's gap apart
    assert [peer for peer, _ in me.times] == [PEERS[2], PEERS[3], PEERS[0]]
    assert [t - me.times[0][1] for _, t in me.times] == pytest.approx([0.0, 0.5, 1.0])
    me.times.clear()
    send_confirmations(me, dict.fromkeys(PEERS, 1.0), this, wire.FAILED_DIGEST)
    assert len(me.times) == 3 and len({t for _, t in me.times}) == 1


class SendTimes(MemoryLink):
    """Notes to whom and when (on the test's clock) it sends."""

    def __init__(self, peer_id: str, net: dict[str, MemoryLink], clocks: Clocks) -> None:
        super().__init__(peer_id, net)
        self.clocks = clocks
        self.times: list[tuple[str, float]] = []

    def send(
        self, peer: str, header: wire.RoundHeader, payload: torch.Tensor, timeout_s: float
    ) -> Future[None]:
        self.times.append((peer, self.clocks.wall))
        return super().send(peer, header, payload, timeout_s)
