"""What a volunteer sees: one line per training step on `p2ptrain join`'s stdout.

The control process prints one line per `metrics` report its worker sends (after its first stdout
line, the node's multiaddr, which tools read), e.g.

    step 12  loss 4.213  312 tok/s  avg ok (stage 1: 2 peers)  plan t3/e2 stage 1 replica 0  ...

(with sync = "diloco" the averaging part names the outer rounds: `outer 3 (H 20) avg ok
(stage 1: 2 peers)` on the step a round was applied, `outer 3 (H 20)` between rounds)

and, at the end of the line, the data-plane bytes the worker sent and received so far
(`sent 1.2 MB  recv 1.1 MB`); a session's first line ends with where it started (`resumed from
step 10 (lineage 3f2a...)`). `join --quiet` turns the lines off.

Pure: the format is unit-tested (tests/control/test_progress.py).
"""

from __future__ import annotations

from p2ptrain.records import MetricsReport
from p2ptrain.records.start import started_text as started_text_of

_UNITS = ("B", "kB", "MB", "GB", "TB")


def progress_line(report: MetricsReport) -> str:
    """One step of our worker as a line of text."""
    loss = "-" if report.loss is None else f"{report.loss:.3f}"  # only a last stage has one
    return (
        f"step {report.step}  loss {loss}  {report.tokens_per_s:.0f} tok/s  "
        f"{averaging_text(report)}  "
        f"plan t{report.term}/e{report.epoch} stage {report.stage} replica {report.replica}  "
        f"sent {size_text(report.bytes_sent)}  recv {size_text(report.bytes_received)}"
        + (f"  {started_text(report)}" if report.step == report.start_step else "")
    )


def started_text(report: MetricsReport) -> str:
    """Where the worker's session started: "resumed from step N (lineage ...)" (issue 30);
    "" for an older worker that does not say."""
    return started_text_of(report.start_step, report.start_lineage, report.resume_never)


def averaging_text(report: MetricsReport) -> str:
    """How the step's gradient was combined with the stage's other replicas; under diloco the
    stage's outer rounds instead: "outer 3 (H 20)", and what this step's round did."""
    stage = f"stage {report.stage}"
    if report.outer_steps is not None:
        return outer_text(report)
    if report.averaging == "averaged":
        peers = report.num_replicas if report.group_size is None else report.group_size
        return f"avg ok ({stage}: {peers} peers)"
    if report.averaging == "solo":
        return f"avg - ({stage}: 1 replica)"
    if report.averaging == "local":
        return f"avg FAILED ({stage}: local gradient)"
    return f"avg stopped ({stage}: new plan)"


def outer_text(report: MetricsReport) -> str:
    """DiLoCo: the stage's outer steps so far, H, and this step's round if it had one."""
    line = f"outer {report.outer_steps} (H {report.inner_steps})"
    stage = f"stage {report.stage}"
    done = report.outer_round
    if done == "averaged":
        peers = report.num_replicas if report.group_size is None else report.group_size
        return f"{line} avg ok ({stage}: {peers} peers)"
    if done == "solo":
        return f"{line} applied ({stage}: 1 replica)"
    if done == "started":
        return f"{line} round started ({stage})"
    if done == "local":
        return f"{line} round FAILED ({stage}: not applied)"
    if done == "stopped":
        return f"{line} round stopped ({stage}: new plan)"
    return line


def size_text(num_bytes: int) -> str:
    """A byte count in decimal units: 0 B, 812 B, 1.2 MB."""
    if num_bytes < 1000:
        return f"{num_bytes} B"
    exponent = min(len(_UNITS) - 1, (len(str(num_bytes)) - 1) // 3)
    return f"{num_bytes / 1000**exponent:.1f} {_UNITS[exponent]}"
