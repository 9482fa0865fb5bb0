"""Where an outer round's messages wait for the round that takes them (thread-safe, bounded).

A groupmate may start a round before we do (replicas run their steps at their own pace), so a
message is kept until our round takes it or forgets its step. Before a payload byte is read the
inbox decides: only the current group's members are read at all, a payload may be no larger than
the stage's largest message, its round key must be one round_key writes, of a step at most the
exchange's horizon (a few rounds past our latest one), and a sender holds at most
MAX_HELD_PER_SENDER messages at once, counting those being read (a round needs one or two of
each: more is a flood; concurrent streams must not each see room for one more), and as many
confirmations (32 bytes each) apart, so they never take a payload's place.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

from p2ptrain.worker.averaging.outer_wire import (
    ACCEPTED,
    BUSY,
    CONFIRM,
    DIGEST_BYTES,
    REJECTED,
    RoundHeader,
    parse_round_key,
)

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


def _key(header: RoundHeader) -> _Key:
    return (header.round, header.kind, header.sender, header.shard)


class RoundInbox:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._held: dict[_Key, tuple[RoundHeader, bytes]] = {}
        self._reading: set[_Key] = set()  # screened, payload being read
        self._members: frozenset[str] = frozenset()
        self._max_bytes = 0
        self._horizon: int | None = None  # the highest step read (None: no round yet)

    def admit_group(self, members: Iterable[str], max_payload_bytes: int) -> None:
        """The members whose messages are read from now on, and the largest payload allowed;
        what others parked goes. A new group's first round may be at any step: no horizon
        until it starts."""
        with self._cond:
            self._members = frozenset(members)
            self._max_bytes = max_payload_bytes
            self._horizon = None
            for key in [k for k in self._held if k[2] not in self._members]:
                del self._held[key]

    def admit_steps(self, horizon: int) -> None:
        """Read rounds of steps up to `horizon` only (a round starts: our step + the window)."""
        with self._cond:
            self._horizon = horizon

    def is_member(self, peer: str) -> bool:
        with self._cond:
            return peer in self._members

    def screen(self, header: RoundHeader, remote: str) -> bytes | None:
        """None: read the payload, then put() it or release() it; else the answer that refuses
        the message unread."""
        with self._cond:
            if header.sender != remote or remote not in self._members:
                return BUSY  # not (yet) in our group: a groupmate of a newer plan retries
            if header.num_bytes > self._max_bytes or (
                header.kind == CONFIRM and header.num_bytes != DIGEST_BYTES
            ):
                return REJECTED
            parsed = parse_round_key(header.round)
            if parsed is None or (self._horizon is not None and parsed[1] > self._horizon):
                return REJECTED  # not ours, or rounds past any we would reach in its time
            key = _key(header)
            if key in self._held:
                return ACCEPTED  # a retried copy: the first one stays
            if key in self._reading:
                return BUSY  # a copy is being read: retry once it is in (or failed)
            if self._num_of(remote, header.kind == CONFIRM) >= MAX_HELD_PER_SENDER:
                return BUSY
            self._reading.add(key)
            return None

    def _num_of(self, sender: str, confirmations: bool) -> int:
        """The sender's messages held or being read, confirmations or the others (the caller
        holds the lock)."""
        return sum(
            1
            for keys in (self._held, self._reading)
            for k in keys
            if k[2] == sender and (k[1] == CONFIRM) == confirmations
        )

    def put(self, header: RoundHeader, payload: bytes) -> None:
        """File a screened message (its reservation ends)."""
        with self._cond:
            key = _key(header)
            self._reading.discard(key)
            self._held.setdefault(key, (header, payload))
            self._cond.notify_all()

    def release(self, header: RoundHeader) -> None:
        """End a screened message's reservation without filing it (its read failed)."""
        with self._cond:
            self._reading.discard(_key(header))

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
