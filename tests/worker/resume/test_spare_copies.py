"""Spares' copies of a lone holder's stage (worker/resume/copies.py, copy_server.py): who copies
what, what the holder serves and to whom, and what the spare keeps, over real loopback sockets."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import pytest
import torch

from p2ptrain.errors import UserError, WireError
from p2ptrain.records import LinkFacts, Plan, RunSpec, StageCopy
from p2ptrain.records.lineage import next_lineage
from p2ptrain.train.checkpoint import record_step, save_stage
from p2ptrain.train.checkpoint_folder import SavedState, list_states, stamped_path
from p2ptrain.train.model import build_stage
from p2ptrain.train.optim import make_optimizer
from p2ptrain.train.snapshot import StageSnapshot
from p2ptrain.train.state_digest import file_sha256
from p2ptrain.worker.resume.copies import (
    copy_notes,
    drop_stale,
    next_step,
    receive_copy,
    stale_after_s,
)
from p2ptrain.worker.resume.copy_server import (
    HEAD,
    CopyRequest,
    CopyServer,
    copies_on,
    copy_duties,
    copy_gap_s,
)
from p2ptrain.worker.resume.copy_sources import (
    drop_copies,
    read_sources,
    record_copy,
    without_live_sources,
)
from p2ptrain.worker.resume.own_states import own_announcement
from p2ptrain.worker.resume.start_choice import StartPoint, choose_start_step, placement
from p2ptrain.worker.resume.state_transfer import BUSY, FOUND, MISSING, SIZE, StateServer

SPEC = RunSpec().replace(
    n_layer=2, n_head=2, n_embd=16, block_size=8, steps=100, spare_copy_interval_s=30.0
)
SPARES = ("s0", "s1", "s2")
OTHER_TAG = "0123456789abcdef-e9"  # a lineage PLAN does not descend from


def one_pipeline(spares: tuple[str, ...] = SPARES) -> Plan:
    return Plan(
        term=1,
        epoch=1,
        planner="h",
        stages=2,
        pipelines=(("h", "g"),),
        spares=spares,
        data_addrs={},
        cost_s=1.0,
        lineage=next_lineage((), False, 1, 1, "h"),
    )


PLAN = one_pipeline()
TAG = PLAN.state_tag


def test_each_lone_stage_has_one_copier_and_a_lone_spare_copies_every_stage() -> None:
    duties = {spare: copy_duties(PLAN, spare, 2) for spare in SPARES}
    # one copier a stage: two copies at different steps would contest each other at a restart
    assert duties == {"s0": [(range(0, 1), "h")], "s1": [(range(1, 2), "g")], "s2": []}
    alone = one_pipeline(spares=("s0",))
    assert copy_duties(alone, "s0", 2) == [(range(0, 1), "h"), (range(1, 2), "g")]
    assert copy_duties(PLAN, "h", 2) == []  # a holder copies nobody
    replicas = PLAN.replace(pipelines=(("h", "g"), ("i", "j")))
    assert all(copy_duties(replicas, s, 2) == [] for s in SPARES)  # replicas are the copies
    # a donor (a spare only until its own stage is fetched) copies nothing: the others do all
    handing_over = one_pipeline(spares=("s0", "d")).replace(donors=("d",))
    assert copy_duties(handing_over, "s0", 2) == [(range(0, 1), "h"), (range(1, 2), "g")]
    assert copy_duties(handing_over, "d", 2) == []


def test_copies_need_interval_saves_and_take_a_tenth_of_the_link_at_most() -> None:
    slow = LinkFacts(rtt_s=0.1, rate_mbps=8.0)  # 1 MB a second
    assert copy_gap_s(SPEC, 1_000_000, None) == 30.0  # the run's interval on a LAN
    assert copy_gap_s(SPEC, 100_000_000, slow) == pytest.approx(1000.0)  # 100 s of moving
    assert copies_on(SPEC) and not copies_on(SPEC.replace(checkpoint_interval=0))
    assert not copies_on(SPEC.replace(spare_copy_interval_s=0.0))
    with pytest.raises(UserError, match="spare_copy_interval_s"):
        SPEC.replace(spare_copy_interval_s=0.01)  # a busy loop, not an interval


def _holder_dir(tmp_path: Path) -> Path:
    """The holder of stage 0: states at steps 20 and 40 under PLAN, one under another lineage
    at 60, and one at the run's last step, 100."""
    directory = tmp_path / "holder"
    model = build_stage(SPEC, 0, 2)
    optimizer = make_optimizer(model, SPEC)
    for step, tag in ((20, TAG), (40, TAG), (60, OTHER_TAG), (100, TAG)):
        with torch.no_grad():
            next(model.parameters()).add_(0.5)
        record_step(directory, SPEC, model, StageSnapshot.take(model, optimizer, step), tag)
    return directory


