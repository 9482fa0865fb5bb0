"""Issue 26.9: a bandwidth probe's far end cannot acknowledge bytes it has not received (live
py-libp2p hosts on loopback)."""

from __future__ import annotations

import hashlib
import os

import pytest
import trio
from libp2p.abc import INetStream

from p2ptrain.net import probe
from p2ptrain.net.framing import read_exact, read_some
from tests.net.test_protocols import host_pair
from tests.net.trio_run import run


async def _ack_at_once(stream: INetStream) -> None:
    """Version 2's forgery: acknowledge half-way and the end as soon as the size arrives,
    with digests of nothing (it cannot know the bytes yet)."""
    await read_exact(stream, 4)
    empty = hashlib.sha256().digest()
    await stream.write(b"\x01" + empty + b"\x02" + empty)
    await trio.sleep(5)


async def _bare_acks_at_once(stream: INetStream) -> None:
    """Version 2's forgery as it worked there: both bare acknowledgements at once."""
    await read_exact(stream, 4)
    await stream.write(b"\x01\x02")
    await stream.close()


async def _ack_after_one_chunk(stream: INetStream) -> None:
    """Reads the first chunk and guesses the rest repeats it (version 2's payload did)."""
    (size,) = probe._SIZE.unpack(await read_exact(stream, 4))
    chunk = await read_exact(stream, min(size, probe._CHUNK_BYTES))
    guess = (chunk * (size // len(chunk) + 1))[:size]
    await stream.write(b"\x01" + hashlib.sha256(guess[: size // 2]).digest())
    await stream.write(b"\x02" + hashlib.sha256(guess).digest())
    await trio.sleep(5)


async def _old_version_acks(stream: INetStream) -> None:
    """Bare one-byte acknowledgements (version 2), sent when the bytes did arrive."""
    (size,) = probe._SIZE.unpack(await read_exact(stream, 4))
    received = 0
    while received < size:
        received += len(await read_some(stream, 65536))
        if received >= size // 2:
            await stream.write(b"\x01")
    await stream.write(b"\x02")
    await stream.close()


def _probe_with(handler: object) -> BaseException | float:
    async def scenario() -> BaseException | float:
        async with host_pair() as (a, b):
            b.set_stream_handler(probe.BANDWIDTH_PROTOCOL, handler)  # type: ignore[arg-type]
            try:
                return await probe.measure_bandwidth_mbps(a, b.get_id(), 1024 * 1024)
            except Exception as exc:  # the outcome under test
                return exc

    outcome: BaseException | float = run(scenario)
    return outcome


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


@pytest.mark.parametrize("forger", [_ack_at_once, _ack_after_one_chunk])
def test_an_acknowledgement_of_bytes_not_received_fails_the_probe(forger: object) -> None:
    outcome = _probe_with(forger)
    assert isinstance(outcome, BaseException), f"forged probe read {outcome} Mbit/s"
    assert any(isinstance(leaf, probe.ForgedAck) for leaf in _leaves(outcome))


@pytest.mark.parametrize("server", [_bare_acks_at_once, _old_version_acks])
def test_bare_acknowledgements_fail_the_probe(server: object) -> None:
    outcome = _probe_with(server)
    assert isinstance(outcome, BaseException), f"bare acknowledgements read {outcome} Mbit/s"


def test_the_honest_server_proves_what_it_received() -> None:
    payload = os.urandom(11)

    async def scenario() -> tuple[float, bytes]:
        async with host_pair() as (a, b):
            b.set_stream_handler(probe.BANDWIDTH_PROTOCOL, probe.handle_bandwidth)
            mbps = await probe.measure_bandwidth_mbps(a, b.get_id(), 300_001)
            # by hand: an odd size, read back both digests
            stream = await a.new_stream(b.get_id(), [probe.BANDWIDTH_PROTOCOL])
            await stream.write(probe._SIZE.pack(len(payload)) + payload)
            with trio.fail_after(5):
                acks = await read_exact(stream, 2 * probe._ACK_BYTES)
            return mbps, acks

    mbps, acks = run(scenario)
    assert mbps > 1
    assert acks == (
        b"\x01" + hashlib.sha256(payload[:5]).digest() + b"\x02" + hashlib.sha256(payload).digest()
    )
