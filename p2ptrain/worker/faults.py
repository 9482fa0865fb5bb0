"""Fault injection for tests: the faults a worker was started with, and the one hook that fires
them. Stdlib only.

A fault names its kind and the role and step it fires at, `KIND@STEP:STAGE:REPLICA`, e.g.
`die-while-averaging@2:1:1`; the worker takes them as repeatable `--fault` flags
(worker/settings.py), given by the harness (harness/with_faults.py wraps `join` and `local`;
the product's commands have no such flag), and its session calls `before_averaging` at the
averaging point (sync = "diloco": as an outer round starts after that step):
- die-while-averaging: SIGKILL the worker's whole process group (worker, hivemind children,
  p2pd) a few ms into that step's averaging round;
- skip-averaging: keep the local gradient at that step (diloco: join the outer round that
  starts there but do not apply its mean, so the replicas' anchors diverge);
- freeze: SIGSTOP the worker's whole process group there (a hung worker behind a live control
  process, issue 11 attack 7); SIGCONT or SIGKILL the group to end it.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import threading
from dataclasses import dataclass

FLAG = "--fault"
DIE_WHILE_AVERAGING = "die-while-averaging"
SKIP_AVERAGING = "skip-averaging"
FREEZE = "freeze"
KINDS = (DIE_WHILE_AVERAGING, SKIP_AVERAGING, FREEZE)
_NUMBER = re.compile(r"[0-9]{1,15}")
# after our metadata left, before the round (a loopback one takes ~10 ms) can finish
DIE_DELAY_S = 0.003


@dataclass(frozen=True)
class Fault:
    kind: str
    step: int
    stage: int
    replica: int

    @classmethod
    def parse(cls, text: str) -> Fault:
        """A fault from `KIND@STEP:STAGE:REPLICA`; ValueError if it is not one."""
        kind, _, where = text.partition("@")
        numbers = where.split(":")
        # ASCII digits: str.isdigit() takes "²", which int() refuses
        valid = len(numbers) == 3 and all(_NUMBER.fullmatch(n) for n in numbers)
        if kind not in KINDS or not valid:
            raise ValueError(
                f"a fault is KIND@STEP:STAGE:REPLICA with KIND one of {', '.join(KINDS)}, "
                f"got {text!r}"
            )
        step, stage, replica = (int(n) for n in numbers)
        return cls(kind, step, stage, replica)

    def __str__(self) -> str:
        return f"{self.kind}@{self.step}:{self.stage}:{self.replica}"


def fault_arg(text: str) -> Fault:
    """A `--fault` flag's value (an argparse type)."""
    try:
        return Fault.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


@dataclass(frozen=True)
class Faults:
    """The faults of one worker (none in production)."""

    items: tuple[Fault, ...] = ()

    def to_argv(self) -> list[str]:
        """The worker flags that inject these faults."""
        return [arg for fault in self.items for arg in (FLAG, str(fault))]

    def before_averaging(self, step: int, stage: int, replica: int) -> bool:
        """Called as this role starts averaging this step's gradients; True: keep the local
        gradient instead."""
        here = [
            f.kind for f in self.items if (f.step, f.stage, f.replica) == (step, stage, replica)
        ]
        if DIE_WHILE_AVERAGING in here:
            threading.Timer(DIE_DELAY_S, os.killpg, (os.getpgid(0), signal.SIGKILL)).start()
        if FREEZE in here:
            os.killpg(os.getpgid(0), signal.SIGSTOP)  # returns only once continued
        return SKIP_AVERAGING in here


NO_FAULTS = Faults()
