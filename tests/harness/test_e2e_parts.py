"""Pieces of the e2e bench that need no root: the traffic model, bytes per link, plans on
emulated links, the plot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from p2ptrain.harness.e2e_join import replica_rows, span_tokens_per_s
from p2ptrain.harness.e2e_plot import write_loss_plot
from p2ptrain.harness.e2e_traffic import (
    dp_bytes,
    link_table,
    measured_link_bytes,
    predicted_link_bytes,
)
from p2ptrain.harness.testbed_swarm import plan_on_testbed
from p2ptrain.records import Hello, LinkBytes, MetricsReport, RunSpec
from p2ptrain.schedule.synthetic import city_topology
from p2ptrain.schedule.wire_bytes import activation_row_bytes
from p2ptrain.schedule.workload import measured_workload, stage_parameter_counts, step_traffic
from p2ptrain.testbed.links import links_from_topology


def test_stage_parameter_counts_match_the_model() -> None:
    torch = pytest.importorskip("torch")
    from p2ptrain.train.model import build_stage

    spec = RunSpec().replace(stages=2, n_layer=4)
    real = [sum(p.numel() for p in build_stage(spec, s, 2).parameters()) for s in range(2)]
    assert stage_parameter_counts(spec, 2) == real
    assert torch is not None


def test_measured_workload_units() -> None:
    spec = RunSpec().replace(stages=2, n_layer=4, n_embd=128, block_size=64, batch_size=16)
    workload = measured_workload(spec, 2, 2)
    assert workload.c_dp_gb == pytest.approx(max(stage_parameter_counts(spec, 2)) * 2 / 1e9)
    assert workload.c_pp_gb == pytest.approx(8 * 64 * 128 * 2 / 1e9)


class _FakeBed:
    def __init__(self, topology: Any) -> None:
        self.names = topology.peers
        self.num_peers = len(topology.peers)
        self.configured = links_from_topology(topology.delay_ms, topology.bandwidth_gbps)

    def links(self) -> Any:
        return self.configured


def test_scheduled_plan_costs_no_more_than_random_placements() -> None:
    topology = city_topology(8, 1, 8, 0, ["Oregon", "Virginia", "Frankfurt", "Tokyo"])
    bed = _FakeBed(topology)
    hellos = [Hello(f"peer{i}", (f"/ip4/10.77.0.{i + 1}/tcp/1",), i) for i in range(8)]
    spec = RunSpec().replace(stages=4, n_layer=4)
    scheduled, pipelines = plan_on_testbed(bed, spec, hellos, "scheduled")  # type: ignore[arg-type]
    assert scheduled.stages == 4 and scheduled.num_replicas == 2
    assert sorted(p for pipe in pipelines for p in pipe) == list(range(8))
    assert scheduled.pipelines[0][0] == f"peer{pipelines[0][0]}"
    # the plan states the emulated network: the workers' timeouts are scaled for it
    assert scheduled.network is not None and scheduled.network.max_rtt_s > 0.05
    for seed in range(5):
        random_plan, _ = plan_on_testbed(bed, spec, hellos, "random", seed)  # type: ignore[arg-type]
        assert scheduled.cost_s <= random_plan.cost_s + 1e-9


def test_loss_plot_is_a_png_with_every_run(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "plot.png"
    write_loss_plot(path, {"scheduled": [(0, 5.5), (10, 4.0)], "random": [(0, 5.5), (20, 4.0)]})
    assert path.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_predicted_link_bytes_of_two_pipelines() -> None:
    # 2 stages x 2 replicas: pipelines 0 -> 1 and 2 -> 3; stage groups {0, 2} and {1, 3}
    links = predicted_link_bytes([[0, 1], [2, 3]], [1000.0, 600.0], [3, 2], 10.0)
    assert links[(0, 1)] == links[(1, 0)] == 30.0 + 0  # 3 rows each way, no averaging
    assert links[(2, 3)] == links[(3, 2)] == 20.0
    assert links[(0, 2)] == links[(2, 0)] == 1000.0  # 2 G / R: a part out, the average back
    assert links[(1, 3)] == links[(3, 1)] == 600.0
    assert set(links) == {(0, 1), (1, 0), (2, 3), (3, 2), (0, 2), (2, 0), (1, 3), (3, 1)}


def test_predicted_link_bytes_under_diloco_spread_a_round_over_its_steps() -> None:
    # one exchange every 10 steps: 2 G / R / H per ordered pair; top-k gathers: G / H
    links = predicted_link_bytes([[0, 1], [2, 3]], [1000.0, 600.0], [4, 4], 10.0, 10)
    assert links[(0, 2)] == links[(2, 0)] == 100.0 and links[(1, 3)] == 60.0
    assert links[(0, 1)] == 40.0  # the pipeline still moves every step
    gathered = predicted_link_bytes([[0], [1], [2]], [900.0], [1, 1, 1], 0.0, 10, True)
    assert gathered[(0, 1)] == gathered[(2, 1)] == 90.0
    assert dp_bytes(links, [[0, 1], [2, 3]]) == 2 * 100.0 + 2 * 60.0


def test_diloco_rows_activations_and_bytes_of_a_real_spec() -> None:
    spec = RunSpec().replace(
        stages=2, n_layer=4, batch_size=16, sync="diloco", inner_steps=10, compression="int8"
    )
    # every replica trains its own batch_size rows; step splits the global batch
    assert replica_rows(spec, 2) == [16.0, 16.0]
    assert replica_rows(spec.replace(sync="step"), 3) == [6.0, 5.0, 5.0]
    traffic = step_traffic(spec, 2, 2)
    counts = stage_parameter_counts(spec, 2)
    # int8 activations carry a 4-byte fp32 scale a row (token)
    assert activation_row_bytes("int8", spec.model.n_embd) == spec.model.n_embd + 4
    assert traffic.inner_steps == 10 and traffic.stage_gradient_bytes[0] == 2 * counts[0]
    links = predicted_link_bytes(
        [[0, 1], [2, 3]],
        traffic.stage_gradient_bytes,
        replica_rows(spec, 2),
        spec.model.block_size * activation_row_bytes("int8", spec.model.n_embd),
        traffic.inner_steps,
    )
    assert links[(0, 2)] == pytest.approx(2 * counts[0] / 10)
    assert links[(0, 1)] == 16 * 64 * (128 + 4)
    # tokens/s counts each step's own tokens, the first step's left out
    assert span_tokens_per_s([1.0, 2.0, 4.0], [2048, 2048, 1024]) == pytest.approx(1024.0)
    assert span_tokens_per_s([1.0], [2048]) == 0.0


def _metrics(step: int, sent: int, to: dict[str, int], term: int = 1) -> str:
    report = MetricsReport(
        step=step,
        loss=None,
        tokens_per_s=1.0,
        stage=0,
        replica=0,
        samples=1,
        averaging="solo",
        step_s=1.0,
        epoch=0,
        term=term,
        num_replicas=1,
        bytes_sent=sent,
        bytes_received=0,
        link_bytes={p: LinkBytes(sent=n) for p, n in to.items()},
    )
    return json.dumps(report.to_dict())


def test_measured_link_bytes_count_the_plans_steps_only(tmp_path: Path) -> None:
    logs = [tmp_path / "metrics-0.jsonl", tmp_path / "metrics-1.jsonl"]
    logs[0].write_text(
        "\n".join(
            [
                _metrics(0, 50, {"B": 40}, term=0),  # an older plan: left out
                _metrics(0, 1000, {"B": 900}),
                '{"type": "session"}',
                _metrics(2, 3000, {"B": 2500, "stranger": 7}),
            ]
        )
        + "\n"
    )
    logs[1].write_text(_metrics(0, 10, {"A": 10}) + "\n")  # one report: no window
    measured = measured_link_bytes(logs, ["A", "B"], (1, 0))
    assert measured is not None
    links, sent = measured
    assert links == {(0, 1): 800.0} and sent == {"A": 1000.0}
    rows = link_table({(0, 1): 700.0, (1, 0): 5.0}, links, steps=10)
    assert rows[0] == {
        "link": [0, 1],
        "predicted_bytes_per_step": 700,
        "measured_bytes_per_step": 800,
        "predicted_bytes": 7000,
        "measured_bytes": 8000,
    }
    assert rows[1]["measured_bytes"] == 0


def test_workers_without_byte_counters_measure_nothing(tmp_path: Path) -> None:
    log = tmp_path / "metrics-0.jsonl"
    # a line that is no valid record (an older worker's, a cut one) is not read
    log.write_text(json.dumps({"type": "metrics", "step": 0, "term": 1, "epoch": 0}) + "\n")
    assert measured_link_bytes([log], ["A"], (1, 0)) is None
    assert link_table({(0, 1): 1.0}, None, 3)[0]["measured_bytes"] is None
