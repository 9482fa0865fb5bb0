"""`/metrics`: the node's view of the swarm in Prometheus' text format (prometheus_client).

Built from one status document (records/status.py) when the dashboard refreshes, never per
request: a scrape costs the bytes it reads. Peers are labelled by their full peer id.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from p2ptrain.records import SwarmStatus
from p2ptrain.records.messages import AVERAGING_OUTCOMES
from p2ptrain.web.history import Point, clamped, measured_step_s


class StatusCollector(Collector):
    """Metric families of one status document and the run's latest point."""

    def __init__(self, status: SwarmStatus, point: Point | None) -> None:
        self.status = status
        self.point = point

    def collect(self) -> Iterator[Metric]:
        status, plan = self.status, self.status.plan
        peers = GaugeMetricFamily(
            "p2ptrain_peers", "Peers this node knows, by state", labels=["state"]
        )
        alive = sum(p.alive for p in status.peers)
        peers.add_metric(["alive"], alive)
        peers.add_metric(["dead"], len(status.peers) - alive)
        yield peers
        yield GaugeMetricFamily(
            "p2ptrain_planner_term", "The planner's election term", value=status.term
        )
        yield GaugeMetricFamily(
            "p2ptrain_finished",
            "1 once every placed replica trained the run's last step (status: finished)",
            value=1.0 if status.finished else 0.0,
        )
        epoch = GaugeMetricFamily("p2ptrain_plan_epoch", "The current plan's epoch in its term")
        shape = GaugeMetricFamily(
            "p2ptrain_plan_shape", "The current plan's pipelines and stages", labels=["dimension"]
        )
        step_time = GaugeMetricFamily(
            "p2ptrain_plan_step_seconds",
            "Step time of the current plan: the planner's prediction and the peers' median",
            labels=["kind"],
        )
        cost = GaugeMetricFamily("p2ptrain_plan_cost_seconds", "The scheduler's cost of the plan")
        if plan is not None:
            epoch.add_metric([], plan.epoch)
            shape.add_metric(["pipelines"], len(plan.pipelines))
            shape.add_metric(["stages"], plan.stages)
            cost.add_metric([], plan.cost_s)
            if plan.predicted_step_s is not None:
                step_time.add_metric(["predicted"], plan.predicted_step_s)
        measured = measured_step_s(status)
        if measured is not None:
            step_time.add_metric(["measured"], measured)
        yield from (epoch, shape, step_time, cost)
        yield from self._run()
        yield from self._per_peer()
        yield from self._links()

    def _run(self) -> Iterator[Metric]:
        point = self.point
        names = (
            # a step's index, from 0: a run of N steps ends at N - 1 ("step N of N" in words)
            ("p2ptrain_step", "The run's newest step every replica finished (from 0)", "step"),
            ("p2ptrain_loss", "The run's loss at that step (mean over replicas)", "loss"),
            ("p2ptrain_tokens_per_second", "The swarm's training throughput", "tokens_per_s"),
        )
        for name, doc, attr in names:
            family = GaugeMetricFamily(name, doc)
            if point is not None:
                family.add_metric([], getattr(point, attr))
            yield family

    def _per_peer(self) -> Iterator[Metric]:
        labels = ["peer"]
        step = GaugeMetricFamily("p2ptrain_peer_step", "A peer's latest step", labels=labels)
        loss = GaugeMetricFamily("p2ptrain_peer_loss", "A last stage's latest loss", labels=labels)
        tokens = GaugeMetricFamily(
            "p2ptrain_peer_tokens_per_second", "A peer's replica's throughput", labels=labels
        )
        up = GaugeMetricFamily("p2ptrain_peer_alive", "1 if the peer is alive", labels=labels)
        rounds = CounterMetricFamily(
            "p2ptrain_averaging_rounds", "Averaging rounds by outcome", labels=["peer", "outcome"]
        )
        sent = CounterMetricFamily(
            "p2ptrain_sent_bytes", "Bytes a peer sent, by plane", labels=["peer", "plane"]
        )
        received = CounterMetricFamily(
            "p2ptrain_received_bytes", "Bytes a peer received, by plane", labels=["peer", "plane"]
        )
        for peer in self.status.peers:
            up.add_metric([peer.id], 1.0 if peer.alive else 0.0)
            m = peer.metrics
            if m is None:
                continue
            for family, value in ((step, m.step), (loss, m.loss), (tokens, m.tokens_per_s)):
                if value is not None:
                    family.add_metric([peer.id], value)
            for outcome, count in sorted((m.averaging or {}).items()):
                if outcome in AVERAGING_OUTCOMES:  # a name a peer made up mints a series
                    rounds.add_metric([peer.id, outcome], count)
            for plane, out, into in (
                ("data", m.bytes_sent, m.bytes_received),
                ("control", m.control_bytes_sent, m.control_bytes_received),
            ):
                if out is not None:
                    sent.add_metric([peer.id, plane], out)
                if into is not None:
                    received.add_metric([peer.id, plane], into)
        yield from (up, step, loss, tokens, rounds, sent, received)

    def _links(self) -> Iterator[Metric]:
        rtt = GaugeMetricFamily(
            "p2ptrain_link_rtt_seconds", "A link's measured round trip", labels=["a", "b"]
        )
        rate = GaugeMetricFamily(
            "p2ptrain_link_rate_bits_per_second", "A link's measured rate", labels=["a", "b"]
        )
        for link in self.status.links:
            if link.estimated:  # a prediction (issue 29), not a measurement
                continue
            if link.rtt_ms is not None:
                rtt.add_metric([link.a, link.b], link.rtt_ms / 1e3)
            if link.bandwidth_mbps is not None:
                rate.add_metric([link.a, link.b], clamped(link.bandwidth_mbps * 1e6))
        yield from (rtt, rate)


def metrics_text(status: SwarmStatus, point: Point | None) -> bytes:
    """The exposition of one status document."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StatusCollector(status, point))
    return generate_latest(registry)
