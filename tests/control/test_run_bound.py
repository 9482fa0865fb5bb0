"""Issue 26, low items, in the control plane: a token or an envelope of another run of the same
organiser opens nothing here; every page of a long revocation list reaches a node, in any order;
`token issue --run-id/--run` binds a token to a run."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any, cast

import pytest

from p2ptrain import identity
from p2ptrain.cli import token_cmd
from p2ptrain.control import wire
from p2ptrain.control.authored import revocation_messages
from p2ptrain.control.intake import Intake
from p2ptrain.control.state import NodeState
from p2ptrain.control.view import SwarmView
from p2ptrain.errors import UserError
from p2ptrain.records import PeerRecord, RunSpec, Token, issue_revocation, issue_token

ORGANISER = os.urandom(32)
BOOT = identity.peer_id_of(ORGANISER)


def node(seed: bytes, run_id: str = "run-a", role: str = "control-only") -> NodeState:
    view = SwarmView(
        self_id=identity.peer_id_of(seed),
        role=role,
        planner_capable=True,
        started_at=time.monotonic(),
        bootstrap_id=BOOT,
        run=RunSpec().replace(run_id=run_id, admission="token"),
    )
    return NodeState(
        seed=seed, role=role, peer_id=view.self_id, host=cast(Any, None), view=view, hardware={}
    )


def record_of(seed: bytes, run_id: str, planner: bool = True) -> PeerRecord:
    token = issue_token(ORGANISER, identity.peer_id_of(seed), planner, 2e9, run_id)
    return PeerRecord(
        addrs=(),
        data_addrs=(),
        role="control-only",
        planner_capable=True,
        token=token,
        version="0",
        hardware={},
    )


def test_a_token_of_another_run_of_the_organiser_admits_nobody() -> None:
    state = node(os.urandom(32))
    view, now = state.view, time.monotonic()
    here, elsewhere, anywhere = os.urandom(32), os.urandom(32), os.urandom(32)
    for seed, run_id in ((here, "run-a"), (elsewhere, "run-b"), (anywhere, "")):
        env = wire.decode(wire.encode(seed, 1, record_of(seed, run_id), run_id="run-a"))
        view.accept(env, now)
    assert identity.peer_id_of(here) in view.members
    assert identity.peer_id_of(anywhere) in view.members  # a token bound to no run
    assert identity.peer_id_of(elsewhere) not in view.members
    # our own planner token for another run does not let us claim here
    view.authority.own_token = issue_token(ORGANISER, view.self_id, True, 2e9, "run-b")
    assert not view.may_plan(view.self_id)
    view.authority.own_token = issue_token(ORGANISER, view.self_id, True, 2e9, "run-a")
    assert view.may_plan(view.self_id)


def test_every_page_of_a_long_revocation_list_arrives_in_any_order() -> None:
    boot = node(ORGANISER, role="bootstrap")
    revoked = [identity.peer_id_of(os.urandom(32)) for _ in range(450)]
    for peer in revoked:
        boot.view.authority.revocations[peer] = issue_revocation(ORGANISER, peer)
    pages = revocation_messages(boot)
    assert len(pages) == 3 and all(len(p) <= wire.MAX_ENVELOPE_BYTES for p in pages)
    assert len([k for k in boot.latest if k[1] == "revoked"]) == 3  # sync serves every page
    receiver = node(os.urandom(32))
    intake = Intake(receiver)
    for data in reversed(pages):  # gossip took other paths: newest page first
        env = wire.decode(data)
        assert env.run_id == "run-a"
        assert intake.apply(env, data, BOOT, "gossip", time.monotonic())
    assert set(receiver.view.authority.revocations) == set(revoked)
    assert len([k for k in receiver.latest if k[1] == "revoked"]) == 3


def issue(capsys: pytest.CaptureFixture[str], tmp_path: Path, *extra: str) -> tuple[Token, str]:
    key = tmp_path / "boot.key"
    identity.load_or_create_identity(key)
    parser = argparse.ArgumentParser()
    token_cmd.add_arguments(parser)
    peer = identity.peer_id_of(os.urandom(32))
    args = parser.parse_args(["issue", "--identity", str(key), "--peer", peer, *extra])
    assert token_cmd.run(args) == 0
    out, err = capsys.readouterr()
    return Token.decode(out.strip()), err


def test_token_issue_binds_the_run_it_is_told(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    token, err = issue(capsys, tmp_path, "--run-id", "run-a")
    assert token.run_id == "run-a" and not err
    spec = tmp_path / "run.toml"
    spec.write_text('[run]\nrun_id = "from-spec"\n')
    token, _ = issue(capsys, tmp_path, "--run", str(spec))
    assert token.run_id == "from-spec"
    token, err = issue(capsys, tmp_path)  # as before: valid in every run, and says so
    assert token.run_id == "" and "every run" in err


def test_token_issue_and_revoke_refuse_what_is_no_peer_id(tmp_path: Path) -> None:
    """`--peer notapeer` printed a token nobody could ever use, exit code 0."""
    key = tmp_path / "boot.key"
    identity.load_or_create_identity(key)
    parser = argparse.ArgumentParser()
    token_cmd.add_arguments(parser)
    for action in ("issue", "revoke"):
        args = parser.parse_args([action, "--identity", str(key), "--peer", "notapeer"])
        with pytest.raises(UserError, match="not a peer id"):
            token_cmd.run(args)
