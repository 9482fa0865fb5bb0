"""A hostile groupmate or stranger against the outer rounds' wire (worker/averaging/outer_wire.py,
round_inbox.py, outer_link.py): its header decodes to a record or WireError, a round key it
makes up can neither be stored nor make the inbox's cleanup raise, its concurrent or far-future
messages stay within the per-sender bound, and a stranger's streams are refused unread."""

from __future__ import annotations

import asyncio
import json
import random
import types
from collections.abc import Coroutine
from typing import Any

import pytest

from p2ptrain.errors import WireError
from p2ptrain.worker.averaging import outer_link
from p2ptrain.worker.averaging import outer_wire as wire
from p2ptrain.worker.averaging.checks import Checksums
from p2ptrain.worker.averaging.round_inbox import MAX_HELD_PER_SENDER, RoundInbox
from p2ptrain.worker.traffic import Traffic
from tests.records.test_fuzz import fuzz_bytes
from tests.worker.averaging.test_outer_exchange import PEERS, PREFIX, grads, members, run_round

CLAIMS = Checksums(1, 1.0, 0.0, 0.0, 1.0)
# "²" and the other non-ASCII digits pass str.isdigit(); int() refuses them
HOSTILE_STEPS = ["²", "٣", "１", "𝟗", "9" * 5000, "-1", "+1", " 1", "1_0", "07", "", "1e3", "∞"]


def part(key: str, sender: str = PEERS[0], shard: int = 1, num_bytes: int = 0) -> wire.RoundHeader:
    return wire.RoundHeader(key, wire.PART, sender, shard, num_bytes, CLAIMS)


def key(step: int, attempt: int = 0) -> str:
    return wire.round_key(PREFIX, step, attempt, PEERS[:2])


# --- round keys: parsed by a total function ---


@pytest.mark.parametrize("step", HOSTILE_STEPS)
def test_a_made_up_step_is_no_round_and_is_dropped(step: str) -> None:
    hostile = f"{PREFIX}/{step}/0/{'0' * 16}"
    assert wire.parse_round_key(hostile) is None
    assert wire.round_step(PREFIX, hostile) == -1
    assert not wire.kept_after(PREFIX, 9, [PREFIX + ".1"], 30)(hostile)


def _hostile_key(rng: random.Random) -> str:
    valid = key(rng.randrange(100))
    roll = rng.random()
    if roll < 0.3:
        return rng.randbytes(rng.randrange(300)).decode("latin-1")
    if roll < 0.5:
        return "".join(chr(rng.randrange(0x30000)) for _ in range(rng.randrange(64)))
    pieces = valid.split("/")
    at = rng.randrange(len(pieces))
    pieces[at] = rng.choice([*HOSTILE_STEPS, str(rng.randrange(10**40)), "/", "//", "a" * 300])
    return "/".join(pieces)


def test_round_keys_are_parsed_totally() -> None:
    rng = random.Random(1)
    keep = wire.kept_after(PREFIX, 9, [PREFIX + ".1"], 30)
    for _ in range(5000):
        hostile = _hostile_key(rng)
        parsed = wire.parse_round_key(hostile)
        assert parsed is None or (isinstance(parsed[1], int) and 0 <= parsed[1] < 10**16)
        assert wire.round_step(PREFIX, hostile) >= -1
        assert keep(hostile) in (True, False)


def test_a_stored_made_up_key_cannot_stop_the_groups_rounds() -> None:
    """Regression: a part keyed `<prefix>/²/0/x` was stored, then made every round's cleanup
    raise, so the worker's rounds ended 'local' for its life."""
    group = members(2, "fp16")
    inbox = group[0][0].inbox
    hostile = part(f"{PREFIX}/²/0/{'0' * 16}", sender=PEERS[1])
    assert inbox.screen(hostile, PEERS[1]) == wire.REJECTED  # refused unread now
    inbox.put(hostile, b"")  # and were it stored anyway, forget drops it
    for step in (9, 10):
        results = run_round(group, grads(2), step=step)
        assert {o.kind for _, o, _ in results.values()} == {"averaged"}


# --- the header decoder ---


def test_round_header_decoder_is_total() -> None:
    sample = part(key(9), num_bytes=10).encode()[wire.HEADER_LEN.size :]
    assert wire.RoundHeader.decode(sample) == part(key(9), num_bytes=10)
    num_valid = fuzz_bytes(wire.RoundHeader.decode, sample, 3000, seed=3)
    assert num_valid < 3000  # the mutations do reach the checks


