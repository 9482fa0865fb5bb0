"""What `p2ptrain local` shows while it runs: the plan, a progress line per step (under diloco
with the outer rounds every stage has applied) and the last line's counts."""

from __future__ import annotations

from typing import TYPE_CHECKING, TextIO

from p2ptrain.records import MetricsReport, Plan

if TYPE_CHECKING:  # the swarm's module: only its result's type here
    from p2ptrain.harness.direct_swarm import SwarmResult


def short_id(peer_id: str) -> str:
    """A peer id as `local` prints it: its last six characters."""
    return f"…{peer_id[-6:]}"


def _describe_plan(plan: Plan) -> str:
    pipelines = " | ".join(" → ".join(short_id(p) for p in pipe) for pipe in plan.pipelines)
    spares = f", spares {', '.join(short_id(p) for p in plan.spares)}" if plan.spares else ""
    planner = short_id(plan.planner) if plan.planner.startswith("12D3") else plan.planner
    return (
        f"plan ({planner}): {plan.stages} stages x {plan.num_replicas} replicas: "
        f"{pipelines}{spares}"
    )


class Progress:
    """One line per step, redrawn in place on a terminal."""

    def __init__(self, steps: int, out: TextIO) -> None:
        self.steps = steps
        self.layout = "?"
        self.out = out
        self.tty = out.isatty()
        self.outer_steps: dict[int, int] = {}  # sync = "diloco": each stage's outer steps
        self.inner_steps: int | None = None

    def on_report(self, report: MetricsReport) -> None:
        """A worker's step: under diloco, its stage's outer steps so far."""
        if report.outer_steps is not None:
            done = max(self.outer_steps.get(report.stage, 0), report.outer_steps)
            self.outer_steps[report.stage], self.inner_steps = done, report.inner_steps

    def outer_text(self) -> str:
        """ "  outer 3 (H 10)": the outer rounds every stage has applied ("": not diloco)."""
        if not self.outer_steps:
            return ""
        return f"  outer {min(self.outer_steps.values())} (H {self.inner_steps})"

    def on_plan(self, plan: Plan) -> None:
        self.outer_steps = {}  # the new plan's stages report afresh (their counts carry over)
        self.layout = f"{plan.stages}x{plan.num_replicas}"
        if self.tty:
            self.out.write("\n")
        print(_describe_plan(plan), file=self.out, flush=True)

    def on_step(self, step: int, loss: float, tokens_per_s: float) -> None:
        width = 20
        filled = int(width * (step + 1) / self.steps)
        bar = "#" * filled + "." * (width - filled)
        line = (
            f"[{bar}] step {step + 1}/{self.steps}  loss {loss:.4f}  "
            f"{tokens_per_s:,.0f} tok/s  plan {self.layout}{self.outer_text()}"
        )
        self.out.write(("\r" + line) if self.tty else line + "\n")
        self.out.flush()

    def finish(self) -> None:
        if self.tty:
            self.out.write("\n")


def counts_text(counts: dict[str, int]) -> str:
    """ "150 averaged, 10 solo": outcomes by count, most first ("none" for none)."""
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return ", ".join(f"{count} {outcome}" for outcome, count in ranked) or "none"


def done_line(result: SwarmResult, wall_s: float) -> str:
    """The last line: steps, time, loss, speed, and what the workers' steps' rounds did."""
    line = (
        f"done: {result.steps} steps in {wall_s:.0f} s, loss {result.loss[0]:.3f} -> "
        f"{result.loss[-1]:.3f}, {result.tokens_per_s:.0f} tokens/s, "
        f"averaging: {counts_text(result.averaging)}"
    )
    if result.outer_rounds:
        line += f"; outer rounds: {counts_text(result.outer_rounds)}"
    return line
