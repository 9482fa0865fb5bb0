"""Which stage-state requests take the server's serving slots (worker/resume/state_transfer.py):
idle streams wait apart and never make a member's request BUSY, a peer gets a state in full once
a plan (a failed send may be retried), only states of blocks its plan places it at, and a send
whose reader stalls is cut. Over plain loopback sockets; the caller names itself first."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from p2ptrain.records import Plan, RunSpec
from p2ptrain.records.lineage import next_lineage
from p2ptrain.train.checkpoint import record_step
from p2ptrain.train.checkpoint_folder import list_states
from p2ptrain.train.model import build_stage
from p2ptrain.train.optim import make_optimizer
from p2ptrain.train.snapshot import StageSnapshot
from p2ptrain.train.state_digest import file_sha256
from p2ptrain.worker.resume import state_transfer
from p2ptrain.worker.resume.served_state import open_state
from p2ptrain.worker.resume.state_request import StateRequest, parse_layers
from p2ptrain.worker.resume.state_transfer import (
    BUSY,
    FOUND,
    MISSING,
    SIZE,
    StateServer,
)

SPEC = RunSpec().replace(n_layer=2, n_head=2, n_embd=16, block_size=8, steps=100)
GUARD_S = 30.0  # a hang guard, not a bound under test


def plan(epoch: int, pipeline: tuple[str, ...] = ("g", "h")) -> Plan:
    """g at stage 0 (the state served: layers 0-1), h at stage 1, spares s1 and s2."""
    return Plan(
        term=1,
        epoch=epoch,
        planner="h",
        stages=2,
        pipelines=(pipeline,),
        spares=("s1", "s2"),
        data_addrs={},
        cost_s=1.0,
        lineage=next_lineage((), False, 1, epoch, "h"),
    )


class _Info:
    def __init__(self, peer: str) -> None:
        self.peer_id = type("P", (), {"to_base58": lambda _: peer})()


def _served(tmp_path: Path) -> tuple[StateServer, StateRequest]:
    model = build_stage(SPEC, 0, 2)
    optimizer = make_optimizer(model, SPEC)
    record_step(tmp_path, SPEC, model, StageSnapshot.take(model, optimizer, 20), plan(1).state_tag)
    (state,) = list_states(tmp_path)
    server = StateServer(None)
    server.serve_run(SPEC, tmp_path, plan(1))
    return server, StateRequest(range(0, 1), 20, file_sha256(state.path))


@contextlib.asynccontextmanager
async def _listening(server: StateServer) -> AsyncIterator[int]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = (await reader.readexactly(2)).decode().strip()  # the shim's: who calls
        await server._handle(_Info(peer), reader, writer)  # type: ignore[arg-type]

    listener = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield listener.sockets[0].getsockname()[1]
    finally:
        listener.close()


async def _open(port: int, peer: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(peer.ljust(2).encode())
    await writer.drain()
    return reader, writer


async def _ask(port: int, peer: str, request: StateRequest) -> bytes:
    """The answer byte to `peer`'s request, and the whole file if found."""
    reader, writer = await _open(port, peer)
    try:
        writer.write(request.encode())
        await writer.drain()
        answer = await reader.read(1)
        if answer != FOUND:
            return answer
        (size,) = SIZE.unpack(await reader.readexactly(SIZE.size))
        return answer + await reader.readexactly(size)
    finally:
        writer.close()


def test_idle_openers_of_two_members_do_not_make_a_members_request_busy(tmp_path: Path) -> None:
    server, request = _served(tmp_path)

    async def run() -> tuple[list[bytes], bytes, int]:
        async with asyncio.timeout(GUARD_S), _listening(server) as port:
            idle = [await _open(port, peer) for peer in ("s1", "s1", "s2", "s2")]
            while server.pending.total() < 4:  # noqa: ASYNC110 (a count, no event to wait on)
                await asyncio.sleep(0.01)
            third = await _open(port, "s1")  # past its pending cap: BUSY, nothing read
            served = server.streams.total()
            answer = await _ask(port, "g", request)
            answers = [await third[0].read(1)]
            for _, writer in [*idle, third]:
                writer.close()
            return answers, answer, served

    answers, answer, served = asyncio.run(run())
    assert answers == [BUSY]
    assert answer[:1] == FOUND and len(answer) > 1  # the whole state
    assert served == 0  # the idle streams never took a serving slot


