"""What the stage-state server sends (worker/resume/state_transfer.py, served_state.py): the very
file whose digest it checked, through one descriptor (a state renamed over or pruned between the
check and the send was sent under the checked digest), and only to a reader that keeps the floor
rate (one that took each chunk just before the stall cut held a serving slot until the send's
deadline). Driven by a fake clock and a fake reader: nothing here waits on real time."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from pathlib import Path

import pytest

from p2ptrain.train.checkpoint_folder import list_states, stamped_path
from p2ptrain.worker.resume import copy_server, state_transfer
from p2ptrain.worker.resume.copy_server import HEAD, CopyRequest
from p2ptrain.worker.resume.served_state import (
    SEND_GRACE_S,
    OpenedState,
    Pace,
    TooSlow,
)
from p2ptrain.worker.resume.state_request import StateRequest
from p2ptrain.worker.resume.state_transfer import (
    CHUNK_STALL_S,
    FOUND,
    SIZE,
    StateServer,
)
from tests.worker.resume.test_spare_copies import TAG
from tests.worker.resume.test_spare_copies import _server as copy_holder
from tests.worker.resume.test_state_server_admission import _Info, _served

CHUNK = 1024  # the file (~32 KB) goes in many chunks, so a cut leaves some unsent
FLOOR = 64 * 1024.0  # a floor rate for the Pace's own tests (bytes a second)
GUARD_S = 30.0  # a hang guard, not a bound under test


class Clock:
    """Monotonic seconds that move only when a fake reader takes bytes."""

    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


class Transport:
    def abort(self) -> None:
        pass


class Reader:
    """A client's end as the server writes to it: a drain takes the bytes written since the
    last one at `bytes_per_s` (None: at once) on the fake clock, `per_drain_s` more each, and
    `first_s` more the first time (a slow start)."""

    def __init__(
        self,
        clock: Clock,
        bytes_per_s: float | None = None,
        per_drain_s: float = 0.0,
        first_s: float = 0.0,
    ) -> None:
        self.clock, self.bytes_per_s = clock, bytes_per_s
        self.per_drain_s, self.first_s = per_drain_s, first_s
        self.received = bytearray()
        self.transport = Transport()
        self._undrained = 0
        self.drains = 0

    def write(self, data: bytes) -> None:
        self.received += data
        self._undrained += len(data)

    async def drain(self) -> None:
        if self._undrained:
            rate = self.bytes_per_s
            self.clock.now_s += self.per_drain_s + (self._undrained / rate if rate else 0.0)
            self.clock.now_s += 0.0 if self.drains else self.first_s
            self.drains += 1
        self._undrained = 0

    def close(self) -> None:
        pass

    def body(self) -> bytes:
        """The file's bytes received after the status byte and the size."""
        assert self.received[:1] == FOUND
        (size,) = SIZE.unpack(self.received[1 : 1 + SIZE.size])
        body = bytes(self.received[1 + SIZE.size :])
        assert len(body) == size
        return body


def _request_stream(request: StateRequest) -> asyncio.StreamReader:
    stream = asyncio.StreamReader()
    stream.feed_data(request.encode())
    stream.feed_eof()  # the client has said all it will
    return stream


def _handle(server: StateServer, request: StateRequest, reader: Reader) -> None:
    async def run() -> None:
        async with asyncio.timeout(GUARD_S):
            await server._handle(_Info("g"), _request_stream(request), reader)  # type: ignore[arg-type]

    asyncio.run(run())


def _server(tmp_path: Path, clock: Clock) -> tuple[StateServer, StateRequest, Path]:
    server, request = _served(tmp_path)
    server.clock = clock
    (state,) = list_states(tmp_path)
    return server, request, state.path


@pytest.fixture(autouse=True)
def _small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state_transfer, "CHUNK_BYTES", CHUNK)


def _swap_after_check(
    monkeypatch: pytest.MonkeyPatch, module: object, name: str, swap: object
) -> None:
    """Run `swap(path)` right after `module.name` (the opening and digest check) returns."""
    checked = getattr(module, name)

    def check_then_swap(*args: object) -> OpenedState | None:
        opened = checked(*args)
        if opened is not None:
            swap(opened.path)  # type: ignore[operator]
        return opened

    monkeypatch.setattr(module, name, check_then_swap)