def _server(tmp_path: Path, latest: Plan = PLAN) -> CopyServer:
    states = StateServer(None)
    states.serve_run(SPEC, _holder_dir(tmp_path), PLAN)
    return CopyServer(states, "h", None, lambda: latest)


def _exchange(server: CopyServer, remote: str, request: CopyRequest, spare_dir: Path) -> object:
    """`request` sent to `server` as `remote` over a loopback socket: what `receive_copy` made
    of the reply."""

    async def run() -> object:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await server.serve(remote, reader, writer)

        listener = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = listener.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request.encode())
        await writer.drain()
        try:
            return await receive_copy(reader, request, SPEC, PLAN, spare_dir, "h")
        finally:
            writer.close()
            listener.close()

    return asyncio.run(run())


def _copy(directory: Path, step: int) -> SavedState:
    path = stamped_path(directory, range(0, 1), step, TAG)
    return SavedState("L0-1", step, TAG, path)


def test_the_copier_gets_the_holders_newest_state_before_the_last_then_waits_its_gap(
    tmp_path: Path,
) -> None:
    server = _server(tmp_path)
    spare_dir = tmp_path / "spare"
    assert server.refusal("s0") is None
    # step 40: 60 was saved under another lineage, and a state at the run's last step would
    # make every start agreement refuse the spare's announcement
    assert _exchange(server, "s0", CopyRequest(range(0, 1), 0), spare_dir) == _copy(spare_dir, 40)
    held = stamped_path(tmp_path / "holder", range(0, 1), 40, TAG)
    assert _copy(spare_dir, 40).path.read_bytes() == held.read_bytes()
    assert read_sources(spare_dir) == {_copy(spare_dir, 40).path.name: "h"}
    assert next_step(spare_dir, (range(0, 1), "h"), PLAN) == 41
    assert next_step(spare_dir, (range(0, 1), "x"), PLAN) == 0  # only that holder's copies
    # asked again at once: BUSY (a copy costs the holder's uplink), nothing kept
    again = tmp_path / "again"
    assert _exchange(server, "s0", CopyRequest(range(0, 1), 0), again) is None
    assert list_states(again) == []


def test_a_spares_report_names_each_duty_and_its_newest_copy(tmp_path: Path) -> None:
    """What `status` shows of a spare (control/worker_link.py puts it on its metrics)."""
    spare_dir = tmp_path / "spare"
    duties = [(range(0, 1), "h"), (range(1, 2), "g")]
    assert copy_notes(spare_dir, duties, PLAN) == (StageCopy(0, 1, "h"), StageCopy(1, 2, "g"))
    _exchange(_server(tmp_path), "s0", CopyRequest(range(0, 1), 0), spare_dir)
    assert copy_notes(spare_dir, duties, PLAN) == (StageCopy(0, 1, "h", 40), StageCopy(1, 2, "g"))
    assert StageCopy(0, 1, "h", 40).layers == "L0-1"  # as the logs and files name them


