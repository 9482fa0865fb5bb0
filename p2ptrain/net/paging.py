"""Paged replies for request/response protocols (sync, status): a request names a cursor, a reply
holds whole items up to a byte budget and the next cursor, so no reply is ever cut mid-record."""

from __future__ import annotations

import json
from typing import Any, TypeVar

from p2ptrain.errors import WireError
from p2ptrain.records.fields import json_value
from p2ptrain.records.replies import MAX_CURSOR, Cursor

T = TypeVar("T")


def read_cursor(request: bytes) -> int:
    """The page a sync or status request asks for: `{"cursor": n}`, or 0 for an empty request."""
    if not request:
        return 0
    try:
        return Cursor.from_dict(json_value(request, "paged request")).cursor
    except WireError as exc:
        raise WireError(f'{exc} (a paged request is {{"cursor": n}})') from None


def cursor_request(cursor: int) -> bytes:
    return json.dumps(Cursor(cursor).to_dict()).encode()


def page_of(items: list[T], cursor: int, budget_bytes: int) -> tuple[list[T], int | None]:
    """Whole items from `cursor` while their JSON size fits the budget (at least one, so every
    page makes progress), and the next cursor (None after the last item)."""
    page: list[T] = []
    used = 0
    index = cursor
    while index < len(items):
        size = len(json.dumps(items[index])) + 1
        if page and used + size > budget_bytes:
            break
        page.append(items[index])
        used += size
        index += 1
    return page, (index if index < len(items) else None)


def next_cursor(reply: dict[str, Any], cursor: int) -> int | None:
    """A raw reply's next cursor, checked (see checked_next)."""
    return checked_next(reply.get("next"), cursor)


def checked_next(nxt: object, cursor: int) -> int | None:
    """A page's next cursor, checked: None or a cursor past this one (no loops)."""
    if nxt is None:
        return None
    if not isinstance(nxt, int) or isinstance(nxt, bool) or not cursor < nxt <= MAX_CURSOR:
        raise ValueError(f"bad next cursor {nxt!r}")
    return nxt
