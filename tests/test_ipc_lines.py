"""The worker socket's line framing decodes into records, and nothing else."""

import math

from p2ptrain.ipc_lines import MAX_LINE_BYTES, LineBuffer, decode, encode
from p2ptrain.records import Hello, Stop


def test_lines_split_across_chunks_and_oversized_lines_are_dropped() -> None:
    lines = LineBuffer()
    assert lines.feed(b'{"type": "a"}\n{"ty') == [b'{"type": "a"}']
    assert lines.feed(b'pe": "b"}\n') == [b'{"type": "b"}']
    assert lines.feed(b"x" * (MAX_LINE_BYTES + 1)) == []  # dropped, not buffered forever
    assert lines.feed(b'\n{"type": "c"}\n') == [b"", b'{"type": "c"}']


def test_decode_gives_a_record_or_nothing() -> None:
    hello = Hello("12D3KooWx", ("/ip4/127.0.0.1/tcp/1",), 7)
    assert decode(encode(hello)) == hello
    assert decode(encode(Stop())) == Stop()
    for bad in (
        b"not json",
        b"[1, 2]",
        b'{"type": 3}',
        b'{"type": "plan", "plan": {}}',
        b"[" * 100_000,
        b'{"type": "hello", "peer_id": "x", "data_addrs": [], "pid": '
        + str(math.inf).encode()
        + b"}",
    ):
        assert decode(bad) is None
