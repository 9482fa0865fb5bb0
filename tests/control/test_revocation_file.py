"""The bootstrap's --revoked file, re-read while it runs (control/revocation_file.py:
reload_revocations): each line counts on its own. One torn append or a line revoked with
another key made the whole file refused, every revocation in it with it (at a restart the
earlier ones too: a revoked planner got its rights back)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from p2ptrain import identity
from p2ptrain.control.revocation_file import reload_revocations
from p2ptrain.records import issue_revocation
from tests.control.test_gossip_screen import ORGANISER, make_node


def test_a_bad_line_skips_itself_only(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    state, _ = make_node()
    peers = [identity.peer_id_of(os.urandom(32)) for _ in range(3)]
    first, wrong_key, last = (
        issue_revocation(ORGANISER, peers[0]).encode(),
        issue_revocation(os.urandom(32), peers[1]).encode(),  # `token revoke` with another key
        issue_revocation(ORGANISER, peers[2]).encode(),
    )
    torn = last[:60]  # an append cut short
    path = tmp_path / "revoked"
    path.write_text("\n".join([first, torn, wrong_key, last]) + "\n")
    state.revocations_path = str(path)
    with caplog.at_level(logging.WARNING):
        reload_revocations(state)
        reload_revocations(state)  # the same file again: not warned twice
    assert set(state.view.authority.revocations) == {peers[0], peers[2]}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "line 2" in warnings[0] and f"revocation of {peers[1]}" in warnings[0]
