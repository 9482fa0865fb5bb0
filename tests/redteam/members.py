"""What the door attacker's token holders do (tests/redteam/door_attacker.py): an identity the
organiser issued a token to, its record (role `observer`: no plan places it), telemetry of
1e308 (8), a dial-back server that says "reached" to whoever asks (10), and an offer handler
that accepts every circuit (so that 1 and 11 get their grants)."""

from __future__ import annotations

import contextlib
import json
import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

from libp2p.abc import INetStream

from p2ptrain import identity
from p2ptrain.control import wire
from p2ptrain.control.relay_service import OFFER_PROTOCOL
from p2ptrain.net.framing import read_frame, write_frame
from p2ptrain.records import DialBackReply, DialResult
from p2ptrain.traversal.dialback import DIALBACK_PROTOCOL
from tests.control.attacker import Attacker, open_attacker

HUGE = 1e308


@contextlib.asynccontextmanager
async def open_member(addrs: list[str], key_and_token: str) -> AsyncIterator[Attacker]:
    """A token holder connected to every node at `addrs`, from KEY_FILE:TOKEN."""
    key, token = key_and_token.split(":", 1)
    async with open_attacker(addrs, identity.load_identity(key)) as member:
        member.token = token
        yield member


def member_record(member: Attacker, seq: int, run_id: str) -> bytes:
    body = {
        "addrs": [],
        "data_addrs": [],
        "role": "observer",
        "planner_capable": False,
        "version": "0.1.0",
        "hardware": {},
        "compute_gflops": None,
        "token": member.token,
    }
    return wire.sign(member.seed, "peer", seq, body, run_id=run_id)


def huge_telemetry(member: Attacker, seq: int, run_id: str) -> bytes:
    metrics = {
        "step": 10**6,
        "loss": HUGE,
        "tokens_per_s": HUGE,
        "stage": 0,
        "replica": 0,
        "step_s": HUGE,
    }
    body: dict[str, Any] = {"links": {}, "metrics": metrics}
    return wire.sign(member.seed, "telemetry", seq, body, run_id=run_id)


def serve_lies(member: Attacker, counts: Counter[str]) -> None:
    """Answer every dial-back request "reached" (10) and accept every relay offer."""

    async def dial_back(stream: INetStream) -> None:
        with contextlib.suppress(Exception):
            await read_frame(stream, 4096)
            remote = stream.get_remote_address() or ("127.0.0.1", 1)
            reached = f"/ip4/{remote[0]}/tcp/{remote[1]}"
            reply = DialBackReply(reached, (DialResult(reached, True),), time.time())
            await write_frame(stream, json.dumps(reply.to_dict()).encode())
            counts["dialback_lies"] += 1
        with contextlib.suppress(Exception):
            await stream.close()

    async def take_offer(stream: INetStream) -> None:
        with contextlib.suppress(Exception):
            await read_frame(stream, 4096)
            counts["offers_taken"] += 1
            await write_frame(stream, json.dumps({"accept": True, "endpoint": ""}).encode())
        with contextlib.suppress(Exception):
            await stream.close()

    member.host.set_stream_handler(DIALBACK_PROTOCOL, dial_back)
    member.host.set_stream_handler(OFFER_PROTOCOL, take_offer)
