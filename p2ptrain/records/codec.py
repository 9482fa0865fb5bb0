"""Declared records: each field of a record carries its bounds, and one codec derives the record's
JSON form (`to_dict`) and its total decoder (`from_dict`) from that declaration.

    @dataclass(frozen=True)
    class Hello(Record, name="hello", kind="hello"):  # kind: written first as "type"
        peer_id: Annotated[str, PeerId()]
        pid: Annotated[int, Int(0, MAX_PID)]
        reason: Annotated[str, Text(160, empty=True), Wire(omit_default=True)] = ""

A bare `int`, `float`, `bool` or `str` reads with the field readers' defaults (fields.py), a
Record type as that record, `X | None` as null or X. A field without a default is required on
the wire unless `Wire(absent=...)` says what its absence means; unknown keys are ignored (a newer
peer may add some). Checks across fields go in `wire_problem`; a ValueError raised while the
record is built (its own `__post_init__`) is a malformed record too, and so, as a backstop, is
any other exception a reader raises. So `from_dict` returns a valid record or raises WireError,
never anything else.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar, Self

from p2ptrain.errors import WireError
from p2ptrain.records import fields as f


class Spec:
    """How a field's value is read off the wire (bounded) and written back."""

    def read(self, value: object, record: str, name: str) -> Any:
        raise NotImplementedError

    def write(self, value: Any) -> Any:
        return value


@dataclass(frozen=True)
class Custom(Spec):
    """A reader (and writer) of the record's own, for a shape the specs below do not cover."""

    reader: Callable[[object, str, str], Any]
    writer: Callable[[Any], Any] = lambda value: value

    def read(self, value: object, record: str, name: str) -> Any:
        return self.reader(value, record, name)

    def write(self, value: Any) -> Any:
        return self.writer(value)


# the specs that are one reader of fields.py, with no bounds of their own
Bool = partial(Custom, f.boolean)
PeerId = partial(Custom, f.peer_id)
Addr = partial(Custom, f.multiaddr)
Addrs = partial(Custom, f.addrs, list)  # a tuple, written as a list
FreeForm = partial(Custom, f.free_form)


@dataclass(frozen=True)
class Int(Spec):
    low: int = 0
    high: int = f.MAX_INT

    def read(self, value: object, record: str, name: str) -> int:
        return f.integer(value, record, name, self.low, self.high)


@dataclass(frozen=True)
class Num(Spec):
    """A finite number, as a float; `digits`: written rounded (a compact gossip body)."""

    low: float = 0.0
    high: float = math.inf
    digits: int | None = None

    def read(self, value: object, record: str, name: str) -> float:
        return f.number(value, record, name, self.low, self.high)

    def write(self, value: Any) -> Any:
        return value if self.digits is None else round(value, self.digits)


@dataclass(frozen=True)
class _Word(Spec):
    """A string: "" passes unread where `empty` (not said), anything else is `read_word`'s."""

    empty: bool = dataclasses.field(default=False, kw_only=True)

    def read(self, value: object, record: str, name: str) -> str:
        return "" if self.empty and value == "" else self.read_word(value, record, name)

    def read_word(self, value: object, record: str, name: str) -> str:
        raise NotImplementedError


@dataclass(frozen=True)
class Text(_Word):
    """1..max_chars printable characters, or "" where `empty`."""

    max_chars: int = f.MAX_ID_CHARS

    def read_word(self, value: object, record: str, name: str) -> str:
        return f.text(value, record, name, self.max_chars)


@dataclass(frozen=True)
class OneOf(_Word):
    allowed: tuple[str, ...]

    def read_word(self, value: object, record: str, name: str) -> str:
        return f.choice(value, record, name, self.allowed)


@dataclass(frozen=True)
class PeerIds(Spec):
    max_items: int = f.MAX_PEERS

    def read(self, value: object, record: str, name: str) -> tuple[str, ...]:
        return f.peer_ids(value, record, name, self.max_items)

    def write(self, value: Any) -> Any:
        return list(value)


@dataclass(frozen=True)
class Nullable(Spec):
    """null (None) or the inner spec's value."""

    inner: Spec

    def read(self, value: object, record: str, name: str) -> Any:
        return None if value is None else self.inner.read(value, record, name)

    def write(self, value: Any) -> Any:
        return None if value is None else self.inner.write(value)


@dataclass(frozen=True)
class Nested(Spec):
    """Another record, as its own object."""

    kind: Any  # a Record, or a class with the same from_dict/to_dict

    def read(self, value: object, record: str, name: str) -> Any:
        return self.kind.from_dict(value)

    def write(self, value: Any) -> Any:
        return value.to_dict()


@dataclass(frozen=True)
class Seq(Spec):
    """A list of at most `max_items` (at least `min_items`), read into a tuple."""

    item: Spec
    max_items: int = f.MAX_PEERS
    min_items: int = 0

    def read(self, value: object, record: str, name: str) -> tuple[Any, ...]:
        if not isinstance(value, list) or not self.min_items <= len(value) <= self.max_items:
            raise f.malformed(
                record, f"{name} must be a list of {self.min_items}..{self.max_items} items"
            )
        return tuple(self.item.read(v, record, name) for v in value)

    def write(self, value: Any) -> Any:
        return [self.item.write(v) for v in value]


