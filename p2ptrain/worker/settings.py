"""The worker process's settings: one frozen record, read from its command line by the worker
and written into one by whoever starts it (the node supervisor, the harnesses), so that every
flag is named here only. Stdlib only: starting a worker must not import torch.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field

from p2ptrain.flags import Flag, FlagSettings, flag_field, flag_metadata
from p2ptrain.worker.faults import FLAG as FAULT_FLAG
from p2ptrain.worker.faults import KINDS as FAULT_KINDS
from p2ptrain.worker.faults import NO_FAULTS, Faults, fault_arg

DEFAULT_LISTEN_HOST = "127.0.0.1"
DEFAULT_LOG_LEVEL = "INFO"
DEFAULT_DEVICE = "auto"
# the names worker/device.py resolves (kept here too: this module must not import torch)
DEVICE_PATTERN = re.compile(r"auto|cpu|mps|cuda(:[0-9]{1,3})?")
# a harness starts several workers on one machine: one torch thread each unless told otherwise
# (`join` gives its one worker every core: 0)
DEFAULT_THREADS = 1


def device_arg(text: str) -> str:
    """argparse's type for a `--device` (the names worker/device.py resolves)."""
    if not DEVICE_PATTERN.fullmatch(text):
        raise argparse.ArgumentTypeError(f"auto, cpu, mps, cuda or cuda:I, got {text!r}")
    return text


def _threads(text: str) -> int:
    # ASCII digits: str.isdigit() takes "²", which int() refuses
    if not re.fullmatch(r"[0-9]{1,4}", text) or int(text) > 4096:
        raise argparse.ArgumentTypeError(f"a number of threads (0: all), got {text!r}")
    return int(text)


# repeatable; the harness's entry point adds it to `join` and `local` (harness/with_faults.py)
FAULT = Flag(
    FAULT_FLAG,
    {
        "action": "append",
        "default": [],
        "type": fault_arg,
        "metavar": "KIND@STEP:STAGE:REPLICA",
        "help": f"for tests: inject a fault ({', '.join(FAULT_KINDS)}); repeatable",
    },
)

# this node's copies of the run's files, wherever the volunteer keeps them (`join` passes them
# on): read instead of the run spec's paths (worker/node_paths.py)
CORPUS = Flag(
    "--corpus",
    {
        "metavar": "PATH",
        "help": "this node's copy of the run's data, a file or folder read instead of the run "
        "spec's data (a run that pins its data still checks the bytes)",
    },
)
TOKENIZER = Flag(
    "--tokenizer",
    {
        "metavar": "PATH",
        "help": "this node's copy of the run's tokenizer.json, read instead of the run spec's",
    },
)


@dataclass(frozen=True)
class WorkerSettings(FlagSettings):
    MODULE = "p2ptrain.worker"
    DESCRIPTION = "The worker process: the data plane of one node (torch + hivemind)."

    # the control process's socket (records/messages.py), or a static plan file
    ipc: str | None = flag_field(
        Flag(
            "--ipc",
            {
                "metavar": "SOCKET",
                "help": "control process socket (messages: p2ptrain/records/messages.py)",
            },
        ),
        one_of="source",
    )
    plan: str | None = flag_field(
        Flag(
            "--plan", {"metavar": "PLAN.json", "help": "static plan file (peers named by --name)"}
        ),
        one_of="source",
    )
    name: str | None = flag_field(
        Flag("--name", {"help": "with --plan: this worker's name in the plan's pipelines"})
    )
    identity: str | None = flag_field(  # the node's key file (same peer id as its control)
        Flag(
            "--identity", {"metavar": "KEY", "help": "node identity file (same peer id as control)"}
        )
    )
    checkpoint_dir: str | None = flag_field(
        Flag(
            "--checkpoint-dir",
            {"help": "this node's checkpoint directory (default: the run spec's)"},
        )
    )
    corpus: str | None = flag_field(CORPUS)  # this node's copy of the run's data
    tokenizer: str | None = flag_field(TOKENIZER)
    listen_host: str = flag_field(  # where p2pd listens (/ip4/HOST/tcp/PORT)...
        Flag(
            "--listen-host",
            {
                "metavar": "IP",
                "help": "IPv4 address the data plane (p2pd) listens on (default %(default)s)",
            },
        ),
        DEFAULT_LISTEN_HOST,
    )
    listen_port: int = flag_field(  # ...on this port (0: any)
        Flag(
            "--listen-port",
            {
                "type": int,
                "metavar": "PORT",
                "help": "TCP port the data plane listens on (default 0: any)",
            },
        ),
        0,
    )
    announce: tuple[str, ...] = flag_field(  # default: what p2pd reports, expanded
        Flag(
            "--announce",
            {
                "nargs": "+",
                "metavar": "MADDR",
                "help": "the data-plane addresses others should dial (default: those p2pd reports, "
                "wildcards expanded, loopback left out)",
            },
        ),
        (),
    )
    metrics_log: str | None = flag_field(
        Flag(
            "--metrics-log",
            {"metavar": "FILE", "help": "append every report to FILE as a JSON line"},
        )
    )
    log_level: str = flag_field(Flag("--log-level", {}), DEFAULT_LOG_LEVEL)
    device: str = flag_field(  # worker/device.py
        Flag(
            "--device",
            {
                "type": device_arg,
                "help": "where the stage trains: auto (the first CUDA GPU, else MPS, else the CPU), "
                "cpu, mps, cuda or cuda:I (default %(default)s)",
            },
        ),
        DEFAULT_DEVICE,
    )
    threads: int = flag_field(  # torch's CPU threads
        Flag(
            "--threads",
            {
                "type": _threads,
                "metavar": "N",
                "help": "torch CPU threads (default %(default)s; 0: every core this process may use)",
            },
        ),
        DEFAULT_THREADS,
    )
    profile: bool = flag_field(  # worker/profiler.py
        Flag(
            "--profile",
            {
                "action": "store_true",
                "help": "after each step's metrics, report where its CPU went (a StepProfile)",
            },
        ),
        False,
    )
    faults: Faults = field(
        default=NO_FAULTS,
        metadata=flag_metadata(
            FAULT, read=lambda items: Faults(tuple(items)), write=Faults.to_argv
        ),
    )

    @classmethod
    def check(cls, parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
        if args.plan and not args.name:
            parser.error("--plan needs --name")

    @property
    def listen_maddr(self) -> str:
        return f"/ip4/{self.listen_host}/tcp/{self.listen_port}"
