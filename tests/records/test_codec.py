"""The declared-records codec (records/codec.py): every record's declaration builds, bounds come
from the annotations, and whatever goes wrong while decoding is the one wire error."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, ClassVar

import pytest

from p2ptrain import records
from p2ptrain.errors import WireError
from p2ptrain.records.codec import (
    Custom,
    Int,
    Nullable,
    OneOf,
    Record,
    Seq,
    Text,
    Wire,
    _fields_of,
)


def _record_classes() -> list[type[Record]]:
    found: list[type[Record]] = []
    todo = list(Record.__subclasses__())
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo += cls.__subclasses__()
    return found


def test_every_declared_record_resolves_its_fields() -> None:
    assert records.Plan in _record_classes() and records.MetricsReport in _record_classes()
    for cls in _record_classes():
        if cls.__module__.startswith("p2ptrain."):
            table = _fields_of(cls)  # raises TypeError if a field has no spec
            assert len({field.key for field in table}) == len(table), cls


@dataclass(frozen=True)
class Sample(Record, name="sample"):
    TYPE: ClassVar[str] = "sample"
    count: Annotated[int, Int(1, 9)]
    kind: Annotated[str, OneOf(("a", "b"))]
    items: Annotated[tuple[int, ...], Seq(Int(), 2)]
    note: Annotated[str, Text(8, empty=True), Wire(key="n", omit_default=True)] = ""
    score: float | None = None
    absent_ok: Annotated[int | None, Nullable(Int()), Wire(absent=None)] = None

    def __post_init__(self) -> None:
        if self.count == 7:
            raise ValueError("seven is refused by the record itself")

    def wire_problem(self) -> str | None:
        return "b needs items" if self.kind == "b" and not self.items else None


def test_to_dict_writes_type_first_keys_and_omits_defaults() -> None:
    value = Sample(2, "a", (1, 2))
    assert list(value.to_dict()) == ["type", "count", "kind", "items", "score", "absent_ok"]
    assert Sample(2, "a", (), note="hi").to_dict()["n"] == "hi"
    assert Sample.from_dict(Sample(2, "a", (3,), note="hi").to_dict()) == Sample(
        2, "a", (3,), note="hi"
    )


@pytest.mark.parametrize(
    "data",
    [
        {"count": 0, "kind": "a", "items": []},  # below the declared bound
        {"count": True, "kind": "a", "items": []},  # a bool is not an int
        {"count": 2, "kind": "c", "items": []},  # not one of the enumeration
        {"count": 2, "kind": "a", "items": [1, 2, 3]},  # longer than declared
        {"count": 2, "kind": "a"},  # a required key missing
        {"count": 2, "kind": "a", "items": [], "score": float("nan")},  # not finite
        {"count": 2, "kind": "a", "items": [], "n": "x" * 9},  # too long
        {"count": 7, "kind": "a", "items": []},  # __post_init__'s ValueError
        {"count": 2, "kind": "b", "items": []},  # wire_problem
        [1, 2],
    ],
)
def test_bad_input_is_the_one_wire_error(data: object) -> None:
    with pytest.raises(WireError, match=r"^malformed sample"):
        Sample.from_dict(data)


def _int_of_text(value: object, record: str, name: str) -> int:
    """A reader with a slip: int("²") raises ValueError, as "²".isdigit() is true."""
    return int(str(value))


def _inverse(value: object, record: str, name: str) -> float:
    """A reader with another slip: 1 / 0, 1 / "x"."""
    return 1 / value  # type: ignore[operator]


@dataclass(frozen=True)
class Sloppy(Record, name="sloppy"):
    number: Annotated[int, Custom(_int_of_text)]
    inverse: Annotated[float, Custom(_inverse)]


@pytest.mark.parametrize(
    "data",
    [
        {"number": "²", "inverse": 1},  # ValueError
        {"number": 1, "inverse": 0},  # ZeroDivisionError
        {"number": 1, "inverse": "x"},  # TypeError
    ],
)
def test_whatever_a_reader_raises_is_the_wire_error(data: object) -> None:
    """The backstop: a field reader's slip (such as "²".isdigit() then int()) escaped
    `from_dict`, which callers guard with `except WireError` only, and ended the process."""
    assert Sloppy.from_dict({"number": "12", "inverse": 4}) == Sloppy(12, 0.25)
    with pytest.raises(WireError, match=r"^malformed sloppy"):
        Sloppy.from_dict(data)
