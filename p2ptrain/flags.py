"""Command-line flags declared once.

A `Flag` is a flag's name and argparse options, added the same way by every command that takes
it. A `FlagSettings` record (a frozen dataclass whose every field is a `flag_field`) is a child
process's settings: its parser, the record read from a parsed command line and the argv that
gives a child those settings all come from the fields, so a flag is named in one place only
(control/settings.py's `ControlSettings`, worker/settings.py's `WorkerSettings`); every child
is started as `python_module` says. Stdlib only:
`p2ptrain --help` imports this.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any, ClassVar, Self


def python_module(module: str, *args: str) -> list[str]:
    """The command line that runs `python -m MODULE ARGS` in this interpreter, with `-P`: plain
    `-m` puts the working directory first on the module path, so a stray `attrs.py` or
    `random.py` where a volunteer started the node replaced a library in every child (a crash
    at import, or someone else's code run as ours)."""
    return [sys.executable, "-P", "-m", module, *args]


@dataclass(frozen=True)
class Flag:
    """One command-line flag: its name and argparse options, added the same way everywhere."""

    name: str
    options: Mapping[str, Any]

    def but(self, **options: Any) -> Flag:
        """This flag with some options replaced (a command's own default or wording)."""
        return Flag(self.name, {**self.options, **options})

    def add(
        self, parser: argparse.ArgumentParser | argparse._ArgumentGroup, **options: Any
    ) -> None:
        parser.add_argument(self.name, **{**self.options, **options})


def flag_field(flag: Flag, default: Any = None, *, required: bool = False, **how: Any) -> Any:
    """A field of a FlagSettings record that is this flag; argparse's default is the field's
    (`how`: flag_metadata's options)."""
    metadata = flag_metadata(flag.but(required=True) if required else flag, **how)
    if required:
        return field(metadata=metadata)
    return field(default=default, metadata=metadata)


def flag_metadata(
    flag: Flag,
    one_of: str | None = None,
    read: Callable[[Any], Any] | None = None,
    write: Callable[[Any], list[str]] | None = None,
) -> dict[str, Any]:
    """What makes a dataclass field a flag. `one_of`: exactly one of the fields naming the same
    group must be given. `read` turns the parsed value into the field's, `write` the field's
    value into argv (default: a list becomes a tuple; True is the bare flag, a tuple its values,
    anything else str())."""
    return {"flag": flag, "one_of": one_of, "read": read, "write": write}


def _flags(record: Any) -> tuple[Field[Any], ...]:
    return fields(record)


class FlagRecord:
    """Base of a frozen dataclass of flag_fields: a command's flags as one record."""

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        groups: dict[str, argparse._MutuallyExclusiveGroup] = {}
        for spec in _flags(cls):
            flag: Flag = spec.metadata["flag"]
            default = spec.default
            if default not in (MISSING, None) and "action" not in flag.options:
                flag = flag.but(default=list(default) if isinstance(default, tuple) else default)
            one_of = spec.metadata["one_of"]
            if one_of is None:
                flag.add(parser, dest=spec.name)
            else:
                if one_of not in groups:
                    groups[one_of] = parser.add_mutually_exclusive_group(required=True)
                flag.add(groups[one_of], dest=spec.name)

    @classmethod
    def check(cls, parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
        """Refuse (parser.error) what the flags allow one by one but not together."""

    @classmethod
    def from_args(cls, args: object, **given: Any) -> Self:
        """The record of a parsed command line, or of another record whose flags share these
        fields' names (a node's flags are its children's): the fields `args` has, and `given`."""
        values = dict(given)
        for spec in _flags(cls):
            if spec.name in given or not hasattr(args, spec.name):
                continue
            value = getattr(args, spec.name)
            read = spec.metadata["read"]
            values[spec.name] = read(value) if read else _plain(value)
        return cls(**values)


class FlagSettings(FlagRecord):
    """A child process's settings, which it reads from its command line and its parent writes
    into one (`command()`)."""

    MODULE: ClassVar[str]  # `python -m MODULE` runs the child
    DESCRIPTION: ClassVar[str]

    @classmethod
    def from_argv(cls, argv: Sequence[str] | None = None) -> Self:
        """Parse the child's command line (default: this process's); exit 2 on bad flags."""
        parser = argparse.ArgumentParser(
            prog=f"python -m {cls.MODULE}", description=cls.DESCRIPTION
        )
        cls.add_arguments(parser)
        args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
        cls.check(parser, args)
        return cls.from_args(args)

    def to_argv(self) -> list[str]:
        """The flags that give a child these settings (defaults left out)."""
        argv: list[str] = []
        for spec in _flags(self):
            name, value = spec.metadata["flag"].name, getattr(self, spec.name)
            if value is None or value == spec.default or value is False:
                continue
            write = spec.metadata["write"]
            if write is not None:
                argv += write(value)
            elif value is True:
                argv.append(name)
            elif isinstance(value, tuple):
                argv += [name, *value]
            else:
                argv += [name, str(value)]
        return argv

    def command(self) -> list[str]:
        """The command line that starts a child with these settings."""
        return python_module(self.MODULE, *self.to_argv())


def _plain(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value
