from p2ptrain.ipc_lines import MAX_LINE_BYTES, LineBuffer, decode, encode


def test_lines_split_across_chunks_and_oversized_lines_are_dropped() -> None:
    lines = LineBuffer()
    assert lines.feed(b'{"type": "a"}\n{"ty') == [b'{"type": "a"}']
    assert lines.feed(b'pe": "b"}\n') == [b'{"type": "b"}']
    assert lines.feed(b"x" * (MAX_LINE_BYTES + 1)) == []  # dropped, not buffered forever
    assert lines.feed(b'\n{"type": "c"}\n') == [b"", b'{"type": "c"}']


def test_decode_accepts_only_typed_objects() -> None:
    assert decode(encode({"type": "plan", "plan": {}})) == {"type": "plan", "plan": {}}
    assert decode(b"not json") is None
    assert decode(b"[1, 2]") is None
    assert decode(b'{"type": 3}') is None
