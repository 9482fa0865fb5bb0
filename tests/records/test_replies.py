"""The RPC replies are declared records: the JSON is what the protocols carried before, and bad
replies are the one WireError."""

from __future__ import annotations

import pytest

from p2ptrain.errors import WireError
from p2ptrain.net.paging import checked_next, cursor_request, read_cursor
from p2ptrain.records.replies import Cursor, RunReply, StatusPage, SyncPage


def test_the_replies_keep_their_json() -> None:
    assert RunReply(error="not a bootstrap").to_dict() == {"error": "not a bootstrap"}
    assert RunReply(envelope="{}").to_dict() == {"envelope": "{}"}
    page = SyncPage(("a", "b"), 2, 7, True)
    assert page.to_dict() == {"envelopes": ["a", "b"], "next": 2, "term": 7, "finished": True}
    assert SyncPage.from_dict(page.to_dict()) == page
    assert read_cursor(cursor_request(5)) == 5 and read_cursor(b"") == 0


@pytest.mark.parametrize(
    ("kind", "data"),
    [
        (RunReply, {}),
        (RunReply, {"envelope": 3}),
        (RunReply, {"envelope": "{}", "error": "both"}),
        (SyncPage, {"envelopes": "not a list"}),
        (SyncPage, {"envelopes": [], "term": -1}),
        (SyncPage, {"envelopes": [], "next": 0}),
        (SyncPage, {"envelopes": [], "finished": "yes"}),
        (StatusPage, {"peers": [1], "links": []}),
        (StatusPage, {"peers": [], "links": [], "next": True}),
        (Cursor, {"cursor": 2**31}),
        (Cursor, [1]),
    ],
)
def test_bad_replies_are_the_wire_error(kind: type, data: object) -> None:
    with pytest.raises(WireError):
        kind.from_dict(data)


def test_a_status_page_keeps_page_zeros_scalars() -> None:
    reply = {"observed_by": "x", "peers": [{"a": 1}], "links": [], "next": 1}
    page = StatusPage.from_dict(reply)
    assert (page.peers, page.next, StatusPage.scalars(reply)) == (
        ({"a": 1},),
        1,
        {"observed_by": "x"},
    )
    assert checked_next(page.next, 0) == 1
    with pytest.raises(ValueError):
        checked_next(1, 1)  # no loops
    for request in (b'{"cursor": -1}', b"\xff", b"[" * 100_000, b"{", b'{"cursor": 1e999}'):
        with pytest.raises(WireError):  # the one wire error (was a plain ValueError)
            read_cursor(request)
