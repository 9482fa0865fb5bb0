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


def test_a_watch_says_each_failed_look_and_looks_again() -> None:
    """`status --watch`: a node that does not answer is said each time, and looked at again."""
    from p2ptrain.control import observer

    errors: list[str] = []
    causes: list[str] = []

    def note(status: object, error: Exception | None) -> bool:
        assert status is None and error is not None
        errors.append(str(error))
        causes.append(str(error.__context__))  # py-libp2p's own words, kept out of ours
        return len(errors) < 3

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        observer.watch(f"/ip4/127.0.0.1/tcp/{port}/p2p/{A}", 0.2, note)
    assert len(errors) == 3 and all("cannot reach" in e for e in errors)
    # each look dialled: py-libp2p's 60 s block of a peer whose dial failed would have refused
    # the later ones at once (a node back from a restart stayed unseen for a minute)
    assert not any("negative cache" in cause for cause in causes), causes


@pytest.mark.parametrize("every", ["0", "0.1", "nan", "inf", "-1", "5000", "soon"])
def test_a_watch_interval_is_a_sane_number_of_seconds(
    every: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["status", "--bootstrap", f"/ip4/127.0.0.1/tcp/1/p2p/{A}", "--watch", every])
    assert exited.value.code == 2 and "--watch" in capsys.readouterr().err
