"""The node commands' shared flags come from one declaration (control/settings.py), with each
command's own defaults kept: external checks rely on them."""

from __future__ import annotations

import argparse
from pathlib import Path
from types import ModuleType

import pytest

from p2ptrain.cli import bootstrap_cmd, doctor_cmd, join_cmd
from tests.records.samples import A


def _parse(module: ModuleType, argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    return parser.parse_args(argv)


@pytest.mark.parametrize("module", [join_cmd, doctor_cmd])
def test_join_and_doctor_keep_their_defaults(module: ModuleType) -> None:
    args = _parse(module, ["--bootstrap", "/ip4/127.0.0.1/tcp/7400"])
    assert args.listen == "/ip4/0.0.0.0/tcp/7401"
    assert args.data_listen == "/ip4/0.0.0.0/tcp/7402"
    assert (args.announce, args.control_only) == ([], False)


def test_join_keeps_its_defaults() -> None:
    args = _parse(join_cmd, ["--bootstrap", "b", "--announce", "a1", "a2", "--quiet"])
    assert (args.identity, args.token, args.http) == ("p2ptrain-identity.key", None, None)
    assert (args.announce, args.quiet) == (["a1", "a2"], True)


def test_bootstrap_keeps_its_defaults() -> None:
    args = _parse(bootstrap_cmd, ["--identity", "k", "--http", "8080"])
    assert (args.listen, args.announce, args.http) == ("/ip4/0.0.0.0/tcp/7400", [], "8080")
    with pytest.raises(SystemExit):
        _parse(bootstrap_cmd, [])  # --identity is required


def test_the_shared_flags_read_the_same_everywhere() -> None:
    helps = {}
    for module in (join_cmd, bootstrap_cmd):
        parser = argparse.ArgumentParser()
        module.add_arguments(parser)
        helps[module] = {a.dest: a.help for a in parser._actions}
    assert helps[join_cmd]["http"] == helps[bootstrap_cmd]["http"]


def test_join_refuses_a_checkpoint_dir_or_metrics_log_it_could_not_use(tmp_path: Path) -> None:
    """Found out after the first plan, a checkpoint directory that is a file trained the whole
    run saving nothing (exit 0), and a metrics log in a missing folder crashed the worker."""
    from p2ptrain.app import main

    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    join = ["join", "--bootstrap", f"/ip4/127.0.0.1/tcp/1/p2p/{A}"]
    assert main([*join, "--checkpoint-dir", str(a_file)]) == 2
    assert main([*join, "--metrics-log", str(a_file / "m.jsonl")]) == 2
    assert main([*join, "--metrics-log", str(tmp_path)]) == 2  # a directory, not a file


def test_join_refuses_a_token_that_cannot_admit_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A token for another node (a wrong --identity) or of another organiser was ignored: the
    node joined and said no member held a planner token, though it was given one."""
    import time

    from p2ptrain.app import main
    from p2ptrain.identity import load_or_create_identity, peer_id_of
    from p2ptrain.records.token import issue_token

    organiser = load_or_create_identity(str(tmp_path / "organiser.key"))
    bootstrap = f"/ip4/127.0.0.1/tcp/1/p2p/{peer_id_of(organiser)}"
    own = str(tmp_path / "own.key")
    other = peer_id_of(load_or_create_identity(str(tmp_path / "other.key")))
    later = time.time() + 3600
    for token, says in (
        (issue_token(organiser, other, True, later), "issued to"),
        (
            issue_token(load_or_create_identity(str(tmp_path / "x.key")), other, True, later),
            "not by the organiser",
        ),
        (issue_token(organiser, peer_id_of(load_or_create_identity(own)), True, 1.0), "expired"),
        ("p2ptrain-token:nonsense", "malformed"),
    ):
        text = token if isinstance(token, str) else token.encode()
        assert main(["join", "--bootstrap", bootstrap, "--identity", own, "--token", text]) == 2
        assert says in capsys.readouterr().err


def test_join_refuses_a_peer_address_without_its_id_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The control process found out: its error line, then the supervisor's second one."""
    from p2ptrain.app import main

    assert main(["join", "--bootstrap", "/ip4/127.0.0.1/tcp/7400"]) == 2
    ok = f"/ip4/127.0.0.1/tcp/1/p2p/{A}"
    assert main(["join", "--bootstrap", ok, "--via", "/ip4/127.0.0.1/tcp/7401"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "--bootstrap must end in /p2p/" in err[0] and "--via" in err[1]


def test_bootstrap_refuses_a_revoked_file_it_cannot_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A missing --revoked file only warned: a typo in its name left every revoked token
    admitted. The port is never reached: the file is judged first."""
    from p2ptrain.app import main

    boot = ["bootstrap", "--identity", str(tmp_path / "k"), "--listen", "/ip4/127.0.0.1/tcp/0"]
    missing = tmp_path / "revoked.txt"
    assert main([*boot, "--revoked", str(missing)]) == 2
    assert f"touch {missing}" in capsys.readouterr().err
    assert main([*boot, "--revoked", str(tmp_path)]) == 2  # a directory
    assert "cannot be read" in capsys.readouterr().err
