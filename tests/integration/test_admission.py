"""Admission and plan authority through the shipped CLI: `p2ptrain id`, `token issue`, and a run
with `admission = "token"`, as an organiser and two volunteers run them."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import PYTHON, REPO_ROOT, ProcessReaper
from tests.control.swarm_helpers import (
    alive_ids,
    join_argv,
    peer_id,
    start_bootstrap_with,
    start_node,
    wait_for_status,
)

pytestmark = pytest.mark.integration


def cli(*args: str) -> str:
    done = subprocess.run(
        [PYTHON, "-m", "p2ptrain", *args],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO_ROOT,
        timeout=60,
    )
    return done.stdout.strip()


def start_bootstrap(reaper: ProcessReaper, tmp: Path, *flags: str) -> str:
    """`p2ptrain bootstrap` with the organiser's key in tmp; its address."""
    return start_bootstrap_with(reaper, tmp, *flags)[1]


def planner_token(tmp: Path, peer: str) -> str:
    """What the organiser runs for a volunteer's peer id: `token issue --planner`."""
    return cli(
        "token",
        "issue",
        "--identity",
        str(tmp / "boot.key"),
        "--peer",
        peer,
        "--planner",
        "--expires-days",
        "1",
    )


def start_trainer(
    reaper: ProcessReaper, tmp: Path, boot_addr: str, home: Path
) -> subprocess.Popen[bytes]:
    """A `p2ptrain join` node that trains, with a planner token of tmp's organiser, its key,
    checkpoints, metrics (metrics.jsonl) and log (node.log) in `home`, its working directory."""
    home.mkdir(exist_ok=True)
    peer = cli("id", "--identity", str(home / "node.key"))
    argv = join_argv(
        boot_addr,
        home / "node.key",
        "--checkpoint-dir",
        str(home / "ckpt"),
        "--metrics-log",
        str(home / "metrics.jsonl"),
        "--quiet",
        token=planner_token(tmp, peer),
    )
    return reaper.start(argv, stderr_path=home / "node.log", cwd=home)


def test_only_token_holders_join_and_plan_a_token_run(reaper: ProcessReaper, tmp_path: Path):
    run = tmp_path / "run.toml"
    run.write_text('[run]\nrun_id = "closed"\nadmission = "token"\n')
    boot_addr = start_bootstrap(reaper, tmp_path, "--run", str(run))
    # a volunteer sends its peer id; the organiser signs a planner token for it
    volunteer = cli("id", "--identity", str(tmp_path / "volunteer.key"))
    token = planner_token(tmp_path, volunteer)
    (tmp_path / "volunteer.token").write_text(token + "\n")
    _, member_addr = start_node(
        reaper,
        join_argv(
            boot_addr,
            tmp_path / "volunteer.key",
            token=str(tmp_path / "volunteer.token"),
            control_only=True,
        ),
        tmp_path / "volunteer.log",
    )
    assert peer_id(member_addr) == volunteer
    # a stranger without a token is refused on its side: one clear line, exit code 2
    stranger = subprocess.run(
        join_argv(boot_addr, tmp_path / "stranger.key", control_only=True),
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=90,
    )
    assert stranger.returncode == 2, stranger.stderr[-2000:]
    assert "admits holders of the organiser's tokens only" in stranger.stderr
    # the token holder is the swarm's planner and planned alone; the stranger appears nowhere
    status, ok = wait_for_status(
        boot_addr,
        lambda s: (
            alive_ids(s) == {volunteer} and s["planner"] == volunteer and s["plan"] is not None
        ),
        timeout_s=40,
    )
    assert ok, status
    assert status is not None and status["plan"]["pipelines"] == [[volunteer]]


def test_a_revoked_planner_token_stops_counting_before_it_expires(
    reaper: ProcessReaper, tmp_path: Path
):
    """The organiser revokes a planner's token through the CLI (`token revoke`, appended to the
    bootstrap's --revoked file): the swarm drops that planner and elects another holder."""
    revoked = tmp_path / "revoked.txt"
    revoked.write_text("# revocations\n")
    boot_addr = start_bootstrap(reaper, tmp_path, "--revoked", str(revoked))
    planners = []
    for name in ("first", "second"):
        peer = cli("id", "--identity", str(tmp_path / f"{name}.key"))
        token = planner_token(tmp_path, peer)
        _, addr = start_node(
            reaper,
            join_argv(boot_addr, tmp_path / f"{name}.key", token=token, control_only=True),
            tmp_path / f"{name}.log",
        )
        assert peer_id(addr) == peer
        planners.append(peer)
    status, ok = wait_for_status(
        boot_addr, lambda s: alive_ids(s) == set(planners) and s["planner"] in planners, 60
    )
    assert ok, status
    assert status is not None
    elected = status["planner"]
    line = cli("token", "revoke", "--identity", str(tmp_path / "boot.key"), "--peer", elected)
    with revoked.open("a") as f:
        f.write(line + "\n")
    (other,) = set(planners) - {elected}
    status, ok = wait_for_status(boot_addr, lambda s: s["planner"] == other, 60)
    assert ok, status
