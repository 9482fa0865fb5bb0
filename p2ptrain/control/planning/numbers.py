"""The planner's numeric work as its control process asks for it and gets it back: plain records.

The live matrices (and their fitted embedding), the standing plan's price on them and the search
all run in the planning child (search_process.py), which
exits when idle: numpy (10 MiB resident, more with the matrices) never loads in the control
process, and a 32-peer swarm's planner fits the 100 MB a volunteer's node may hold. So these
records carry only plain Python; matrices travel back as opaque pickled bytes, which the control
process hands back (to search on what it assessed), never reads. Drift is judged on the measured
links in the control process itself (drift.py): the child is asked only when a decision is due. See numbers_work.py for the
child's side.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from p2ptrain.control.links import Link
from p2ptrain.control.planning.placement import Placement
from p2ptrain.records import NetworkFacts, RunSpec, StageCompute
from p2ptrain.records.estimate import AccessCapacity, NetCoordinate


@dataclass(frozen=True)
class PlanInputs:
    """What the planner's matrices are made of, as its view holds it."""

    members: tuple[str, ...]
    links: Mapping[tuple[str, str], Link]
    coords: Mapping[str, NetCoordinate]  # our estimate of each member's network coordinate
    capacities: Mapping[str, AccessCapacity]
    private: frozenset[str]  # members no one can reach: never paired
    relayed: frozenset[tuple[str, str]]
    measured: Mapping[str, StageCompute | None]  # each member's timed stage, if any
    slowdown: Mapping[str, float]  # compute.ComputeTrust's factors
    run: RunSpec


@dataclass(frozen=True)
class Assessment:
    """What the standing plan costs on the live matrices (its confirmation: confirm.py)."""

    matrices: bytes  # pickled planner.Matrices, for a search that follows: opaque here
    plan_cost_s: float | None  # the standing plan priced on them (None: none, or it does not fit)


@dataclass(frozen=True)
class Searched:
    """A search's result on the live matrices, and what the plan made of it needs."""

    placement: Placement | None
    refused: str  # why no placement fits the peers' devices ("" if one does)
    network: NetworkFacts | None  # the placement's links, for the data plane's timeouts
    plan_cost_s: float | None  # the standing plan on the same matrices
    summary: str  # the matrices in a few words, for the plan's log line


class SearchFailed(RuntimeError):
    """The child's work raised (a scheduler bug): its type, text and traceback, as text (its
    arguments may hold numpy objects). Defined here, not in the child's __main__, so that it
    unpickles in the control process."""
