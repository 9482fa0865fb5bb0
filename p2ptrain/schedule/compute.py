"""Each peer's measured compute, priced for any stage split (beyond the paper, which assumes equal
GPUs).

A peer measures one forward + backward of the run's model on the device that will train
(worker/compute_probe.py) and reports it per transformer block and per row of a micro-batch,
plus the first stage's embedding and the last stage's head and loss. That prices a stage of any
number of layers, at any micro-batch size: ``stage_table`` gives the seconds peer p needs for
one micro-batch of stage j of an S x R plan. A GPipe step takes at least (M + S - 1) micro-batch
slots of the slowest stage, and the slowest pipeline gates the data-parallel step, so the cost
model adds (M + S - 1) * max over the plan's positions of that table (cost.py). Stages may
hold unequal numbers of blocks (split.py chooses them for a placement).

Memory-aware: where peers report their device's memory and the run gives each stage's needs
(`StageBytes`, from schedule/memory.py), a peer cannot hold a stage that does not fit: its entry
in the stage table is NO_FIT_S, so the search places it elsewhere when any placement fits, and
`unfit` names what remains when none does (the planner then refuses, saying why).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
# bytes each stage of a (stages, replicas, blocks per stage) plan needs to train
StageBytes = Callable[[int, int, Sequence[int]], Sequence[float]]
# a stage table entry for a peer whose device cannot hold the stage: dearer than any real plan
NO_FIT_S = 1e7


@dataclass(frozen=True)
class PeerCompute:
    """Seconds per row of a micro-batch, forward + backward, for each of N peers (NaN: not
    measured yet), and the run facts that turn them into stage times."""

    block_row_s: FloatArray  # (N,) one transformer block
    embed_row_s: FloatArray  # (N,) the embedding (first stage only)
    head_row_s: FloatArray  # (N,) final norm, head and loss (last stage only)
    n_layer: int
    batch_size: int  # rows a step: the global batch split over the replicas, or each one's
    micro_batches: int  # per pipeline (GPipe)
    memory_bytes: FloatArray | None = None  # (N,) each peer's device memory (NaN: not known)
    stage_bytes: StageBytes | None = None  # what each stage needs (None: memory not checked)
    # sync = "diloco": every replica trains batch_size rows of its own (more replicas, more
    # tokens a step); False: the global batch_size is split over the replicas
    batch_per_replica: bool = False

    def __post_init__(self) -> None:
        sizes = {len(self.block_row_s), len(self.embed_row_s), len(self.head_row_s)}
        if len(sizes) != 1:
            raise ValueError("block_row_s, embed_row_s and head_row_s must have one entry a peer")
        if min(self.n_layer, self.batch_size, self.micro_batches) < 1:
            raise ValueError("n_layer, batch_size and micro_batches must be >= 1")
        for values in (self.block_row_s, self.embed_row_s, self.head_row_s):
            measured = values[~np.isnan(values)]
            if np.any(~np.isfinite(measured)) or np.any(measured < 0):
                raise ValueError("compute times must be finite and >= 0 (or NaN: not measured)")

    @property
    def num_peers(self) -> int:
        return len(self.block_row_s)

    def filled(self) -> PeerCompute:
        """Unmeasured peers get the median of the measured ones (like unmeasured links); with
        nothing measured, every peer costs nothing (the paper's equal GPUs)."""
        known = ~np.isnan(self.block_row_s)

        def fill(values: FloatArray) -> FloatArray:
            values = np.where(known, values, np.nan)
            estimate = float(np.nanmedian(values)) if known.any() else 0.0
            return np.where(np.isnan(values), estimate, values)

        return replace(
            self,
            block_row_s=fill(self.block_row_s),
            embed_row_s=fill(self.embed_row_s),
            head_row_s=fill(self.head_row_s),
        )

    def reordered(self, order: npt.NDArray[np.intp]) -> PeerCompute:
        memory = None if self.memory_bytes is None else self.memory_bytes[order]
        return replace(
            self,
            block_row_s=self.block_row_s[order],
            embed_row_s=self.embed_row_s[order],
            head_row_s=self.head_row_s[order],
            memory_bytes=memory,
        )

    def fits(
        self, stages: int, replicas: int, layers: Sequence[int] | None = None
    ) -> npt.NDArray[np.bool_]:
        """(N, S): can peer p's device hold stage j? (True where its memory is not known.)"""
        sizes = self.layers_or_even(stages, layers)
        fit = np.ones((self.num_peers, stages), dtype=bool)
        if self.memory_bytes is None or self.stage_bytes is None:
            return fit
        need = np.asarray(self.stage_bytes(stages, replicas, sizes), dtype=float)
        known = ~np.isnan(self.memory_bytes)
        fit[known] = self.memory_bytes[known, None] >= need[None, :]
        return fit

    def unfit(
        self,
        pipelines: Sequence[Sequence[int]],
        layers: Sequence[int] = (),
        names: Sequence[str] = (),
    ) -> list[str]:
        """What a placement asks of a device that does not have it, one line a peer position
        (`names`: what to call peer p; default #p)."""
        if self.memory_bytes is None or self.stage_bytes is None or not pipelines:
            return []
        stages, replicas = len(pipelines[0]), len(pipelines)
        sizes = self.layers_or_even(stages, layers)
        need = self.stage_bytes(stages, replicas, sizes)
        fit = self.fits(stages, replicas, sizes)
        return [
            f"stage {j} ({sizes[j]} blocks) needs {need[j] / 2**30:.2f} GiB; peer "
            f"{names[p] if names else f'#{p}'} has "
            f"{self.memory_bytes[p] / 2**30:.2f} GiB"
            for pipeline in pipelines
            for j, p in enumerate(pipeline)
            if not fit[p, j]
        ]

    def stage_table(
        self, stages: int, replicas: int, layers: Sequence[int] | None = None
    ) -> FloatArray:
        """(N, S): seconds of one micro-batch (forward + backward) of stage j on peer p.

        `layers`: blocks per stage (a plan's stage_layers); empty or None: as the model cuts
        them (train/model.py: near-equal, earlier stages take the remainder). A micro-batch
        holds micro_rows(replicas) rows."""
        sizes = np.array(self.layers_or_even(stages, layers), dtype=float)
        filled = self.filled()
        table = filled.block_row_s[:, None] * sizes[None, :]
        table[:, 0] += filled.embed_row_s
        table[:, -1] += filled.head_row_s
        table = np.asarray(table * self.micro_rows(replicas), dtype=np.float64)
        return np.where(self.fits(stages, replicas, sizes.astype(int).tolist()), table, NO_FIT_S)

    def micro_rows(self, replicas: int) -> float:
        """Rows of one micro-batch of a plan of `replicas`: batch_size / micro_batches of a
        replica's own batch (batch_per_replica), else of its share of the global one."""
        rows = self.batch_size if self.batch_per_replica else self.batch_size / replicas
        return rows / self.micro_batches

    def layers_or_even(self, stages: int, layers: Sequence[int] | None = None) -> list[int]:
        """`layers` checked against the model, or the model's near-equal cut if empty."""
        if not layers:
            base, extra = divmod(self.n_layer, stages)
            return [base + (1 if j < extra else 0) for j in range(stages)]
        if len(layers) != stages or min(layers) < 1 or sum(layers) != self.n_layer:
            raise ValueError(f"layers {list(layers)} do not cut {self.n_layer} into {stages}")
        return list(layers)

    def pipeline_slots(self, stages: int) -> int:
        """Micro-batch slots of a GPipe step, fill and drain included: M + S - 1."""
        return self.micro_batches + stages - 1
