"""What an averager's process tells its worker's: hivemind runs each averager in a process of
its own (forked when it starts), so the bytes each round moved, what the round's reducers did,
and how many of our reducer's reply streams are still open cross a process boundary. Written
in the averager's process, read in the worker's; every primitive is made before the fork.

No hivemind here: worker/averaging/planned_group.py writes, stage_averager.py reads."""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
from collections.abc import Iterator

MAX_NOTE_CHARS = 2000  # one round's reducer report (a few peer ids and reasons)


class AveragerReports:
    """The averager process's side counts and notes a round, then sends it whole at the round's
    end (`round_done`); the worker reads after each round, so neither queue's pipe fills."""

    def __init__(self) -> None:
        self._notes: mp.SimpleQueue[str] = mp.SimpleQueue()  # writes at once: a round's note
        self._traffic: mp.SimpleQueue[str] = mp.SimpleQueue()  # is there when its result is
        self._uncounted: dict[str, list[int]] = {}
        self._replying = mp.Value("i", 0)

    # --- the averager's process ---

    def count(self, peer: str, sent: int, received: int) -> None:
        """Bytes sent to and received from `peer` in the round under way."""
        counts = self._uncounted.setdefault(peer, [0, 0])
        counts[0] += sent
        counts[1] += received

    def note(self, text: str) -> None:
        """What a round's reducer did (or failed to do), cut to MAX_NOTE_CHARS."""
        self._notes.put(text[:MAX_NOTE_CHARS])

    def round_done(self) -> None:
        """Send the round's byte counts, as {peer: [sent, received]}."""
        if self._uncounted:
            self._traffic.put(json.dumps(self._uncounted))
            self._uncounted = {}

    @contextlib.contextmanager
    def replying(self) -> Iterator[None]:
        """Around a reply stream of our reducer: counted open while it runs."""
        with self._replying.get_lock():
            self._replying.value += 1
        try:
            yield
        finally:
            with self._replying.get_lock():
                self._replying.value -= 1

    # --- the worker's process ---

    def traffic(self) -> dict[str, tuple[int, int]]:
        """The bytes sent to and received from each peer since the last call."""
        total: dict[str, tuple[int, int]] = {}
        while not self._traffic.empty():
            for peer, (sent, received) in json.loads(self._traffic.get()).items():
                old_sent, old_received = total.get(peer, (0, 0))
                total[peer] = (old_sent + sent, old_received + received)
        return total

    def notes(self) -> list[str]:
        """What the reducers dropped, clipped or were asked again since the last call."""
        notes = []
        while not self._notes.empty():
            notes.append(self._notes.get())
        return notes

    def replies_in_flight(self) -> int:
        """How many of our reducer's reply streams are open."""
        return int(self._replying.value)
