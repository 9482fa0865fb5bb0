"""The control process's settings, and the flags the node commands share with it.

`ControlSettings` is one frozen record, as worker/settings.py's `WorkerSettings` is for the
worker: the control process reads it from its command line and the supervisor writes it into one
(node/supervisor.py). Each field declares its flag (p2ptrain/flags.py), so the parser, the
record and the child's argv come from that one declaration. `join`, `bootstrap` and `doctor` add the same flags (`--bootstrap`,
`--listen`, `--announce`, `--identity`, `--token`, `--http`, `--quiet`), with their own default
or wording where theirs differs. Stdlib only: `p2ptrain --help` imports this.
"""

from __future__ import annotations

from dataclasses import dataclass

from p2ptrain.addresses import LOOPBACK
from p2ptrain.flags import Flag, FlagSettings, flag_field

ROLES = ("control-only", "trainer")  # a bootstrap runs in its own command's process
# how long a stopping node may stay to hand a stage only it holds over (control/handover.py),
# at least: the next plan (debounce and search: seconds), its start agreement and a small
# state's transfer; a large state adds its time over the plan's slowest link, up to an hour
# (schedule/handover_time.py: HANDOVER_BASE_S, MAX_HANDOVER_S). The control process writes its
# limit to HANDOVER_LIMIT_FILE beside its IPC socket, and the supervisor waits that long too
HANDOVER_LIMIT_S = 120.0
MAX_HANDOVER_S = 3600.0
HANDOVER_LIMIT_FILE = "handover-limit"

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
VIA = Flag(
    "--via",
    {
        "nargs": "+",
        "default": [],
        "metavar": "MADDR",
        "help": "members' full multiaddrs to join through while the bootstrap is unreachable: "
        "the run spec they hold counts only if the bootstrap's key signed it",
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


@dataclass(frozen=True)
class ControlSettings(FlagSettings):
    MODULE = "p2ptrain.control"
    DESCRIPTION = "The control process: the control plane of one node (py-libp2p + trio)."

    role: str = flag_field(Flag("--role", {"choices": ROLES}), required=True)
    identity: str = flag_field(IDENTITY, required=True)  # the node's key file
    bootstrap: str = flag_field(BOOTSTRAP, required=True)
    via: tuple[str, ...] = flag_field(VIA, ())  # members to join through, the bootstrap down
    listen: str = flag_field(LISTEN, LOOPBACK)
    announce: tuple[str, ...] = flag_field(ANNOUNCE, ())  # what others dial (default: listen)
    ipc: str | None = flag_field(
        Flag("--ipc", {"metavar": "SOCKET", "help": "the worker's socket"})
    )
    token: str | None = flag_field(TOKEN)  # the token, or a file holding it
    quiet: bool = flag_field(QUIET.but(help="no progress line per worker step"), False)
    http: str | None = flag_field(HTTP)  # serve the dashboard (control/dashboard.py)
