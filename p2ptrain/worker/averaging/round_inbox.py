"""Where an outer round's messages wait for the round that takes them (thread-safe, bounded).

A groupmate may start a round before we do (replicas run their steps at their own pace), so a
message is kept until our round takes it or forgets its step. Before a payload byte is read the
inbox decides: only the current group's members are read at all, a payload may be no larger than
the stage's largest message, and a sender holds at most MAX_HELD_PER_SENDER messages at once
(a round needs one or two of each: more is a flood).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

from p2ptrain.worker.averaging.outer_wire import ACCEPTED, BUSY, REJECTED, RoundHeader

MAX_HELD_PER_SENDER = 8
POLL_S = 0.2  # how often a waiting round checks whether it must stop
PACE_TICK_S = 0.1  # a paced round still notices should_stop() this often

_Key = tuple[str, str, str, int]  # round, kind, sender, shard


class RoundStopped(Exception):
    """The round's should_stop() turned true while it waited."""


def wait_or_stop(seconds: float, should_stop: Callable[[], bool]) -> None:
    """Sleep `seconds` (a paced round's pause), or raise RoundStopped once should_stop()."""
    wake = time.monotonic() + seconds
    while (left := wake - time.monotonic()) > 0:
        if should_stop():
            raise RoundStopped()
        time.sleep(min(left, PACE_TICK_S))


class RoundInbox:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._held: dict[_Key, tuple[RoundHeader, bytes]] = {}
        self._members: frozenset[str] = frozenset()
        self._max_bytes = 0

    def admit_group(self, members: Iterable[str], max_payload_bytes: int) -> None:
        """The members whose messages are read from now on, and the largest payload allowed."""
        with self._cond:
            self._members = frozenset(members)
            self._max_bytes = max_payload_bytes

    def screen(self, header: RoundHeader, remote: str) -> bytes | None:
        """None: read the payload; else the answer that refuses the message unread."""
        with self._cond:
            if header.sender != remote or remote not in self._members:
                return BUSY  # not (yet) in our group: a groupmate of a newer plan retries
            if header.num_bytes > self._max_bytes:
                return REJECTED
            key = (header.round, header.kind, header.sender, header.shard)
            if key in self._held:
                return ACCEPTED  # a retried copy: the first one stays
            if sum(1 for k in self._held if k[2] == remote) >= MAX_HELD_PER_SENDER:
                return BUSY
            return None

    def put(self, header: RoundHeader, payload: bytes) -> None:
        with self._cond:
            self._held.setdefault(
                (header.round, header.kind, header.sender, header.shard),
                (
                    header,
                    payload,
                ),
            )
            self._cond.notify_all()

    def take(
        self,
        round_key: str,
        kind: str,
        sender: str,
        shard: int,
        deadline: float,
        should_stop: Callable[[], bool],
    ) -> tuple[RoundHeader, bytes] | None:
        """The message once it is here; None at `deadline` (time.monotonic()); RoundStopped."""
        key = (round_key, kind, sender, shard)
        with self._cond:
            while key not in self._held:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                if should_stop():
                    raise RoundStopped()
                self._cond.wait(min(left, POLL_S))
            return self._held.pop(key)

    def forget(self, keep: Callable[[str], bool]) -> None:
        """Drop the messages of rounds `keep` rejects (finished or abandoned ones)."""
        with self._cond:
            for key in [k for k in self._held if not keep(k[0])]:
                del self._held[key]