@pytest.mark.parametrize(
    "raw",
    [
        b"[" * wire.MAX_HEADER_BYTES,  # deep nesting: RecursionError inside json
        json.dumps({"round": "k", "claims": {"step": 1}}).replace('"k"', "[" * 5000).encode(),
        b'{"round":"' + "²".encode() + b'","kind":"part"}',
        b'{"num_bytes":' + b"9" * 5000 + b"}",  # int() refuses 5000 digits
        b"\xff\xfe",
    ],
)
def test_hostile_header_bytes_are_a_wire_error(raw: bytes) -> None:
    with pytest.raises(WireError):
        wire.RoundHeader.decode(raw)


# --- the inbox's bounds ---


def _inbox() -> RoundInbox:
    inbox = RoundInbox()
    inbox.admit_group(PEERS[:2], 1000)
    return inbox


def test_messages_being_read_count_against_the_senders_bound() -> None:
    """Concurrent streams each screened before any payload arrived must not all get in."""
    inbox = _inbox()
    headers = [part(key(9, attempt)) for attempt in range(MAX_HELD_PER_SENDER + 1)]
    assert [inbox.screen(h, PEERS[0]) for h in headers[:-1]] == [None] * MAX_HELD_PER_SENDER
    assert inbox.screen(headers[-1], PEERS[0]) == wire.BUSY
    assert inbox.screen(headers[0], PEERS[0]) == wire.BUSY  # the same message, still being read
    inbox.release(headers[0])  # its read failed: the place is free again
    assert inbox.screen(headers[-1], PEERS[0]) is None
    for h in headers[1:]:
        inbox.put(h, b"")
    assert inbox.screen(headers[0], PEERS[0]) == wire.BUSY  # held ones count too
    assert inbox.screen(part(key(9), sender=PEERS[1]), PEERS[1]) is None  # per sender


def test_a_former_groupmate_parks_nothing_once_the_session_closed() -> None:
    """A session's end closes its group: a former member's messages are refused and what it
    parked goes (they stayed for as long as no later DiLoCo session admitted another group);
    a member of the next group keeps what it parked."""
    inbox = _inbox()
    former, staying = part(key(9), sender=PEERS[0]), part(key(9), sender=PEERS[1])
    for header in (former, staying):
        assert inbox.screen(header, header.sender) is None
        inbox.put(header, b"x")
    transport = types.SimpleNamespace()
    link = types.SimpleNamespace(transport=transport, inbox=inbox)
    outer_link._LINKS[id(transport)] = link  # type: ignore[assignment]
    try:
        outer_link.close_rounds(transport)  # type: ignore[arg-type]
    finally:
        del outer_link._LINKS[id(transport)]
    assert inbox.screen(part(key(10), sender=PEERS[0]), PEERS[0]) == wire.BUSY
    assert inbox.take(key(9), wire.PART, PEERS[0], 1, 0.0, lambda: False) is None
    inbox2 = _inbox()
    for header in (former, staying):
        inbox2.screen(header, header.sender)
        inbox2.put(header, b"x")
    inbox2.admit_group([PEERS[1]], 1 << 20)  # the next plan's group: PEERS[1] stays
    assert inbox2.take(key(9), wire.PART, PEERS[0], 1, 0.0, lambda: False) is None
    assert inbox2.take(key(9), wire.PART, PEERS[1], 1, 0.0, lambda: False) is not None


def test_rounds_far_past_ours_are_refused_and_forgotten() -> None:
    inbox, steps_ahead = _inbox(), 30
    far = part(key(10**12))
    assert inbox.screen(far, PEERS[0]) is None  # before our first round: any step
    inbox.put(far, b"")
    inbox.admit_steps(9 + steps_ahead)  # our round of step 9 starts
    assert inbox.screen(part(key(9 + steps_ahead)), PEERS[0]) is None
    assert inbox.screen(part(key(10 + steps_ahead)), PEERS[0]) == wire.REJECTED
    inbox.forget(wire.kept_after(PREFIX, 9, (), steps_ahead))  # and ends
    assert inbox.take(key(10**12), wire.PART, PEERS[0], 1, 0.0, lambda: False) is None


