"""The tiny two-stage model that the data-plane tests train over real worker processes
(p2ptrain.harness.direct_swarm.LocalSwarm): a test's spec is TINY_TWO_STAGES.replace(run_id=...,
and what the test is about)."""

from __future__ import annotations

from p2ptrain.records import RunSpec

TINY_TWO_STAGES = RunSpec().replace(
    stages=2,
    n_layer=2,
    n_head=2,
    n_embd=32,
    block_size=16,
    batch_size=8,
    micro_batches=2,
    compression="none",
    checkpoint_interval=0,
)