def test_only_the_copier_of_our_stage_is_served_and_only_what_it_lacks(tmp_path: Path) -> None:
    server = _server(tmp_path)
    spare_dir = tmp_path / "spare"
    assert _exchange(server, "s0", CopyRequest(range(0, 1), 41), spare_dir) is None
    assert _exchange(server, "s0", CopyRequest(range(1, 2), 0), spare_dir) is None
    for remote in ("s1", "s2", "g", "stranger"):  # another stage's copier, no duty, no spare
        assert server.refusal(remote) == MISSING, remote
    assert list_states(spare_dir) == []
    # a plan of the same placement adds a spare: the session goes on, and the newcomer (the
    # only spare now) copies both stages
    assert _server(tmp_path / "b", latest=one_pipeline(("new",))).refusal("new") is None
    off = StateServer(None)
    off.serve_run(SPEC.replace(spare_copy_interval_s=0.0), tmp_path / "holder", PLAN)
    assert CopyServer(off, "h", None, lambda: PLAN).refusal("s0") == MISSING


def test_the_copiers_duty_is_checked_before_any_stage_bound_is_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stage's size bound builds the stage on the meta device, on the transport's loop: only
    for the layers the copier copies from us."""
    states = StateServer(None)
    states.serve_run(SPEC, _holder_dir(tmp_path), PLAN)
    asked: list[range] = []
    bound = states.max_bytes
    monkeypatch.setattr(states, "max_bytes", lambda layers: asked.append(layers) or bound(layers))
    server = CopyServer(states, "h", None, lambda: PLAN)
    for layers in (range(0, 2), range(1, 2)):  # the whole model, another holder's stage
        assert _exchange(server, "s0", CopyRequest(layers, 0), tmp_path / "spare") is None
    assert asked == []
    assert _exchange(server, "s0", CopyRequest(range(0, 1), 0), tmp_path / "spare") is not None
    assert asked == [range(0, 1)]


def _reply(step: int, body: bytes, tag: str | None = TAG, digest: bytes | None = None) -> bytes:
    raw_tag = (tag or "").encode()
    sha = digest if digest is not None else hashlib.sha256(body).digest()
    return FOUND + HEAD.pack(step, sha, len(raw_tag)) + raw_tag + SIZE.pack(len(body)) + body


def _receive(reply: bytes, min_step: int, directory: Path) -> object:
    async def run() -> object:
        reader = asyncio.StreamReader()
        reader.feed_data(reply)
        reader.feed_eof()
        request = CopyRequest(range(0, 1), min_step)
        return await receive_copy(reader, request, SPEC, PLAN, directory, "h")

    return asyncio.run(run())


def test_a_copy_out_of_range_of_another_lineage_or_of_other_bytes_is_refused(
    tmp_path: Path,
) -> None:
    body = stamped_path(_holder_dir(tmp_path), range(0, 1), 40, TAG).read_bytes()
    spare_dir = tmp_path / "spare"
    with pytest.raises(WireError, match="asked for one from 41"):
        _receive(_reply(40, body), 41, spare_dir)
    with pytest.raises(WireError, match="step 100"):
        _receive(_reply(100, body), 0, spare_dir)  # the run's last: no announcement holds it
    with pytest.raises(WireError, match="lineage"):
        _receive(_reply(40, body, tag=OTHER_TAG), 0, spare_dir)
    with pytest.raises(WireError, match="lineage"):
        _receive(_reply(40, body, tag="../../etc"), 0, spare_dir)
    with pytest.raises(ValueError, match="sha256"):
        _receive(_reply(40, body, digest=b"\0" * 32), 0, spare_dir)
    assert list_states(spare_dir) == []  # nothing of a refused copy is kept
    assert _receive(_reply(40, body), 0, spare_dir) == _copy(spare_dir, 40)
    with pytest.raises(WireError, match="held here already"):
        _receive(_reply(40, body), 0, spare_dir)  # never overwritten
    for status in (MISSING, BUSY):
        assert _receive(status, 0, spare_dir) is None


def test_copies_are_announced_only_once_their_holder_is_gone(tmp_path: Path) -> None:
    spare_dir = tmp_path / "spare"
    body = stamped_path(_holder_dir(tmp_path), range(0, 1), 40, TAG).read_bytes()
    _receive(_reply(40, body), 0, spare_dir)
    mine = own_announcement(spare_dir, PLAN.state_rank)
    assert set(mine["L0-1"]) == {40}
    assert without_live_sources(mine, spare_dir, PLAN.peers()) == {}  # h is a member
    assert without_live_sources(mine, spare_dir, {"g", *SPARES}) == mine  # h crashed
    (spare_dir / "copies.json").write_text('{"stage-L0-1": [1, 2], "x": 3')  # not JSON
    assert read_sources(spare_dir) == {}
    (spare_dir / "copies.json").write_text('[["stage-L0-1.step40.pt", "h"]]')  # not a mapping
    assert without_live_sources(mine, spare_dir, PLAN.peers()) == mine


def test_a_spare_drops_the_copies_it_no_longer_keeps(tmp_path: Path) -> None:
    spare_dir = tmp_path / "spare"
    body = stamped_path(_holder_dir(tmp_path), range(0, 1), 40, TAG).read_bytes()
    _receive(_reply(40, body), 0, spare_dir)
    record_copy(spare_dir, "stage-L0-1.step99.pt", "h")  # a copy that never landed
    assert drop_copies(spare_dir, lambda state, holder: (state.key, holder) == ("L0-1", "h")) == 0
    assert drop_copies(spare_dir, lambda state, holder: holder == "n") == 1  # n holds it now
    assert list_states(spare_dir) == [] and read_sources(spare_dir) == {}


def _spare_with_copy(tmp_path: Path) -> Path:
    spare_dir = tmp_path / "spare"
    body = stamped_path(_holder_dir(tmp_path), range(0, 1), 40, TAG).read_bytes()
    _receive(_reply(40, body), 0, spare_dir)
    return spare_dir


def test_a_stale_copy_goes_at_once_only_if_its_holder_is_gone_and_the_start_did_not_take_it(
    tmp_path: Path,
) -> None:
    # h crashed: the next plan has s0 as its spare, n holds stage 0
    after = PLAN.replace(pipelines=(("n", "g"),), spares=("s0",), epoch=2)
    duties = copy_duties(after, "s0", 2)  # n's and g's stages now
    spare_dir = _spare_with_copy(tmp_path / "a")
    taken = StartPoint(40, "", digests={"L0-1": file_sha256(_copy(spare_dir, 40).path)})
    drop_stale(spare_dir, after, taken, duties, SPEC, at_once=True)
    assert list_states(spare_dir) != []  # n fetches it from us: kept for this plan
    drop_stale(spare_dir, after, taken, duties, SPEC, at_once=False)
    assert list_states(spare_dir) == []  # n has it, and trains on
    spare_dir = _spare_with_copy(tmp_path / "b")
    drop_stale(spare_dir, after, StartPoint(50, "", digests={"L0-1": "0" * 64}), [], SPEC, True)
    assert list_states(spare_dir) == []  # the start took a newer state: this one is stale
    spare_dir = _spare_with_copy(tmp_path / "c")
    drop_stale(spare_dir, PLAN, StartPoint(50, ""), copy_duties(PLAN, "s1", 2), SPEC, True)
    assert list_states(spare_dir) != []  # h lives: the new copier gets its first copy first
    assert stale_after_s(SPEC, PLAN) > 2 * SPEC.checkpoint.spare_copy_interval_s


def test_a_copy_that_does_not_load_or_names_a_tag_twice_never_lands(
    tmp_path: Path,
) -> None:
    holder_dir = _holder_dir(tmp_path)
    body = stamped_path(holder_dir, range(0, 1), 40, TAG).read_bytes()
    spare_dir = tmp_path / "spare"
    other_run = SPEC.replace(run_id="another-run")
    model = build_stage(other_run, 0, 2)
    foreign = tmp_path / "foreign.pt"
    save_stage(foreign, other_run, model, make_optimizer(model, other_run), 40)
    with pytest.raises(UserError, match="does not fit"):
        _receive(_reply(40, foreign.read_bytes()), 0, spare_dir)  # another run's state
    assert list(spare_dir.iterdir()) == [spare_dir / "copies.json"]
    assert read_sources(spare_dir) == {}  # and no copy is recorded
    lineage_id = TAG.partition("-e")[0]
    for tag in (f"{lineage_id}-e01", f"{TAG}\n"):  # another name of the same tag; a newline
        with pytest.raises(WireError, match="lineage"):
            _receive(_reply(40, body, tag=tag), 0, spare_dir)
    assert list_states(spare_dir) == []


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
