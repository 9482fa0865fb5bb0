"""A node's status pages are checked as they arrive (control/observer.py): each item validated
per page, and the running totals of peers, links and bytes bounded, so a hostile node cannot
make an observer (or doctor) hold 64 pages of unchecked objects before the whole is refused."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

from p2ptrain.control import observer
from p2ptrain.records import SwarmStatus
from tests.web.synthetic import swarm


def _serve(monkeypatch: pytest.MonkeyPatch, pages: list[dict[str, Any]], asked: list[int]) -> None:
    """rpc.call answering the status request for cursor n with pages[n]."""

    async def call(host: object, peer: object, protocol: object, request: bytes = b"") -> Any:
        cursor = json.loads(request)["cursor"]
        asked.append(cursor)
        return pages[cursor]

    monkeypatch.setattr(observer.rpc, "call", call)


def _paged(status: SwarmStatus, per_page: int) -> list[dict[str, Any]]:
    doc = status.to_dict()
    peers, links = doc.pop("peers"), doc.pop("links")
    num = max(len(peers), len(links)) // per_page + 1
    pages = [
        {
            "peers": peers[i * per_page : (i + 1) * per_page],
            "links": links[i * per_page : (i + 1) * per_page],
            "next": i + 1 if i + 1 < num else None,
        }
        for i in range(num)
    ]
    pages[0].update(doc)
    return pages


def _fetch() -> SwarmStatus:
    return trio.run(observer.fetch_status_doc, None, None)


def test_a_paged_status_arrives_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    status = swarm(8)
    asked: list[int] = []
    _serve(monkeypatch, _paged(status, 5), asked)
    assert _fetch() == status
    assert len(asked) > 1


def test_a_bad_item_is_refused_on_its_page(monkeypatch: pytest.MonkeyPatch) -> None:
    pages = _paged(swarm(8), 5)
    pages[0]["peers"] = [{}] * 5
    asked: list[int] = []
    _serve(monkeypatch, pages, asked)
    with pytest.raises(ValueError):
        _fetch()
    assert asked == [0]  # no second page asked for


def test_too_many_peers_are_refused_as_they_arrive(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(observer, "MAX_STATUS_PEERS", 6)
    asked: list[int] = []
    _serve(monkeypatch, _paged(swarm(12), 4), asked)
    with pytest.raises(ValueError, match="peers"):
        _fetch()
    assert asked == [0, 1]


def test_too_many_links_are_refused_as_they_arrive(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(observer, "MAX_STATUS_LINKS", 6)
    asked: list[int] = []
    _serve(monkeypatch, _paged(swarm(8), 4), asked)
    with pytest.raises(ValueError, match="links"):
        _fetch()
    assert asked == [0, 1]


def test_too_many_bytes_are_refused_as_they_arrive(monkeypatch: pytest.MonkeyPatch) -> None:
    pages = _paged(swarm(8), 4)
    monkeypatch.setattr(observer, "MAX_STATUS_BYTES", len(json.dumps(pages[0])) + 10)
    asked: list[int] = []
    _serve(monkeypatch, pages, asked)
    with pytest.raises(ValueError, match="bytes"):
        _fetch()
    assert asked == [0, 1]