@pytest.mark.parametrize("swap", ["renamed over", "pruned"])
def test_a_state_swapped_after_its_digest_check_is_not_what_is_sent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, swap: str
) -> None:
    """Another process renames other bytes over the checked name, or prunes it, between the
    check and the send: the checked file's bytes are sent, from the descriptor checked."""
    clock = Clock()
    server, request, path = _server(tmp_path, clock)
    agreed = path.read_bytes()
    other = tmp_path / "other.part"
    other.write_bytes(agreed[:-16] + b"\x00" * 16)  # same size, other bytes

    def swap_it(name: Path) -> None:
        if swap == "pruned":
            name.unlink()
        else:
            os.replace(other, name)

    _swap_after_check(monkeypatch, state_transfer, "find_state", swap_it)
    reader = Reader(clock)
    _handle(server, request, reader)
    assert reader.body() == agreed
    assert hashlib.sha256(reader.body()).hexdigest() == request.digest
    assert path.exists() == (swap == "renamed over")  # the swap did happen
    assert server.served.wait_for({("g", request.digest)}, 0.0, lambda: False)


def test_a_copy_names_the_digest_of_the_bytes_it_sends_though_the_name_is_swapped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The copy server names the state's sha256 in its head: that of the descriptor it sends
    from, not of whatever the name holds once hashed."""
    server = copy_holder(tmp_path)  # h holds stage 0, s0 copies it: its newest is step 40
    path = stamped_path(tmp_path / "holder", range(0, 1), 40, TAG)
    agreed = path.read_bytes()
    other = tmp_path / "other.part"
    other.write_bytes(b"\x00" * len(agreed))
    _swap_after_check(monkeypatch, copy_server, "open_state", lambda name: os.replace(other, name))
    reader = Reader(Clock())

    async def run() -> None:
        stream = asyncio.StreamReader()
        stream.feed_data(CopyRequest(range(0, 1), 0).encode())
        stream.feed_eof()
        async with asyncio.timeout(GUARD_S):
            await server.serve("s0", stream, reader)  # type: ignore[arg-type]

    asyncio.run(run())
    assert reader.received[:1] == FOUND
    _, digest, tag_len = HEAD.unpack(reader.received[1 : 1 + HEAD.size])
    body = bytes(reader.received[1 + HEAD.size + tag_len + SIZE.size :])
    assert body == agreed and hashlib.sha256(body).digest() == digest


def test_a_reader_under_the_floor_rate_is_cut_and_frees_its_slot(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """It takes each chunk just before the stall cut: once past the grace, it is cut, logged
    once, and its serving slot freed (it may ask again: a send it failed counts as one try)."""
    clock = Clock()
    server, request, path = _server(tmp_path, clock)
    reader = Reader(clock, per_drain_s=CHUNK_STALL_S - 1.0)
    with caplog.at_level(logging.WARNING, logger=state_transfer.__name__):
        _handle(server, request, reader)
    sent = len(reader.received) - 1 - SIZE.size
    assert 0 < sent < path.stat().st_size  # cut before the end
    assert reader.drains == 1  # at the first chunk past the grace
    assert server.streams.total() == 0 and server.pending.total() == 0
    assert not server._sending
    assert not server.served.wait_for({("g", request.digest)}, 0.0, lambda: False)
    cuts = [r for r in caplog.records if "TooSlow" in r.getMessage()]
    assert len(cuts) == 1 and "bytes/s" in cuts[0].getMessage()
    # its slot is free: an honest reader is served at once
    honest = Reader(clock, _floor(server, path))
    _handle(server, request, honest)
    assert hashlib.sha256(honest.body()).hexdigest() == request.digest


def _floor(server: StateServer, path: Path) -> float:
    """The floor a send of `path` is held to: a 1/MAX_SERVING share of its deadline's pace."""
    size = path.stat().st_size
    return size / (
        state_transfer.transfer_deadline_s(size, server.network) * state_transfer.MAX_SERVING
    )


