"""A member's control process restarted (the supervisor's restart after a crash) while the
bootstrap is down rejoins from what its node kept (control/rejoin.py): the run the organiser
signed and the members it was connected to. It used to retry the bootstrap for ever: every
loop of the node waits for the join, so it neither worked nor exited while the other members
kept hearing it. Real control nodes on loopback, in one process."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
import trio

from p2ptrain.control.node import ControlNode, NodeConfig
from p2ptrain.records import RunSpec

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _start(nursery: trio.Nursery, node: ControlNode) -> trio.CancelScope:
    scope = trio.CancelScope()

    async def run(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        with scope:
            await node.run(task_status=task_status)

    await nursery.start(run)
    return scope


def test_a_restarted_control_rejoins_while_the_bootstrap_is_down(tmp_path: Path) -> None:
    ipc = str(tmp_path / "control.sock")
    kept = tmp_path / "rejoin.json"
    port, seed = _free_port(), os.urandom(32)

    def quiet(**fields: object) -> NodeConfig:
        return NodeConfig(print_addr=False, print_progress=False, **fields)  # type: ignore[arg-type]

    async def scenario() -> tuple[bool, bool, bool]:
        boot = ControlNode(
            quiet(seed=os.urandom(32), role="bootstrap", run=RunSpec().replace(run_id="rejoin"))
        )

        def member() -> ControlNode:  # the same node's control process, before and after
            return ControlNode(
                quiet(
                    seed=seed,
                    role="control-only",
                    bootstrap_addr=boot.addrs[0],
                    listen_addr=f"/ip4/127.0.0.1/tcp/{port}",
                    ipc_path=ipc,
                )
            )

        async with trio.open_nursery() as nursery:
            boot_scope = await _start(nursery, boot)
            other = ControlNode(
                quiet(seed=os.urandom(32), role="control-only", bootstrap_addr=boot.addrs[0])
            )
            await _start(nursery, other)
            first = member()
            first_scope = await _start(nursery, first)
            with trio.fail_after(60):  # it kept the other member's address
                while other.peer_id not in (kept.read_text() if kept.exists() else ""):  # noqa: ASYNC110
                    await trio.sleep(0.5)
            boot_scope.cancel()  # the bootstrap goes down, then the member's control crashes
            first_scope.cancel()
            await trio.sleep(1.0)
            again = member()
            await _start(nursery, again)
            with trio.move_on_after(30):
                await again.state.joined.wait()
            joined = again.state.joined.is_set()
            connected = False
            with trio.move_on_after(30):
                while not connected:
                    peers = {p.to_base58() for p in again.host.get_connected_peers()}
                    connected = other.peer_id in peers
                    await trio.sleep(0.5)
            run_ok = again.state.view.run is not None and again.state.view.run.run_id == "rejoin"
            nursery.cancel_scope.cancel()
        return joined, connected, run_ok

    joined, connected, run_ok = trio.run(scenario)
    assert joined and run_ok  # the organiser's run, from what the node kept
    assert connected
    assert json.loads(kept.read_text())["peers"]


def test_a_new_node_joins_through_a_member_while_the_bootstrap_is_down() -> None:
    """A brand-new node keeps nothing: with `--via` it takes the organiser-signed run from a
    member and meets the swarm through it; it used to retry the bootstrap for ever."""

    def quiet(**fields: object) -> NodeConfig:
        return NodeConfig(print_addr=False, print_progress=False, **fields)  # type: ignore[arg-type]

    async def scenario() -> tuple[bool, bool, bool, bool]:
        boot = ControlNode(
            quiet(seed=os.urandom(32), role="bootstrap", run=RunSpec().replace(run_id="via"))
        )
        async with trio.open_nursery() as nursery:
            boot_scope = await _start(nursery, boot)
            member = ControlNode(
                quiet(seed=os.urandom(32), role="control-only", bootstrap_addr=boot.addrs[0])
            )
            await _start(nursery, member)
            with trio.fail_after(30):
                await member.state.joined.wait()
            boot_scope.cancel()
            await trio.sleep(1.0)
            newcomer = ControlNode(
                quiet(
                    seed=os.urandom(32),
                    role="control-only",
                    bootstrap_addr=boot.addrs[0],
                    via=(member.addrs[0],),
                )
            )
            await _start(nursery, newcomer)
            with trio.move_on_after(30):
                await newcomer.state.joined.wait()
            joined = newcomer.state.joined.is_set()
            view = newcomer.state.view
            run_ok = view.run is not None and view.run.run_id == "via"
            met = False
            with trio.move_on_after(30):  # each hears the other's record
                while not met:
                    met = newcomer.peer_id in member.state.view.members and (
                        member.peer_id in view.members
                    )
                    await trio.sleep(0.5)
            kept = newcomer.state.run_envelope is not None  # a restart rejoins from it
            nursery.cancel_scope.cancel()
        return joined, run_ok, met, kept

    joined, run_ok, met, kept = trio.run(scenario)
    assert joined and run_ok  # the organiser's run, through the member
    assert met and kept
