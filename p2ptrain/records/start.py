"""Where a worker's training session started (issue 30): the fields a worker's metrics report
and a peer's gossiped metrics carry, and the one sentence the join progress line, `status` and
the dashboard show for them."""

from __future__ import annotations

import re

from p2ptrain.records import fields as f

# a lineage id (records/lineage.py), "root" for untagged states, "" for initial weights
_START_LINEAGE = re.compile(r"^([0-9a-f]{16}|root)?$")


def parse_start_lineage(value: object, record: str, name: str = "start_lineage") -> str:
    """The lineage a session resumed from, as a report carries it, or the wire error."""
    if not isinstance(value, str) or not _START_LINEAGE.fullmatch(value):
        raise f.malformed(record, "start_lineage must be a lineage id, 'root' or ''")
    return value


def started_text(start_step: int | None, start_lineage: str, resume_never: bool) -> str:
    """ "resumed from step N (lineage ...)", or how a session started from initial weights;
    "" when not known (an older peer that does not say)."""
    if start_step is None:
        return ""
    if start_lineage:
        return f"resumed from step {start_step} (lineage {start_lineage})"
    if resume_never:
        return 'started from initial weights (resume = "never")'
    return f"started from initial weights at step {start_step}"
