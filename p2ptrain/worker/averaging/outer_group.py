"""The outer exchanges of a stage's group under a plan (one a fragment of the stage), over the
worker's round link (worker/averaging/outer_link.py), with the timeouts the plan's facts of the
group's links give."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from p2ptrain.records import NetworkFacts, Plan, Role, RunSpec
from p2ptrain.train.outer import fragment_spans
from p2ptrain.worker.averaging import outer_wire as wire
from p2ptrain.worker.averaging.outer_exchange import (
    ExchangeTimeouts,
    OuterExchange,
    inbox_payload_bytes,
)
from p2ptrain.worker.averaging.outer_link import P2PRoundLink
from p2ptrain.worker.averaging.round_timeouts import RETRY_TIMEOUT_S, averaging_timeouts
from p2ptrain.worker.pipeline.stage_step import replica_weights

if TYPE_CHECKING:
    from p2ptrain.worker.pipeline.transport import Transport


def stage_exchanges(
    spec: RunSpec, role: Role, plan: Plan, transport: Transport, model: torch.nn.Module
) -> list[OuterExchange] | None:
    """The outer exchanges of `role`'s stage group under `plan`, one a fragment of the stage
    (`outer_fragments`), over the worker's transport (None for a one-replica stage)."""
    if role.num_replicas < 2:
        return None
    numel = sum(p.numel() for p in model.parameters() if p.requires_grad)
    spans = fragment_spans(numel, spec.optim.outer_fragments)
    codec, fraction = spec.wire.outer_compression, spec.wire.topk_fraction
    link, weights = P2PRoundLink.of(transport), replica_weights(spec, role)
    stage_prefix = f"{spec.run_id}/{plan.term}/{role.epoch}/{role.stage}"
    prefixes = [stage_prefix if f == 0 else f"{stage_prefix}.{f}" for f in range(len(spans))]
    exchanges, largest = [], 0
    for (start, end), prefix in zip(spans, prefixes, strict=True):
        payload_bytes = wire.max_message_bytes(codec, end - start, fraction)
        largest = max(largest, inbox_payload_bytes(codec, end - start, fraction))
        timeouts = exchange_timeouts(
            spec.wire.averaging_timeout_s, payload_bytes, plan.network, role.stage
        )
        exchange = OuterExchange(
            link,
            weights,
            codec,
            end - start,
            prefix,
            timeouts,
            fraction,
            inner_steps=spec.optim.inner_steps,
        )
        exchange.siblings = tuple(p for p in prefixes if p != prefix)
        exchanges.append(exchange)
    # each exchange admitted the group with its own fragment's size: the inbox takes the largest
    link.inbox.admit_group(weights, largest)
    return exchanges


def exchange_timeouts(
    join_s: float, payload_bytes: int, network: NetworkFacts | None, stage: int
) -> ExchangeTimeouts:
    """join_s: the run's averaging_timeout_s (how far apart the replicas may reach a round);
    the transfers' bounds from the plan's facts of the stage group's links."""
    links = averaging_timeouts(payload_bytes, network, stage)
    return ExchangeTimeouts(join_s, links.reducer_s, max(RETRY_TIMEOUT_S, links.sender_s))
