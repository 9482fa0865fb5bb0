"""A spare's part in a hand-over: before it idles, it waits until the plan's peers that need a
state from it (it is the first holder they ask) have fetched it.

A node stopping while it alone holds a stage stays in the next plan as a spare, a donor
(control/handover.py). Its control process stops it once the worker reports "spare" under that
plan, and the worker reports it only after this wait (worker/main.py): so the node leaves once
its states are where the plan needs them, not when its signal came. Any spare waits alike: a
spare that holds a stage's state no placed peer holds is where that state is fetched from
(state_transfer.py).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable

from p2ptrain.records import Plan, RunSpec
from p2ptrain.schedule.handover_time import fetch_wait_s
from p2ptrain.worker.resume.start_choice import StartPoint, placement

log = logging.getLogger(__name__)

STOP_CHECK_S = 0.5  # how often the wait looks whether the worker is stopped or re-planned
MAX_CLAIMS = 16  # states one peer said it holds, remembered (a taker needs one per stage)

Owed = set[tuple[str, str]]  # (peer, sha256 of the state file it needs from us)


class Served:
    """The states this worker's server sent in full, as (peer, sha256) pairs, and those a peer
    said it holds already (`claim`: the last MAX_CLAIMS of each peer, a word that costs it
    nothing): written on the transport's event loop, waited on from the worker's thread."""

    def __init__(self) -> None:
        self._sent: Owed = set()
        self._claimed: dict[str, collections.deque[str]] = {}
        self._changed = threading.Condition()

    def add(self, peer: str, digest: str) -> None:
        with self._changed:
            self._sent.add((peer, digest))
            self._changed.notify_all()

    def claim(self, peer: str, digest: str) -> None:
        with self._changed:
            self._claimed.setdefault(peer, collections.deque(maxlen=MAX_CLAIMS)).append(digest)
            self._changed.notify_all()

    def _done(self, owed: Owed) -> bool:
        return all(pair in self._sent or pair[1] in self._claimed.get(pair[0], ()) for pair in owed)

    def wait_for(self, owed: Owed, timeout_s: float, should_stop: Callable[[], bool]) -> bool:
        """Until every pair of `owed` was sent (True), `timeout_s` passed or `should_stop()`."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while not self._done(owed):
                left = deadline - time.monotonic()
                if left <= 0 or should_stop():
                    return False
                self._changed.wait(min(left, STOP_CHECK_S))
        return True


def owed(start: StartPoint, plan: Plan, me: str, n_layer: int) -> Owed:
    """The (peer, digest) pairs a peer fetches from `me`: each state the start agreed on, for
    each peer placed where it is needed (at its stage, or at a stage the plan cuts anew and
    builds from it: worker/resume/covers.py) that lacks it and asks its holders in their
    order (worker/resume/restore.py: `fetch`) with `me` first. So of two donors that hold one
    state, the first waits for the fetch and the other need not."""
    _, placed = placement(plan, n_layer)
    needers = {key: set(peers) for key, peers in placed.items()}
    for stage, sources in start.sources.items():
        for source in sources:
            needers.setdefault(source, set()).update(placed.get(stage, ()))
    pairs: Owed = set()
    for key, digest in start.digests.items():
        holders = start.holders(key, start.state_step(key))
        for peer in needers.get(key, set()) - set(holders):
            if holders and holders[0] == me:
                pairs.add((peer, digest))
    return pairs


def wait_until_fetched(
    start: StartPoint,
    plan: Plan,
    me: str,
    spec: RunSpec,
    served: Served,
    should_stop: Callable[[], bool],
) -> None:
    """Wait until the states the plan's peers ask us for first reached them, at most 90 s and
    twice the plan's largest stage state's time over its slowest link
    (schedule/handover_time.py: as long as the control process's own limit allows); said in
    the log either way."""
    wait_s = fetch_wait_s(spec, plan)
    needed = owed(start, plan, me, spec.model.n_layer)
    if not needed:
        return
    peers = ", ".join(sorted({peer for peer, _ in needed}))
    log.info("waiting for %s to fetch the stage states they need from this peer", peers)
    if served.wait_for(needed, wait_s, should_stop):
        log.info("handed over: %s fetched the stage states they needed from this peer", peers)
    elif not should_stop():
        log.warning(
            "%s did not fetch the states they need from this peer within %.0f s",
            peers,
            wait_s,
        )
