"""How large a groupmate's parked outer round message may be (worker/averaging/outer_exchange.py's
inbox_payload_bytes): a dense round's messages carry one shard, so the inbox refuses the whole
vector's bytes that it took before, yet still takes a retry's shards among fewer members."""

from __future__ import annotations

import pytest

from p2ptrain.train import codecs
from p2ptrain.worker.averaging import outer_wire as wire
from p2ptrain.worker.averaging.checks import Checksums
from p2ptrain.worker.averaging.outer_exchange import inbox_payload_bytes
from tests.worker.averaging.test_outer_exchange import NUMEL, PEERS, PREFIX, members

CLAIMS = Checksums(1, 1.0, 0.0, 0.0, 1.0)


@pytest.mark.parametrize("codec", ["fp16", "int8"])
@pytest.mark.parametrize("numel", [1, 2, 10_000, 10_001, 1_000_003])
def test_a_dense_bound_is_a_two_member_shard_not_the_whole_vector(codec: str, numel: int) -> None:
    bound = inbox_payload_bytes(codec, numel, 0.03)
    largest_shard = max(b - a for a, b in wire.shard_bounds(numel, 2))
    assert bound == wire.dense_bytes(codec, largest_shard)
    if numel >= 2 * codecs.INT8_BLOCK:
        assert bound < 0.51 * wire.max_message_bytes(codec, numel, 0.03)


def test_a_topk_bound_is_still_a_whole_payload() -> None:
    assert inbox_payload_bytes("topk", NUMEL, 0.03) == codecs.topk_payload_bytes(NUMEL, 0.03)


@pytest.mark.parametrize("codec", ["fp16", "int8"])
def test_a_groupmates_whole_vector_message_is_refused_unread(codec: str) -> None:
    """Three members: a PART is a third of the vector, a retry's among two half of it; a
    message of the whole vector's bytes is more than any honest one and is refused."""
    inbox = members(3, codec)[0][0].inbox
    key = wire.round_key(PREFIX, 9, 1, PEERS[:2])

    def screen(num_bytes: int) -> bytes | None:
        header = wire.RoundHeader(key, wire.PART, PEERS[1], 0, num_bytes, CLAIMS)
        answer = inbox.screen(header, PEERS[1])
        if answer is None:
            inbox.release(header)
        return answer

    whole = wire.dense_bytes(codec, NUMEL)
    half = wire.dense_bytes(codec, -(-NUMEL // 2))
    assert screen(half) is None  # a retry's shard among two members
    assert screen(half + 1) == wire.REJECTED
    assert screen(whole) == wire.REJECTED  # taken before: 8 of these parked a sender
