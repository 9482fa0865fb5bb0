"""The control process's settings, and the flags the node commands share with it.

`ControlSettings` is one frozen record, as worker/settings.py's `WorkerSettings` is for the
worker: the control process reads it from its command line and the supervisor writes it into one
(node/supervisor.py). Each field declares its flag, so the parser, the record and the child's argv
come from that one declaration. `join`, `bootstrap` and `doctor` add the same flags (`--bootstrap`,
`--listen`, `--announce`, `--identity`, `--token`, `--http`, `--quiet`), with their own default
or wording where theirs differs. Stdlib only: `p2ptrain --help` imports this.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from p2ptrain.addresses import LOOPBACK

ROLES = ("control-only", "trainer")  # a bootstrap runs in its own command's process


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


BOOTSTRAP = Flag("--bootstrap", {"required": True, "help": "the bootstrap's full multiaddr"})
LISTEN = Flag(
    "--listen",
    {"metavar": "MADDR", "help": "the control plane's listen multiaddr (default %(default)s)"},
)
ANNOUNCE = Flag(
    "--announce",
    {
        "nargs": "+",
        "default": [],
        "metavar": "MADDR",
        "help": "the control-plane addresses others should dial (e.g. a public IP); default: "
        "this machine's interface addresses",
    },
)
IDENTITY = Flag("--identity", {"help": "Ed25519 key file (created if missing)"})
TOKEN = Flag(
    "--token",
    {
        "metavar": "TOKEN",
        "help": "the organiser's token for this peer (`p2ptrain token issue`), or a file holding "
        "it: needed to join a run with admission = 'token', and to be elected planner",
    },
)
HTTP = Flag(
    "--http",
    {
        "metavar": "[HOST:]PORT[,NAME...]",
        "help": "serve the live dashboard (the page, /api/status, /metrics) on [HOST:]PORT; "
        "read-only; HOST defaults to 127.0.0.1 (0.0.0.0 exposes it); NAMEs: the host names the "
        "page may be reached by besides IP addresses and localhost (Host header, e.g. a reverse "
        "proxy's)",
    },
)
QUIET = Flag(
    "--quiet",
    {
        "action": "store_true",
        "help": "print only the node's multiaddr on stdout, no progress line per training step",
    },
)


def _flag(flag: Flag, default: Any = None, required: bool = False) -> Any:
    """A field of ControlSettings that is this flag (argparse's default: the field's)."""
    metadata = {"flag": flag.but(required=True) if required else flag}
    if required:
        return field(metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class ControlSettings:
    role: str = _flag(Flag("--role", {"choices": ROLES}), required=True)
    identity: str = _flag(IDENTITY, required=True)  # the node's key file
    bootstrap: str = _flag(BOOTSTRAP, required=True)
    listen: str = _flag(LISTEN, LOOPBACK)
    announce: tuple[str, ...] = _flag(ANNOUNCE, ())  # what others dial (default: from listen)
    ipc: str | None = _flag(Flag("--ipc", {"metavar": "SOCKET", "help": "the worker's socket"}))
    token: str | None = _flag(TOKEN)  # the token, or a file holding it
    quiet: bool = _flag(QUIET.but(help="no progress line per worker step"), False)
    http: str | None = _flag(HTTP)  # serve the dashboard (control/dashboard.py)

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        for spec in fields(cls):
            flag: Flag = spec.metadata["flag"]
            default = spec.default
            if default not in (MISSING, None) and "action" not in flag.options:
                flag = flag.but(default=list(default) if isinstance(default, tuple) else default)
            flag.add(parser, dest=spec.name)

    @classmethod
    def from_argv(cls, argv: Sequence[str] | None = None) -> ControlSettings:
        """Parse a control process's command line (default: this process's); exit 2 on bad
        flags."""
        parser = argparse.ArgumentParser(
            prog="python -m p2ptrain.control",
            description="The control process: the control plane of one node (py-libp2p + trio).",
        )
        cls.add_arguments(parser)
        args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
        values = {spec.name: getattr(args, spec.name) for spec in fields(cls)}
        return cls(**{**values, "announce": tuple(values["announce"])})

    def to_argv(self) -> list[str]:
        """The flags that give a control process these settings (defaults left out)."""
        argv: list[str] = []
        for spec in fields(self):
            name, value = spec.metadata["flag"].name, getattr(self, spec.name)
            if value is None or value == spec.default or value is False:
                continue
            if value is True:
                argv.append(name)
            elif isinstance(value, tuple):
                argv += [name, *value]
            else:
                argv += [name, str(value)]
        return argv

    def command(self) -> list[str]:
        """The command line that starts a control process with these settings."""
        return [sys.executable, "-m", "p2ptrain.control", *self.to_argv()]
