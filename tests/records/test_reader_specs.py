"""The specs that are one reader of records/fields.py each (records/codec.py `_Reads`): each
reads what its reader reads, refuses what it refuses with WireError, and tuples go out as lists."""

from typing import Any

import pytest

from p2ptrain.errors import WireError
from p2ptrain.records import fields as f
from p2ptrain.records.codec import Addr, Addrs, Bool, FreeForm, OneOf, PeerId, PeerIds, Spec, Text

ADDR = "/ip4/127.0.0.1/tcp/4001"
CASES: list[tuple[Spec, Any, Any, object]] = [
    (Bool(), f.boolean, True, "yes"),
    (PeerId(), f.peer_id, "peer-1", "no spaces"),
    (Addr(), f.multiaddr, ADDR, "not an address"),
    (Addrs(), f.addrs, [ADDR], ADDR),
    (FreeForm(), f.free_form, {"cpu": "x86"}, [1]),
]


@pytest.mark.parametrize(("spec", "reader", "good", "bad"), CASES)
def test_a_reader_spec_reads_as_its_reader(spec: Spec, reader: Any, good: Any, bad: object) -> None:
    assert spec.read(good, "rec", "field") == reader(good, "rec", "field")
    with pytest.raises(WireError, match="rec"):
        spec.read(bad, "rec", "field")


def test_tuples_are_written_as_lists() -> None:
    assert Addrs().write((ADDR,)) == [ADDR]
    assert PeerIds(2).write(("a", "b")) == ["a", "b"]
    with pytest.raises(WireError):
        PeerIds(2).read(["a", "b", "c"], "rec", "peers")
    assert Bool().write(True) is True


def test_empty_text_passes_only_where_the_spec_allows_it() -> None:
    assert Text(4, empty=True).read("", "rec", "note") == ""
    assert OneOf(("a", "b"), empty=True).read("", "rec", "kind") == ""
    assert OneOf(("a", "b"), empty=True).read("b", "rec", "kind") == "b"
    for spec in (Text(4), OneOf(("a", "b")), OneOf(("a", "b"), empty=True), Text(4, empty=True)):
        with pytest.raises(WireError, match="rec"):
            spec.read("toolong" if isinstance(spec, Text) else "c", "rec", "field")
    for spec in (Text(4), OneOf(("a", "b"))):
        with pytest.raises(WireError, match="rec"):
            spec.read("", "rec", "field")
