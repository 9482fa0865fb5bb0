"""`p2ptrain status` against an address nothing answers at: one line in our words (py-libp2p
printed four "Failed to open TCP stream" lines, then "no addresses established a successful
connection (with exceptions)"), exit code 2."""

from __future__ import annotations

import socket

import pytest

from p2ptrain.app import main
from tests.records.samples import A


def test_status_of_nothing_says_what_to_check(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as sock:  # a port nobody listens on (bound, never listening)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        assert main(["status", "--bootstrap", f"/ip4/127.0.0.1/tcp/{port}/p2p/{A}"]) == 2
    err = capsys.readouterr().err
    assert "cannot reach" in err and "is the node running" in err
    assert "Failed to open TCP stream" not in err and len(err.strip().splitlines()) == 1