@pytest.mark.parametrize(
    ("floors", "first_s"),
    [
        (1.0, 0.0),  # just at the floor, all along
        (1.0, SEND_GRACE_S - 1.0),  # a slow start, most of the grace, then it
        (4.0, 0.0),
    ],
    ids=["at-the-floor", "slow-start", "faster"],
)
def test_an_honest_reader_at_the_floor_rate_is_served(
    tmp_path: Path, floors: float, first_s: float
) -> None:
    clock = Clock()
    server, request, path = _server(tmp_path, clock)
    reader = Reader(clock, floors * _floor(server, path), first_s=first_s)
    _handle(server, request, reader)
    assert reader.body() == path.read_bytes()
    assert server.served.wait_for({("g", request.digest)}, 0.0, lambda: False)
    assert server.streams.total() == 0


def test_the_pace_cuts_a_steady_reader_under_the_floor_and_never_one_at_it() -> None:
    """With the real chunk size: a reader at the floor is never cut however long the state
    (12 h: MAX_TRANSFER_S); one that takes each MiB just before the stall cut is cut at its
    first MiB; one at 90% of the floor is cut once its deficit passes the grace (10 grace periods)."""
    mib = 1024 * 1024
    clock = Clock()
    honest = Pace(clock, FLOOR)
    while clock.now_s - 1000.0 < state_transfer.MAX_TRANSFER_S:
        clock.now_s += mib / FLOOR
        honest.took(mib)
    stalling = Pace(clock, FLOOR)
    clock.now_s += CHUNK_STALL_S - 0.1
    with pytest.raises(TooSlow):
        stalling.took(mib)
    clock.now_s = 0.0
    slow, took_s = Pace(clock, FLOOR), 0.0
    with pytest.raises(TooSlow):
        while took_s < state_transfer.MAX_TRANSFER_S:
            clock.now_s += mib / (0.9 * FLOOR)
            took_s = clock.now_s
            slow.took(mib)
    # sent >= floor * (t - grace) fails at t > 10 grace: cut at the first MiB past that
    assert 10 * SEND_GRACE_S < took_s <= 10 * SEND_GRACE_S + mib / (0.9 * FLOOR)
    assert issubclass(TooSlow, TimeoutError)  # handled, and logged, as a stall cut is


def test_a_name_that_is_no_regular_file_is_not_served(tmp_path: Path) -> None:
    """The state's name opened as a regular file only: a FIFO in its place is passed over
    (its open never blocks), so the request is MISSING."""
    clock = Clock()
    server, request, path = _server(tmp_path, clock)
    path.unlink()
    os.mkfifo(path)
    reader = Reader(clock)
    _handle(server, request, reader)
    assert bytes(reader.received) == state_transfer.MISSING


@pytest.mark.parametrize("rate_mbps", [1.0, 10.0, 1000.0])
def test_every_slot_busy_on_the_plans_link_keeps_each_honest_reader_above_the_floor(
    rate_mbps: float,
) -> None:
    """The floor is a 1/MAX_SERVING share of the pace that ends a send at its deadline: readers
    filling every slot over our uplink at the plan's rate each take a quarter of it, twice the
    floor, so no honest one is cut for sharing; one that takes each MiB just before the stall
    cut is cut on a plan's fast links."""
    from p2ptrain.records import LinkFacts

    size = 200 * 1024 * 1024
    deadline_s = state_transfer.transfer_deadline_s(size, LinkFacts(0.1, rate_mbps))
    floor = size / (deadline_s * state_transfer.MAX_SERVING)
    share = rate_mbps * 1e6 / 8 / state_transfer.MAX_SERVING
    assert share >= 2 * floor * 0.99
    clock = Clock()
    sharing = Pace(clock, floor)
    while sharing.sent < size:
        clock.now_s += CHUNK / share
        sharing.took(CHUNK)  # never TooSlow
    if rate_mbps >= 10.0:
        stalling = Pace(clock, floor)
        clock.now_s += CHUNK_STALL_S - 0.1
        with pytest.raises(TooSlow):
            stalling.took(1024 * 1024)
