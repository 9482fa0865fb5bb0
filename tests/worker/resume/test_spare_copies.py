"""Spares' copies of a lone holder's stage (worker/resume/copies.py): who copies what, what the
holder serves and to whom, and what the spare keeps, over real loopback sockets."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import pytest
import torch

from p2ptrain.errors import WireError
from p2ptrain.records import LinkFacts, Plan, RunSpec
from p2ptrain.records.lineage import next_lineage
from p2ptrain.train.checkpoint import StageSnapshot, list_states, record_step, stamped_path
from p2ptrain.train.model import build_stage
from p2ptrain.train.optim import make_optimizer
from p2ptrain.worker.resume.copies import (
    HEAD,
    CopyRequest,
    CopyServer,
    copy_duty,
    copy_gap_s,
    newest_step,
    receive_copy,
)
from p2ptrain.worker.resume.copy_sources import read_sources, record_copy, without_live_sources
from p2ptrain.worker.resume.start_step import choose_start_step, own_announcement, placement
from p2ptrain.worker.resume.state_transfer import BUSY, FOUND, MISSING, SIZE, StateServer

SPEC = RunSpec().replace(
    n_layer=2, n_head=2, n_embd=16, block_size=8, steps=100, spare_copy_interval_s=30.0
)
SPARES = ("s0", "s1", "s2", "s3", "s4")


def one_pipeline(spares: tuple[str, ...] = SPARES, epoch: int = 1) -> Plan:
    return Plan(
        term=1,
        epoch=epoch,
        planner="h",
        stages=2,
        pipelines=(("h", "g"),),
        spares=spares,
        data_addrs={},
        cost_s=1.0,
        lineage=next_lineage((), False, 1, epoch, "h"),
    )


PLAN = one_pipeline()


def test_each_lone_stage_is_copied_by_two_spares_at_most() -> None:
    duties = {spare: copy_duty(PLAN, spare, 2) for spare in SPARES}
    assert duties == {
        "s0": (range(0, 1), "h"),
        "s1": (range(1, 2), "g"),
        "s2": (range(0, 1), "h"),
        "s3": (range(1, 2), "g"),
        "s4": None,  # a fifth spare would only cost the holders' uplinks
    }
    assert copy_duty(PLAN, "h", 2) is None  # a holder copies nobody
    replicas = PLAN.replace(pipelines=(("h", "g"), ("i", "j")))
    assert all(copy_duty(replicas, s, 2) is None for s in SPARES)  # replicas are the copies


def test_a_copy_takes_a_tenth_of_the_link_at_most() -> None:
    slow = LinkFacts(rtt_s=0.1, rate_mbps=8.0)  # 1 MB a second
    assert copy_gap_s(SPEC, 1_000_000, None) == 30.0  # the run's interval on a LAN
    assert copy_gap_s(SPEC, 100_000_000, slow) == pytest.approx(1000.0)  # 100 s of moving


def _holder_dir(tmp_path: Path) -> Path:
    """The holder of stage 0: states at steps 20 and 40 under PLAN, and one under another plan
    (another lineage) at 60."""
    directory = tmp_path / "holder"
    model = build_stage(SPEC, 0, 2)
    optimizer = make_optimizer(model, SPEC)
    for step, tag in ((20, PLAN.state_tag), (40, PLAN.state_tag), (60, "0123456789abcdef-e9")):
        with torch.no_grad():
            next(model.parameters()).add_(0.5)
        record_step(directory, SPEC, model, StageSnapshot.take(model, optimizer, step), tag)
    return directory


def _server(tmp_path: Path) -> CopyServer:
    states = StateServer(None)
    states.serve_run(SPEC, _holder_dir(tmp_path), PLAN)
    return CopyServer(states, "h", None)


def _exchange(server: CopyServer, remote: str, request: bytes, spare_dir: Path) -> object:
    """`request` sent to `server` as `remote` over a loopback socket: what `receive_copy` made
    of the reply, or the exception it raised."""

    async def run() -> object:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await server.serve(remote, reader, writer)

        listener = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = listener.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request)
        await writer.drain()
        try:
            asked = CopyRequest.decode(request[4:])
            return await receive_copy(reader, asked, SPEC, PLAN, spare_dir, "test")
        except Exception as exc:
            return exc
        finally:
            writer.close()
            listener.close()

    return asyncio.run(run())


def test_a_spare_gets_the_holders_newest_state_of_the_plan_then_waits_its_gap(
    tmp_path: Path,
) -> None:
    server = _server(tmp_path)
    spare_dir = tmp_path / "spare"
    assert server.refusal("s0") is None
    got = _exchange(server, "s0", CopyRequest(range(0, 1), 0).encode(), spare_dir)
    # step 40: the step-60 state was saved under another lineage, not this plan
    assert got == (40, stamped_path(spare_dir, range(0, 1), 40, PLAN.state_tag))
    assert isinstance(got, tuple)
    held = stamped_path(tmp_path / "holder", range(0, 1), 40, PLAN.state_tag)
    assert got[1].read_bytes() == held.read_bytes()
    assert newest_step(spare_dir, range(0, 1), PLAN) == 40
    # another spare has a gap of its own
    assert _exchange(server, "s2", CopyRequest(range(0, 1), 0).encode(), spare_dir / "b") == (
        40,
        stamped_path(spare_dir / "b", range(0, 1), 40, PLAN.state_tag),
    )
    # the first asking again at once is told BUSY (a copy costs the holder's uplink)
    assert _exchange(server, "s0", CopyRequest(range(0, 1), 0).encode(), spare_dir / "c") is None
    assert list_states(spare_dir / "c") == []


def test_nothing_newer_other_layers_and_strangers_get_no_copy(tmp_path: Path) -> None:
    server = _server(tmp_path)
    spare_dir = tmp_path / "spare"
    assert _exchange(server, "s0", CopyRequest(range(0, 1), 41).encode(), spare_dir) is None
    assert _exchange(server, "s1", CopyRequest(range(1, 2), 0).encode(), spare_dir) is None
    assert server.refusal("g") == MISSING  # a holder, not a spare: nothing parsed
    assert server.refusal("stranger") == MISSING
    assert list_states(spare_dir) == []
    off = StateServer(None)
    off.serve_run(SPEC.replace(spare_copy_interval_s=0.0), tmp_path / "holder", PLAN)
    assert CopyServer(off, "h", None).refusal("s0") == MISSING


def _reply(step: int, body: bytes, digest: bytes | None = None) -> bytes:
    head = HEAD.pack(step, digest if digest is not None else hashlib.sha256(body).digest())
    return FOUND + head + SIZE.pack(len(body)) + body


def _receive(reply: bytes, min_step: int, directory: Path) -> object:
    async def run() -> object:
        reader = asyncio.StreamReader()
        reader.feed_data(reply)
        reader.feed_eof()
        request = CopyRequest(range(0, 1), min_step)
        return await receive_copy(reader, request, SPEC, PLAN, directory, "test")

    return asyncio.run(run())


def test_a_copy_before_the_step_asked_past_the_run_or_of_other_bytes_is_refused(
    tmp_path: Path,
) -> None:
    body = stamped_path(_holder_dir(tmp_path), range(0, 1), 40, PLAN.state_tag).read_bytes()
    spare_dir = tmp_path / "spare"
    with pytest.raises(WireError, match="asked for one from 41"):
        _receive(_reply(40, body), 41, spare_dir)
    with pytest.raises(WireError, match="step 101"):
        _receive(_reply(101, body), 0, spare_dir)  # the run has 100 steps
    with pytest.raises(ValueError, match="sha256"):
        _receive(_reply(40, body, digest=b"\0" * 32), 0, spare_dir)
    assert list(spare_dir.glob("*")) == []  # nothing of a refused copy is left
    assert _receive(_reply(40, body), 0, spare_dir) == (
        40,
        stamped_path(spare_dir, range(0, 1), 40, PLAN.state_tag),
    )
    with pytest.raises(WireError, match="held here already"):
        _receive(_reply(40, body), 0, spare_dir)  # never overwritten
    for status in (MISSING, BUSY):
        assert _receive(status, 0, spare_dir) is None


def test_copies_are_announced_only_once_their_holder_is_gone(tmp_path: Path) -> None:
    spare_dir = tmp_path / "spare"
    body = stamped_path(_holder_dir(tmp_path), range(0, 1), 40, PLAN.state_tag).read_bytes()
    _, path = _receive(_reply(40, body), 0, spare_dir)  # type: ignore[misc]
    record_copy(spare_dir, path, "h")
    mine = own_announcement(spare_dir, PLAN.state_rank)
    assert set(mine["L0-1"]) == {40}
    assert without_live_sources(mine, spare_dir, PLAN.peers()) == {}  # h is a member
    assert without_live_sources(mine, spare_dir, {"g", *SPARES}) == mine  # h crashed
    (spare_dir / "copies.json").write_text('{"stage-L0-1": [1, 2], "x": 3')  # not JSON
    assert read_sources(spare_dir) == {}
    (spare_dir / "copies.json").write_text('[["stage-L0-1.step40.pt", "h"]]')  # not a mapping
    assert without_live_sources(mine, spare_dir, PLAN.peers()) == mine


def test_a_copy_does_not_hold_a_hand_over_back_to_its_step() -> None:
    """The donor d hands stage 0 over to the spare s that copied it at step 40; d saved it at
    43 when its session ended. s's copy, were it announced, would outvote d's newer state: s
    is placed there and holds those blocks at its newest step, so only 40 is usable."""
    new = PLAN.replace(pipelines=(("s", "g"),), spares=("d",), epoch=2)
    _, placed = placement(new, 2)
    donor = {"L0-1": {40: "a40", 43: "a43"}}
    mate = {"L1-2": {40: "b40", 43: "b43"}}
    with_copy = {"s": {"L0-1": {40: "a40"}}, "g": mate, "d": donor}
    assert choose_start_step(list(placed), with_copy, placed, ["s", "g", "d"]).step == 40
    without = {"s": {}, "g": mate, "d": donor}
    assert choose_start_step(list(placed), without, placed, ["s", "g", "d"]).step == 43
