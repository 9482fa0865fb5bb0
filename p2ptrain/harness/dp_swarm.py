"""The hivemind.Optimizer baseline as a swarm (p2ptrain/harness/dp_trainer.py): one trainer per
peer, each its own process tree, on loopback or in the WAN testbed's namespaces. Stdlib only: the
trainers are separate processes; rendezvous and metrics go through files in a work directory.
"""

from __future__ import annotations

import json
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

from p2ptrain.flags import python_module
from p2ptrain.harness.process_swarm import ProcessSwarm
from p2ptrain.harness.testbed_swarm import testbed_network
from p2ptrain.records.run import RunSpec
from p2ptrain.testbed.testbed import Testbed


class DataParallelSwarm(ProcessSwarm):
    """The hivemind.Optimizer baseline (p2ptrain/harness/dp_trainer.py): peer i's trainer in
    testbed peer i's namespace, or on loopback when bed is None. Stdlib only; rendezvous and
    metrics go through files in workdir. Start with `with`; every process group dies on exit."""

    LOG = "dp-{index}.log"

    def __init__(
        self, spec: RunSpec, num_peers: int, workdir: Path, bed: Testbed | None = None
    ) -> None:
        super().__init__(workdir)
        self.spec, self.num_peers, self.bed = spec, num_peers, bed

    def __enter__(self) -> DataParallelSwarm:
        self.workdir.mkdir(parents=True, exist_ok=True)
        run_path = self.workdir / "run.json"
        run_path.write_text(json.dumps(self.spec.to_dict()))
        self.start_all(
            self.num_peers, lambda index: self.spawn(index, self._command(index, run_path))
        )
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()

    def _command(self, index: int, run_path: Path) -> list[str]:
        """Trainer `index`'s command line (in its testbed namespace, with the bed's links)."""
        argv = python_module(
            "p2ptrain.harness.dp_trainer",
            "--run",
            str(run_path),
            "--index",
            str(index),
            "--num-peers",
            str(self.num_peers),
            "--rendezvous",
            str(self.workdir),
        )
        if self.bed is None:
            return argv
        network = testbed_network(self.bed)
        return self.bed.command(
            index,
            [
                *argv,
                "--listen-host",
                self.bed.address(index),
                "--max-rtt-s",
                str(network.max_rtt_s),
                "--min-rate-mbps",
                str(network.min_rate_mbps),
            ],
        )

    def wait_ready(self, timeout_s: float) -> None:
        """Until every trainer has its optimizer (hivemind.Optimizer takes seconds to build)."""
        deadline = time.monotonic() + timeout_s
        while not all((self.workdir / f"ready-{i}").exists() for i in range(self.num_peers)):
            self._check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError("the data-parallel trainers did not all get ready in time")
            time.sleep(0.1)

    def start(self) -> float:
        """Let every trainer start step 0; the wall-clock time it was given."""
        started = time.time()
        (self.workdir / "go").touch()
        return started

    def follow(
        self, on_step: Any = None, stall_timeout_s: float = 180.0
    ) -> list[tuple[int, float, float]]:
        """Wait for every step of every trainer: (step, global loss, wall time it finished)."""
        done: list[tuple[int, float, float]] = []
        deadline = time.monotonic() + stall_timeout_s
        while len(done) < self.spec.optim.steps:
            self._check_alive(allow_exit=True)
            by_step: dict[int, list[dict[str, Any]]] = {}
            for i in range(self.num_peers):
                path = self.workdir / f"metrics-{i}.jsonl"
                lines = path.read_text().splitlines() if path.exists() else []
                for line in lines:
                    if line.strip():
                        record = json.loads(line)
                        by_step.setdefault(int(record["step"]), []).append(record)
            complete = sorted(s for s, rs in by_step.items() if len(rs) == self.num_peers)
            for step in complete[len(done) :]:
                records = by_step[step]
                # a peer that jumped past the step (dp_trainer's recovery) reports 0 rows
                total = sum(r["samples"] for r in records)
                loss = sum(r["loss"] * r["samples"] for r in records) / total if total else 0.0
                done.append((step, loss, max(r["time_s"] for r in records)))
                deadline = time.monotonic() + stall_timeout_s
                if on_step is not None:
                    on_step(*done[-1])
            if len(done) < self.spec.optim.steps and all(p.poll() is not None for p in self.procs):
                raise RuntimeError(
                    f"the trainers exited after {len(done)} steps:\n{self.log_tail(0)}"
                )
            if time.monotonic() > deadline:
                raise TimeoutError("the data-parallel swarm made no progress in time")
            time.sleep(0.2)
        return done

    def wait_exit(
        self, timeout_s: float = 20.0, only: Collection[int] | None = None
    ) -> list[int | None]:
        """Wait for the trainers (`only` those) to leave on their own (after the last step)."""
        return super().wait_exit(timeout_s, only)

    def _check_alive(self, allow_exit: bool = False) -> None:
        for index, proc in enumerate(self.procs):
            code = proc.poll()
            if code is not None and (code != 0 or not allow_exit):
                raise RuntimeError(f"trainer {index} exited with {code}:\n{self.log_tail(index)}")