def test_full_downloads_of_a_state_by_a_peer_are_bounded_until_the_next_plan(
    tmp_path: Path,
) -> None:
    """A client may lose a state it read whole (its tail, its disk): a few sends a plan, not
    one; past MAX_SENDS, missing (it asks the next holder) until the next plan."""
    server, request = _served(tmp_path)

    async def run() -> list[bytes]:
        async with asyncio.timeout(GUARD_S), _listening(server) as port:
            sends = [(await _ask(port, "g", request))[:1] for _ in range(state_transfer.MAX_SENDS)]
            again = await _ask(port, "g", request)
            server.serve_run(SPEC, tmp_path, plan(2))
            next_plan = await _ask(port, "g", request)
            return [*sends, again, next_plan[:1]]

    assert asyncio.run(run()) == [FOUND] * state_transfer.MAX_SENDS + [MISSING, FOUND]


def test_a_send_that_failed_may_be_retried_a_few_times(tmp_path: Path) -> None:
    server, request = _served(tmp_path)

    async def failing(remote: str, writer: asyncio.StreamWriter, *args: object) -> bool:
        writer.transport.abort()
        raise ConnectionResetError("the reader went away")

    async def run() -> list[bytes]:
        async with asyncio.timeout(GUARD_S), _listening(server) as port:
            honest_send, server.send_file = server.send_file, failing  # type: ignore[method-assign]
            failed = [await _ask(port, "g", request) for _ in range(state_transfer.MAX_SENDS)]
            server.send_file = honest_send  # type: ignore[method-assign]
            return [*failed, await _ask(port, "g", request)]

    answers = asyncio.run(run())
    # each failed try took one of MAX_SENDS (the stream ended unanswered); then no more
    assert answers == [b""] * state_transfer.MAX_SENDS + [MISSING]


def test_only_states_of_blocks_the_plan_places_a_peer_at_are_sent(tmp_path: Path) -> None:
    server, request = _served(tmp_path)

    async def run() -> list[bytes]:
        async with asyncio.timeout(GUARD_S), _listening(server) as port:
            answers = [await _ask(port, peer, request) for peer in ("s1", "h")]
            # a new plan places h at stage 0: served, as a peer of the previous plan would be
            server.serve_run(SPEC, tmp_path, plan(2, ("h", "g")))
            answers.append((await _ask(port, "h", request))[:1])
            answers.append((await _ask(port, "g", request))[:1])  # its previous plan's stage
            return answers

    assert asyncio.run(run()) == [MISSING, MISSING, FOUND, FOUND]


def test_a_send_whose_reader_stalls_is_cut(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    server, _ = _served(tmp_path)
    (state,) = list_states(tmp_path)
    monkeypatch.setattr(state_transfer, "CHUNK_STALL_S", 0.05)

    class Stalled:
        def write(self, data: bytes) -> None:
            pass

        async def drain(self) -> None:
            await asyncio.Event().wait()  # the reader never takes a byte

    async def run() -> bool:
        async with asyncio.timeout(GUARD_S) as guard:
            with pytest.raises(TimeoutError), contextlib.closing(open_state(state.path)) as opened:
                await server.send_file("g", Stalled(), opened, 10**9, FOUND)  # type: ignore[arg-type]
        return guard.expired()

    assert asyncio.run(run()) is False  # cut by the stall bound, long before the deadline


def test_layers_are_ascii_digits_only() -> None:
    assert parse_layers("L0-3") == range(0, 3)
    assert parse_layers("L\u0660-\u0663") is None  # Arabic-Indic digits
    assert parse_layers("L0-3\n") is None
