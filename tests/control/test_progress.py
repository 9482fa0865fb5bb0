"""What a volunteer sees: `join`'s progress line per step (control/progress.py) and the
`status` table with each peer's progress, bytes and the measured link rates."""

from __future__ import annotations

import dataclasses

from p2ptrain.cli.status_cmd import format_status
from p2ptrain.control.progress import progress_line, size_text
from p2ptrain.records import MetricsReport, SwarmStatus
from tests.records.samples import A, B, C, metrics_dict, status_dict


def _report(**changes: object) -> MetricsReport:
    return dataclasses.replace(MetricsReport.from_dict(metrics_dict()), **changes)


def test_a_step_is_one_line() -> None:
    line = progress_line(_report(step=12, loss=4.2134, tokens_per_s=312.4, term=3, epoch=2))
    assert line == (
        "step 12  loss 4.213  312 tok/s  avg ok (stage 1: 2 peers)  "
        "plan t3/e2 stage 1 replica 0  sent 3.0 kB  recv 2.0 kB"
    )
    assert "\n" not in line


def test_the_line_says_how_the_gradient_was_combined() -> None:
    assert "avg ok (stage 1: 3 peers)" in progress_line(_report(num_replicas=4, group_size=3))
    # a report of an older worker has no group size: the plan's replicas
    assert "avg ok (stage 1: 2 peers)" in progress_line(_report(group_size=None))
    assert "avg - (stage 1: 1 replica)" in progress_line(_report(averaging="solo"))
    assert "avg FAILED (stage 1: local gradient)" in progress_line(_report(averaging="local"))
    assert "avg stopped" in progress_line(_report(averaging="stopped"))
    # a stage before the last has no loss
    assert progress_line(_report(loss=None)).startswith("step 3  loss -  900 tok/s")


def test_sizes_are_short() -> None:
    assert [size_text(n) for n in (0, 999, 1000, 1_234_567, 5 * 10**9, 10**16)] == [
        "0 B",
        "999 B",
        "1.0 kB",
        "1.2 MB",
        "5.0 GB",
        "10000.0 TB",
    ]


def test_the_status_table_shows_progress_bytes_link_rates_and_relayed_links() -> None:
    data = status_dict()
    data["peers"].append({**data["peers"][0], "id": B, "planner": False, "metrics": None})
    text = format_status(SwarmStatus.from_dict(data))
    header, row = text.splitlines()[2:4]
    assert header.split()[5:10] == ["step", "loss", "tok/s", "sent", "recv"]
    assert row.split()[5:10] == ["3", "4.500", "900", "123.5", "kB"]  # 123.5 kB, then 654.3 kB
    assert "654.3 kB" in row
    assert header.split()[-2:] == ["reach", "address"] and row.split()[-2] == "private"
    rates = text.split("Mbit/s", 1)[1].splitlines()  # the matrix of measured rates
    assert rates[0].split() == [f"…{A[-8:]}", f"…{B[-8:]}"]
    assert rates[1].split() == [f"…{A[-8:]}", "·", "900.0"]
    assert rates[2].split() == [f"…{B[-8:]}", "900.0", "·"]
    assert "  blocks per stage: 3, 1" in text.splitlines()  # the plan's uneven split
    kinds = text.split("connection", 1)[1].splitlines()  # the A-B link goes through a relay
    assert kinds[1].split() == [f"…{A[-8:]}", "·", "relayed"]


def test_the_status_table_of_a_peer_without_metrics_has_dashes() -> None:
    data = status_dict()
    data["peers"][0]["metrics"] = None
    row = format_status(SwarmStatus.from_dict(data)).splitlines()[3]
    assert row.split()[5:10] == ["-"] * 5


def test_a_spare_is_shown_as_one_in_the_status_table() -> None:
    """Every peer showed its record's role, `trainer`, spares too (a walk-through)."""
    data = status_dict()
    data["peers"].append({**data["peers"][0], "id": C, "planner": False})
    data["plan"]["spares"] = [C]
    rows = format_status(SwarmStatus.from_dict(data)).splitlines()[3:5]
    assert "(spare)" not in rows[0] and "trainer (spare)" in rows[1]
