"""OuterRounds with our exchange (worker/averaging/outer_exchange.py), two replicas in threads
over an in-memory link: they end the run with identical parameters, and a round that is not
ready at its step does not hold the step up."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import pytest
import torch

from p2ptrain.records import RunSpec
from p2ptrain.train.model import build_layers
from p2ptrain.train.optim import make_optimizer
from p2ptrain.train.outer import fragment_spans
from p2ptrain.worker.averaging.outer_exchange import OuterExchange
from p2ptrain.worker.averaging.outer_rounds import OuterRounds
from p2ptrain.worker.averaging.stage_averager import Outcome
from tests.worker.averaging.test_outer_exchange import FAST, PEERS, MemoryLink
from tests.worker.averaging.test_outer_rounds import SPEC, flat, inner_step


@dataclass
class Pair:
    """What each of two replicas ended a run with."""

    finals: dict[int, torch.Tensor] = field(default_factory=dict)
    kinds: dict[int, list[str]] = field(default_factory=lambda: {0: [], 1: []})
    outer_steps: dict[int, int] = field(default_factory=dict)
    opened: dict[int, list[int]] = field(default_factory=lambda: {0: [], 1: []})


def run_pair(spec: RunSpec, skip: int | None = None) -> Pair:
    """Two replicas over the in-memory link for the whole run; replica 1 skips (does not
    apply) the round it starts after step `skip`. `opened`: the rounds (by outer steps done)
    at which each replica asked to open the anchors' re-sync."""
    fragments = spec.optim.outer_fragments
    net: dict[str, MemoryLink] = {}
    for peer in PEERS[:2]:
        net[peer] = MemoryLink(peer, net)
    group = dict.fromkeys(PEERS[:2], 1.0)
    pair = Pair()

    def replica(i: int) -> None:
        stage = build_layers(spec, range(0, spec.model.n_layer))
        optimizer = make_optimizer(stage, spec)
        numel = sum(p.numel() for p in stage.parameters())
        spans = fragment_spans(numel, fragments)
        prefixes = [f"r/1/1/0.{f}" for f in range(fragments)]
        exchanges = []
        for (start, end), prefix in zip(spans, prefixes, strict=True):
            exchange = OuterExchange(
                net[PEERS[i]],
                group,
                "int8",
                end - start,
                prefix,
                FAST,
                inner_steps=spec.optim.inner_steps,
            )
            exchange.siblings = tuple(p for p in prefixes if p != prefix)
            exchanges.append(exchange)

        def open_averager() -> None:  # no hivemind here: the request is what is tested
            pair.opened[i].append(rounds.outer_steps)

        rounds = OuterRounds(
            spec,
            0,
            1,
            stage,
            open_averager=open_averager,
            exchanges=exchanges,
            skips_round=lambda step: i == 1 and step == skip,
        )
        for step in range(spec.optim.steps):
            inner_step(stage, optimizer, seed=100 * i + step)  # each replica its own batches
            report = rounds.after_step(step, lambda: False)
            if report is not None:
                pair.kinds[i].append(report.kind)
        rounds.close()
        pair.finals[i] = flat(stage)
        pair.outer_steps[i] = rounds.outer_steps

    threads = [threading.Thread(target=replica, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return pair


@pytest.mark.parametrize("fragments", [1, 2])
def test_two_replicas_end_the_run_with_identical_parameters(fragments: int) -> None:
    pair = run_pair(SPEC.replace(outer_compression="int8", outer_fragments=fragments))
    assert torch.equal(pair.finals[0], pair.finals[1])
    # every round applied (some at a later step than due, when a replica was behind); the
    # count follows the first fragment, whose rounds are every H steps and after the last
    assert pair.outer_steps == {0: 3, 1: 3}
    assert "local" not in pair.kinds[0] + pair.kinds[1]
    assert pair.opened == {0: [], 1: []}  # the anchors never differed: no re-sync opened


def test_a_skipped_round_shows_in_the_next_rounds_digests_on_both_replicas(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Replica 1 does not apply the round of step 3 (H 4): its anchor is left behind, and the
    round of step 7 tells both replicas (they see the same digests), so both ask for the
    re-sync as they apply it, neither earlier. Here nothing re-syncs (no averager), so the
    last round finds them apart again."""
    pair = run_pair(SPEC.replace(outer_compression="int8"), skip=3)
    assert caplog.text.count("outer round of step 3 skipped") == 1
    assert pair.outer_steps == {0: 3, 1: 2}  # replica 1 applied one round fewer
    # asked while applying the round of step 7: after 1 outer step on replica 1, 2 on 0
    assert pair.opened[0][0] == 2 and pair.opened[1][0] == 1, pair.opened
    assert not torch.equal(pair.finals[0], pair.finals[1])


class SlowExchange:
    """An exchange whose round ends only when the test says so."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def run(
        self,
        delta: torch.Tensor,
        step: int,
        should_stop: object,
        anchor: object,
        spread_s: float = 0.0,
        cpu_rate: float = 0.0,
    ) -> object:
        self.release.wait(30)
        return torch.zeros_like(delta), Outcome("averaged", 2)

    def keep_feedback(self) -> None:  # no error feedback here
        pass

    def undo_feedback(self) -> None:
        pass


def test_a_round_not_ready_at_its_step_is_applied_when_it_is() -> None:
    spec = SPEC.replace(steps=40, inner_steps=8)
    stage = build_layers(spec, range(0, spec.model.n_layer))
    exchange = SlowExchange()
    rounds = OuterRounds(spec, 0, 1, stage, open_averager=None, exchanges=[exchange])  # type: ignore[list-item]
    assert rounds.after_step(7, lambda: False) is not None  # started
    apply_at = 7 + rounds.overlap
    for step in range(8, apply_at + 2):  # past its step: nothing waits, nothing applied
        assert rounds.after_step(step, lambda: False) is None
    exchange.release.set()
    rounds._pending[0].thread.join(5)  # type: ignore[union-attr]
    report = rounds.after_step(apply_at + 2, lambda: False)
    assert report is not None and report.kind == "averaged"
    assert rounds.outer_steps == 1
