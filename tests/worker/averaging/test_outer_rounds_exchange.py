"""OuterRounds with our exchange (worker/averaging/outer_exchange.py), two replicas in threads
over an in-memory link: they end the run with identical parameters, and a round that is not
ready at its step does not hold the step up."""

from __future__ import annotations

import threading

import pytest
import torch

from p2ptrain.train.model import build_layers
from p2ptrain.train.optim import make_optimizer
from p2ptrain.train.outer import fragment_spans
from p2ptrain.worker.averaging.outer_exchange import OuterExchange
from p2ptrain.worker.averaging.outer_rounds import OuterRounds
from p2ptrain.worker.averaging.stage_averager import Outcome
from tests.worker.averaging.test_outer_exchange import FAST, PEERS, MemoryLink
from tests.worker.averaging.test_outer_rounds import SPEC, flat, inner_step


@pytest.mark.parametrize("fragments", [1, 2])
def test_two_replicas_end_the_run_with_identical_parameters(fragments: int) -> None:
    spec = SPEC.replace(outer_compression="int8", outer_fragments=fragments)
    net: dict[str, MemoryLink] = {}
    for peer in PEERS[:2]:
        net[peer] = MemoryLink(peer, net)
    group = dict.fromkeys(PEERS[:2], 1.0)
    finals: dict[int, torch.Tensor] = {}
    kinds: dict[int, list[str]] = {0: [], 1: []}
    outer_steps: dict[int, int] = {}

    def replica(i: int) -> None:
        stage = build_layers(spec, range(0, spec.model.n_layer))
        optimizer = make_optimizer(stage, spec)
        numel = sum(p.numel() for p in stage.parameters())
        spans = fragment_spans(numel, fragments)
        prefixes = [f"r/1/1/0.{f}" for f in range(fragments)]
        exchanges = []
        for (start, end), prefix in zip(spans, prefixes, strict=True):
            exchange = OuterExchange(net[PEERS[i]], group, "int8", end - start, prefix, FAST)
            exchange.siblings = tuple(p for p in prefixes if p != prefix)
            exchanges.append(exchange)
        rounds = OuterRounds(spec, 0, 1, stage, open_averager=None, exchanges=exchanges)
        for step in range(spec.optim.steps):
            inner_step(stage, optimizer, seed=100 * i + step)  # each replica its own batches
            report = rounds.after_step(step, lambda: False)
            if report is not None:
                kinds[i].append(report.kind)
        rounds.close()
        finals[i] = flat(stage)
        outer_steps[i] = rounds.outer_steps

    threads = [threading.Thread(target=replica, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert torch.equal(finals[0], finals[1])
    # every round applied (some at a later step than due, when a replica was behind); the
    # count follows the first fragment, whose rounds are every H steps and after the last
    assert outer_steps == {0: 3, 1: 3}
    assert "local" not in kinds[0] + kinds[1]


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
