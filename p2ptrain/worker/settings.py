"""The worker process's settings: one frozen record, read from its command line by the worker
and written into one by whoever starts it (the node supervisor, the harnesses), so that every
flag is named here only. Stdlib only: starting a worker must not import torch.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from p2ptrain.worker.faults import FLAG as FAULT_FLAG
from p2ptrain.worker.faults import KINDS as FAULT_KINDS
from p2ptrain.worker.faults import NO_FAULTS, Faults, fault_arg

DEFAULT_LISTEN_HOST = "127.0.0.1"
DEFAULT_LOG_LEVEL = "INFO"
DEFAULT_DEVICE = "auto"
# the names worker/device.py resolves (kept here too: this module must not import torch)
DEVICE_PATTERN = re.compile(r"auto|cpu|mps|cuda(:\d{1,3})?")
# a harness starts several workers on one machine: one torch thread each unless told otherwise
# (`join` gives its one worker every core: 0)
DEFAULT_THREADS = 1


@dataclass(frozen=True)
class WorkerSettings:
    ipc: str | None = None  # the control process's socket (records/messages.py)
    plan: str | None = None  # or a static plan file, whose pipelines name workers...
    name: str | None = None  # ...this one among them
    identity: str | None = None  # the node's key file (same peer id as its control process)
    checkpoint_dir: str | None = None  # default: the run spec's
    listen_host: str = DEFAULT_LISTEN_HOST  # where p2pd listens (/ip4/HOST/tcp/PORT)...
    listen_port: int = 0  # ...on this port (0: any)
    announce: tuple[str, ...] = ()  # what others dial (default: what p2pd reports, expanded)
    metrics_log: str | None = None  # append every report to this file as a JSON line
    log_level: str = DEFAULT_LOG_LEVEL
    device: str = DEFAULT_DEVICE  # auto | cpu | mps | cuda[:I] (worker/device.py)
    threads: int = DEFAULT_THREADS  # torch's CPU threads; 0 = every core this process may use
    profile: bool = False  # add each step's CPU profile to the metrics log (worker/profiler.py)
    faults: Faults = NO_FAULTS  # for tests (worker/faults.py)

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        source = parser.add_mutually_exclusive_group(required=True)
        source.add_argument(
            "--ipc",
            metavar="SOCKET",
            help="control process socket (messages: p2ptrain/records/messages.py)",
        )
        source.add_argument(
            "--plan", metavar="PLAN.json", help="static plan file (peers named by --name)"
        )
        parser.add_argument(
            "--name", help="with --plan: this worker's name in the plan's pipelines"
        )
        parser.add_argument(
            "--identity", metavar="KEY", help="node identity file (same peer id as control)"
        )
        parser.add_argument(
            "--checkpoint-dir", help="this node's checkpoint directory (default: the run spec's)"
        )
        parser.add_argument(
            "--listen-host",
            default=DEFAULT_LISTEN_HOST,
            metavar="IP",
            help="IPv4 address the data plane (p2pd) listens on (default %(default)s)",
        )
        parser.add_argument(
            "--listen-port",
            type=int,
            default=0,
            metavar="PORT",
            help="TCP port the data plane listens on (default 0: any)",
        )
        parser.add_argument(
            "--announce",
            nargs="+",
            default=[],
            metavar="MADDR",
            help="the data-plane addresses others should dial (default: the listen addresses)",
        )
        parser.add_argument(
            "--metrics-log", metavar="FILE", help="append every report to FILE as a JSON line"
        )
        parser.add_argument("--log-level", default=DEFAULT_LOG_LEVEL)
        parser.add_argument(
            "--device",
            default=DEFAULT_DEVICE,
            type=_device,
            help="where the stage trains: auto (the first CUDA GPU, else MPS, else the CPU), "
            "cpu, mps, cuda or cuda:I (default %(default)s)",
        )
        parser.add_argument(
            "--threads",
            type=_threads,
            default=DEFAULT_THREADS,
            metavar="N",
            help="torch CPU threads (default %(default)s; 0: every core this process may use)",
        )
        parser.add_argument(
            "--profile",
            action="store_true",
            help="after each step's metrics, report where its CPU went (a StepProfile)",
        )
        parser.add_argument(
            FAULT_FLAG,
            dest="faults",
            action="append",
            default=[],
            type=fault_arg,
            metavar="KIND@STEP:STAGE:REPLICA",
            help=f"for tests: inject a fault ({', '.join(FAULT_KINDS)}); repeatable",
        )

    @classmethod
    def from_argv(cls, argv: Sequence[str] | None = None) -> WorkerSettings:
        """Parse a worker command line (default: this process's); exit 2 on bad flags."""
        parser = argparse.ArgumentParser(
            prog="python -m p2ptrain.worker",
            description="The worker process: the data plane of one node (torch + hivemind).",
        )
        cls.add_arguments(parser)
        args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
        if args.plan and not args.name:
            parser.error("--plan needs --name")
        return cls(
            ipc=args.ipc,
            plan=args.plan,
            name=args.name,
            identity=args.identity,
            checkpoint_dir=args.checkpoint_dir,
            listen_host=args.listen_host,
            listen_port=args.listen_port,
            announce=tuple(args.announce),
            metrics_log=args.metrics_log,
            log_level=args.log_level,
            device=args.device,
            threads=args.threads,
            profile=args.profile,
            faults=Faults(tuple(args.faults)),
        )

    def to_argv(self) -> list[str]:
        """The flags that give a worker these settings (defaults left out)."""
        argv: list[str] = []
        for flag, value, default in (
            ("--ipc", self.ipc, None),
            ("--plan", self.plan, None),
            ("--name", self.name, None),
            ("--identity", self.identity, None),
            ("--checkpoint-dir", self.checkpoint_dir, None),
            ("--listen-host", self.listen_host, DEFAULT_LISTEN_HOST),
            ("--listen-port", self.listen_port, 0),
            ("--metrics-log", self.metrics_log, None),
            ("--log-level", self.log_level, DEFAULT_LOG_LEVEL),
            ("--device", self.device, DEFAULT_DEVICE),
            ("--threads", self.threads, DEFAULT_THREADS),
        ):
            if value != default:
                argv += [flag, str(value)]
        if self.announce:
            argv += ["--announce", *self.announce]
        if self.profile:
            argv.append("--profile")
        return argv + self.faults.to_argv()

    @property
    def listen_maddr(self) -> str:
        return f"/ip4/{self.listen_host}/tcp/{self.listen_port}"

    def command(self) -> list[str]:
        """The command line that starts a worker with these settings."""
        return [sys.executable, "-m", "p2ptrain.worker", *self.to_argv()]


def _device(text: str) -> str:
    if not DEVICE_PATTERN.fullmatch(text):
        raise argparse.ArgumentTypeError(f"auto, cpu, mps, cuda or cuda:I, got {text!r}")
    return text


def _threads(text: str) -> int:
    if not text.isdigit() or int(text) > 4096:
        raise argparse.ArgumentTypeError(f"a number of threads (0: all), got {text!r}")
    return int(text)