@dataclass(frozen=True)
class Map(Spec):
    """An object of at most `max_items` entries, keyed by peer id unless `key` says otherwise."""

    value: Spec
    max_items: int = f.MAX_PEERS
    key: Spec = dataclasses.field(default_factory=PeerId)

    def read(self, value: object, record: str, name: str) -> dict[str, Any]:
        entries = f.mapping(value, record)
        if len(entries) > self.max_items:
            raise f.malformed(record, f"{name} names more than {self.max_items} entries")
        return {
            self.key.read(k, record, f"{name} key"): self.value.read(v, record, name)
            for k, v in entries.items()
        }

    def write(self, value: Any) -> Any:
        return {k: self.value.write(v) for k, v in value.items()}


_REQUIRED: Any = object()
MAX_PROBLEM_CHARS = 200  # of an exception's text quoted in the wire error (it may quote input)
# the wire error of a reader's slip (the fuzz tests look for it: a slip is still a bug)
UNREADABLE = "unreadable"


@dataclass(frozen=True)
class Wire:
    """How a field sits in the object: its key ("": the field's name), whether it is left out
    while it holds its default, what its absence means for a field without a default, and
    whether a field with a default must be sent all the same."""

    key: str = ""
    omit_default: bool = False
    absent: Any = _REQUIRED
    required: bool = False


@dataclass(frozen=True)
class _Field:
    name: str
    key: str
    spec: Spec
    default: Any  # _REQUIRED: the key must be present
    omit_default: bool


class Record:
    """A record declared by its annotated fields; subclasses are frozen dataclasses."""

    RECORD: ClassVar[str] = "record"  # its name in error messages
    # a message's type, written first as "type" (message_from_dict dispatches on it); "": none
    TYPE: ClassVar[str] = ""

    def __init_subclass__(cls, name: str = "", kind: str = "", **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if name:
            cls.RECORD = name
        if kind:
            cls.TYPE = kind

    def wire_problem(self) -> str | None:
        """What makes a decoded record invalid across its fields (None: nothing)."""
        return None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {}
        if self.TYPE:
            data["type"] = self.TYPE
        for field in _fields_of(type(self)):
            value = getattr(self, field.name)
            if field.omit_default and value == field.default:
                continue
            data[field.key] = field.spec.write(value)
        return data

    @classmethod
    def from_dict(cls, data: object) -> Self:
        record = cls.RECORD
        d = f.mapping(data, record)
        table = _fields_of(cls)
        f.require_keys(d, record, tuple(t.key for t in table if t.default is _REQUIRED))
        try:
            values = {
                t.name: t.spec.read(d[t.key], record, t.key) if t.key in d else t.default
                for t in table
            }
            try:
                result = cls(**values)
            except WireError:
                raise
            except ValueError as exc:  # the record's own __post_init__ refused the values
                raise f.malformed(record, str(exc)[:MAX_PROBLEM_CHARS]) from None
            problem = result.wire_problem()
        except WireError:
            raise
        except Exception as exc:  # a reader's slip must not escape: the decoder stays total
            raise f.malformed(record, f"{UNREADABLE} ({type(exc).__name__})") from None
        if problem is not None:
            raise f.malformed(record, problem)
        return result


_TABLES: dict[type, tuple[_Field, ...]] = {}


def _fields_of(cls: type[Record]) -> tuple[_Field, ...]:
    table = _TABLES.get(cls)
    if table is None:
        hints = typing.get_type_hints(cls, include_extras=True)
        table = tuple(_field(field, hints[field.name]) for field in dataclasses.fields(cls))  # type: ignore[arg-type]
        _TABLES[cls] = table
    return table


def _field(field: dataclasses.Field[Any], hint: Any) -> _Field:
    extras = getattr(hint, "__metadata__", ())
    specs = [e for e in extras if isinstance(e, Spec)]
    wire = next((e for e in extras if isinstance(e, Wire)), Wire())
    spec = specs[0] if specs else spec_of(typing.get_args(hint)[0] if extras else hint)
    if wire.required:
        default = _REQUIRED
    elif field.default is not dataclasses.MISSING:
        default = field.default
    elif field.default_factory is not dataclasses.MISSING:
        default = field.default_factory()
    else:
        default = wire.absent
    return _Field(field.name, wire.key or field.name, spec, default, wire.omit_default)


def spec_of(hint: Any) -> Spec:
    """The spec a bare type reads with."""
    args = typing.get_args(hint)
    if isinstance(hint, types.UnionType) and len(args) == 2 and type(None) in args:
        inner = args[0] if args[1] is type(None) else args[1]
        return Nullable(spec_of(inner))
    if hint is bool:
        return Bool()
    if hint is int:
        return Int()
    if hint is float:
        return Num()
    if hint is str:
        return Text()
    if isinstance(hint, type) and hasattr(hint, "from_dict") and hasattr(hint, "to_dict"):
        return Nested(hint)
    raise TypeError(f"no spec for {hint!r}: annotate the field with one")
