"""Pieces of the e2e bench that need no root: the traffic model, plans on emulated links, PNG."""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

import pytest

from p2ptrain.harness.png_plot import HEIGHT, WIDTH, write_line_plot
from p2ptrain.harness.testbed_swarm import plan_on_testbed
from p2ptrain.records import Hello, RunSpec
from p2ptrain.schedule.synthetic import city_topology
from p2ptrain.schedule.workload import measured_workload, stage_parameter_counts
from p2ptrain.testbed.links import links_from_topology


def test_stage_parameter_counts_match_the_model() -> None:
    torch = pytest.importorskip("torch")
    from p2ptrain.train.model import build_stage

    spec = RunSpec(stages=2, n_layer=4)
    real = [sum(p.numel() for p in build_stage(spec, s, 2).parameters()) for s in range(2)]
    assert stage_parameter_counts(spec, 2) == real
    assert torch is not None


def test_measured_workload_units() -> None:
    spec = RunSpec(stages=2, n_layer=4, n_embd=128, block_size=64, batch_size=16)
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
    spec = RunSpec(stages=4, n_layer=4)
    scheduled, pipelines = plan_on_testbed(bed, spec, hellos, "scheduled")  # type: ignore[arg-type]
    assert scheduled.stages == 4 and scheduled.num_replicas == 2
    assert sorted(p for pipe in pipelines for p in pipe) == list(range(8))
    assert scheduled.pipelines[0][0] == f"peer{pipelines[0][0]}"
    # the plan states the emulated network: the workers' timeouts are scaled for it
    assert scheduled.network is not None and scheduled.network.max_rtt_s > 0.05
    for seed in range(5):
        random_plan, _ = plan_on_testbed(bed, spec, hellos, "random", seed)  # type: ignore[arg-type]
        assert scheduled.cost_s <= random_plan.cost_s + 1e-9


def test_png_plot_is_a_valid_png(tmp_path: Path) -> None:
    path = tmp_path / "plot.png"
    write_line_plot(
        path, {"scheduled": [(0, 5.5), (10, 4.0)], "random": [(0, 5.5), (20, 4.0)]}, 5, 1
    )
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    idat_len = int.from_bytes(data[33:37], "big")
    raw = zlib.decompress(data[41 : 41 + idat_len])
    assert len(raw) == HEIGHT * (1 + WIDTH * 3)
    assert any(raw[i] != 0xFF for i in range(len(raw)) if i % (1 + WIDTH * 3))  # something drawn
