"""Python's cyclic garbage collector around a training session: the session's setup is frozen
out of it.

A collection of the oldest generation walks every tracked object: after the worker's imports
(torch, hivemind) and a session's setup that took 0.14-0.23 s of CPU, and a young-generation
collection soon after the setup 0.035-0.04 s (gc.callbacks in every worker of bench
scaleout, 2026-11-29). On a volunteer with an eighth of a core that stalls whichever step the
collector's counters pick by 0.3-2.5 s. So what exists when a session is set up is frozen
(gc.freeze: never scanned again) before its first step, and unfrozen and collected when the
session closes, between plans, so a finished session's cycles do not outlive it.
"""

from __future__ import annotations

import gc


def freeze_setup() -> None:
    """Before a session's first step: the objects that exist now are no collection's work."""
    gc.freeze()


def thaw() -> None:
    """After a session closed: its objects are the collector's again, and its garbage goes."""
    gc.unfreeze()
    gc.collect()