def test_a_round_sets_the_horizon_from_the_outer_period() -> None:
    group = members(2, "fp16")
    run_round(group, grads(2), step=9)
    inbox, steps_ahead = group[0][0].inbox, group[0][1].steps_ahead
    assert steps_ahead == wire.MAX_ROUNDS_AHEAD  # inner_steps=1 in these groups
    assert inbox.screen(part(key(9 + steps_ahead), sender=PEERS[1]), PEERS[1]) is None
    assert inbox.screen(part(key(10 + steps_ahead), sender=PEERS[1]), PEERS[1]) == wire.REJECTED


# --- the link's streams ---


class _FakeTransport:
    """What P2PRoundLink uses of a Transport, without p2pd: the test calls its handler."""

    def __init__(self) -> None:
        self.peer_id = PEERS[2]
        self.traffic = Traffic()
        self.p2p = types.SimpleNamespace(add_binary_stream_handler=self._register)

    async def _register(self, protocol: str, handler: Any) -> None:
        pass

    def call(self, coroutine: Coroutine[Any, Any, Any], timeout_s: float = 60.0) -> Any:
        return asyncio.run(coroutine)


def _info(peer: str) -> Any:
    return types.SimpleNamespace(peer_id=types.SimpleNamespace(to_base58=lambda: peer))


async def _streams(
    link: outer_link.P2PRoundLink, peer: str, messages: list[bytes], answer_timeout_s: float = 5.0
) -> list[bytes]:
    """Open one stream of `peer` per message at once, write each, and collect the answers
    (b"": none before the timeout or the stream's end)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await link._handle(_info(peer), reader, writer)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        opened = [await asyncio.open_connection("127.0.0.1", port) for _ in messages]
        for (_, writer), data in zip(opened, messages, strict=True):
            writer.write(data)
        answers = []
        for reader, _ in opened:
            try:
                answers.append(await asyncio.wait_for(reader.read(1), answer_timeout_s))
            except TimeoutError:
                answers.append(b"")
        for _, writer in opened:
            writer.close()
    return answers


def _link() -> outer_link.P2PRoundLink:
    link = outer_link.P2PRoundLink(_FakeTransport())  # type: ignore[arg-type]
    link.inbox.admit_group(PEERS[:2], 1000)
    return link


def test_a_strangers_stream_is_refused_before_its_header_is_read() -> None:
    link = _link()
    # the answer comes before a byte is read (the stranger writes none: data left unread at
    # the close would reset the connection under the answer)
    assert asyncio.run(_streams(link, PEERS[2], [b""])) == [wire.BUSY]
    assert link.transport.traffic.bytes_received == 0
    assert link._streams.num_refused == 1


def test_a_groupmates_streams_are_capped_and_a_failed_read_frees_its_place(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    link = _link()
    monkeypatch.setattr(outer_link, "HEADER_TIMEOUT_S", 0.5)  # the idle streams' end
    idle = [b""] * outer_link.MAX_INBOUND_PER_PEER
    # the idle streams are held (and refused once their header is overdue); the next is busy
    answers = asyncio.run(_streams(link, PEERS[0], [*idle, b""], answer_timeout_s=3.0))
    assert answers[-1] == wire.BUSY and link._streams.num_refused == 1
    assert set(answers[:-1]) == {wire.REJECTED}
    # a payload cut short gives its reserved place back: the same message then gets in
    message = part(key(9), num_bytes=4).encode()
    assert asyncio.run(_streams(link, PEERS[0], [message + b"ab"])) == [wire.REJECTED]
    assert asyncio.run(_streams(link, PEERS[0], [message + b"abcd"])) == [wire.ACCEPTED]
    got = link.inbox.take(key(9), wire.PART, PEERS[0], 1, 0.0, lambda: False)
    assert got is not None and got[1] == b"abcd"


def test_a_hostile_header_is_refused_and_the_handler_goes_on() -> None:
    link = _link()
    deep = b"[" * wire.MAX_HEADER_BYTES
    message = wire.HEADER_LEN.pack(len(deep)) + deep
    assert asyncio.run(_streams(link, PEERS[0], [message])) == [wire.REJECTED]
    fine = part(key(9), num_bytes=1).encode() + b"x"
    assert asyncio.run(_streams(link, PEERS[0], [fine])) == [wire.ACCEPTED]
