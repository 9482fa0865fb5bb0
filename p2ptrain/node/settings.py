"""A node's settings: `join`'s flags as one record (p2ptrain/flags.py), which the supervisor
(node/supervisor.py) hands on to its two children. A flag that a child takes too has the child's
name here, so the supervisor passes it on by name (`ControlSettings.from_args(node, ...)`) and
adds only what it decides itself: the role, the socket, the data plane's endpoint. `doctor`
takes the address flags with the same declarations. Stdlib only: `p2ptrain --help` imports this.
"""

from __future__ import annotations

from dataclasses import dataclass

from p2ptrain.addresses import JOIN_DATA_LISTEN, JOIN_LISTEN
from p2ptrain.control.settings import (
    ANNOUNCE,
    BOOTSTRAP,
    HTTP,
    IDENTITY,
    LISTEN,
    QUIET,
    TOKEN,
    VIA,
)
from p2ptrain.flags import Flag, FlagRecord, flag_field
from p2ptrain.worker.settings import CORPUS, TOKENIZER

DEFAULT_IDENTITY = "p2ptrain-identity.key"

# the flags that say where the node listens and what it announces (`doctor` takes them too)
NODE_LISTEN = LISTEN.but(
    default=JOIN_LISTEN,
    help="the control plane's listen multiaddr (default %(default)s: every interface)",
)
DATA_LISTEN = Flag(
    "--data-listen",
    {
        "default": JOIN_DATA_LISTEN,
        "metavar": "MADDR",
        "help": "the data plane's (the worker's p2pd) listen multiaddr, /ip4/HOST/tcp/PORT "
        "(default %(default)s)",
    },
)
NODE_ANNOUNCE = ANNOUNCE.but(
    help="the control-plane addresses others should dial (e.g. a public IP); the data plane "
    "announces the same hosts on its own port. Default: this machine's interface addresses",
)
CONTROL_ONLY = Flag(
    "--control-only",
    {"action": "store_true", "help": "run the control plane alone (no worker)"},
)
NODE_DEVICE = Flag(
    "--device",
    {
        "help": "where this node's stage trains: auto (the first CUDA GPU, else Apple's MPS, "
        "else the CPU), cpu, mps, cuda or cuda:I (default %(default)s)"
    },
)


@dataclass(frozen=True)
class NodeSettings(FlagRecord):
    bootstrap: str = flag_field(BOOTSTRAP, required=True)
    via: tuple[str, ...] = flag_field(VIA, ())  # the control process's: members to join through
    listen: str = flag_field(NODE_LISTEN, JOIN_LISTEN)
    data_listen: str = flag_field(DATA_LISTEN, JOIN_DATA_LISTEN)
    announce: tuple[str, ...] = flag_field(NODE_ANNOUNCE, ())
    announce_data: tuple[str, ...] = flag_field(
        Flag(
            "--announce-data",
            {
                "nargs": "+",
                "metavar": "MADDR",
                "help": "the data-plane addresses others should dial (default: from --announce)",
            },
        ),
        (),
    )
    identity: str = flag_field(IDENTITY, DEFAULT_IDENTITY)
    control_only: bool = flag_field(CONTROL_ONLY, False)
    device: str = flag_field(NODE_DEVICE, "auto")
    threads: int = flag_field(
        Flag(
            "--threads",
            {
                "type": int,
                "metavar": "N",
                "help": "torch CPU threads of the worker (default 0: every core this process "
                "may use)",
            },
        ),
        0,
    )
    checkpoint_dir: str | None = flag_field(
        Flag(
            "--checkpoint-dir",
            {
                "help": "where this node keeps its stage checkpoints (default: the run spec's "
                "checkpoint_dir)"
            },
        )
    )
    corpus: str | None = flag_field(CORPUS)
    tokenizer: str | None = flag_field(TOKENIZER)
    token: str | None = flag_field(TOKEN)
    metrics_log: str | None = flag_field(
        Flag(
            "--metrics-log",
            {
                "metavar": "FILE",
                "help": "append every report of this node's worker to FILE as a JSON line",
            },
        )
    )
    http: str | None = flag_field(HTTP)  # the control process serves the dashboard there
    quiet: bool = flag_field(QUIET, False)  # no progress lines: the multiaddr is the only one
    profile: bool = flag_field(  # the worker reports where each step's CPU went
        Flag(
            "--profile",
            {
                "action": "store_true",
                "help": "with --metrics-log: after each step's report, write where its CPU went "
                "(the worker's thread, its process tree, the averaging round; a `profile` line)",
            },
        ),
        False,
    )
