"""How the control process's exit reads to its supervisor (control/node.py: run_node)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import trio

from p2ptrain.control import node as node_module


def test_a_control_process_that_ends_unasked_exits_1_not_finished(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """py-libp2p's teardown race ("Nursery is closed") is passed over by run_trio at any time:
    an end mid-run returned 0, which the supervisor reads as "finished", stopping the node and
    its worker. Unless the node was asked to stop, the exit is 1 now: a restart."""
    monkeypatch.setattr(node_module, "run_trio", lambda *args: None)  # the race: it just ends
    stopping = trio.Event()
    control = SimpleNamespace(state=SimpleNamespace(stopping=stopping), stop_worker=None)
    assert node_module.run_node(control) == 1  # type: ignore[arg-type]
    stopping.set()
    assert node_module.run_node(control) == 0  # type: ignore[arg-type]
