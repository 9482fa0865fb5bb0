"""Every pattern that judges bytes from a peer or a file matches them whole: `re.match` with
`$` also takes a trailing newline (a lineage id "…\\n" made a checkpoint name no listing finds;
`status` printed a peer's newline), so the package uses `fullmatch` (only the harness parses
its own log lines by prefix)."""

from __future__ import annotations

import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "p2ptrain"
PREFIX_PARSERS = {"harness"}  # our own logs' lines, read by their start
_MATCH_CALL = re.compile(r"\b_[A-Z][A-Z0-9_]*\.match\(|\bre\.match\(")


def test_no_pattern_is_matched_by_its_start_only() -> None:
    found = []
    for path in PACKAGE.rglob("*.py"):
        if PREFIX_PARSERS & set(path.relative_to(PACKAGE).parts):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if _MATCH_CALL.search(line):
                found.append(f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}")
    assert found == [], "use fullmatch:\n" + "\n".join(found)


def test_the_check_sees_a_start_only_match() -> None:
    assert _MATCH_CALL.search("    if not _ID.match(entry[0]):")
    assert _MATCH_CALL.search("m = re.match(r'^x$', s)")
    assert not _MATCH_CALL.search("    if not _ID.fullmatch(entry[0]):")
