"""The join progress line says where a session started (issue 30): its first line only."""

from __future__ import annotations

import dataclasses

import pytest

from p2ptrain.control.progress import progress_line, started_text
from p2ptrain.errors import WireError
from p2ptrain.records import MetricsReport
from tests.records.samples import metrics_dict


def test_the_first_line_of_a_resumed_session_names_its_step_and_lineage() -> None:
    report = MetricsReport.from_dict({**metrics_dict(), "step": 10, "start_step": 10})
    assert progress_line(report).endswith("resumed from step 10 (lineage 0123456789abcdef)")
    later = dataclasses.replace(report, step=11)
    assert "resumed" not in progress_line(later)
    fresh = dataclasses.replace(report, step=0, start_step=0, start_lineage="", resume_never=True)
    assert progress_line(fresh).endswith('started from initial weights (resume = "never")')
    older = {k: v for k, v in metrics_dict().items() if not k.startswith(("start", "resume"))}
    assert started_text(MetricsReport.from_dict(older)) == ""  # an older worker says nothing


def test_a_start_lineage_with_a_trailing_newline_is_refused() -> None:
    for bad in ("root\n", "0123456789abcdef\n", "\n"):
        with pytest.raises(WireError):
            MetricsReport.from_dict({**metrics_dict(), "start_step": 3, "start_lineage": bad})
