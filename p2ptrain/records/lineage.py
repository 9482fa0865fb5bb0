"""A plan's lineage: which plans' stage states a plan may resume from.

A lineage is a tuple of (lineage id, epoch) pairs, newest first: the plan's own lineage id with
the plan's epoch, then each ancestor lineage with the last epoch of it that this plan descends
from (at most MAX_LINEAGE entries). A planner continuing its own term keeps the id; a plan under
a new term (a new planner, or a re-election) starts a new id, derived from the previous id, the
term and the planner, and keeps the previous entries behind it.

So after a partition, a half that elected a new planner has a new id, and a half that kept the
old planner keeps the old id but goes on at epochs past the one the other half recorded as its
fork point: neither half's lineage accepts the other's states, and both accept the common
ancestor's.

A stage state saved under a plan is tagged `<id>-e<epoch>` (train/checkpoint.py). It is usable
for a plan whose lineage has an entry of that id at that epoch or later. Untagged states (saved
before lineages existed, or under a plan without a lineage: a harness's static plan) belong to
the run's root, an ancestor of every lineage: usable by every plan.

A run outlives its swarm: when every peer stops and a new swarm starts, its first plan is a new
root (no ancestor), and none of the earlier swarm's states is of its lineage. Such a lineage
(`may_adopt`: one entry, or none) that has no state of its own yet adopts the newest state of
the run its members hold, of whatever lineage (worker/resume/adopt.py), and saves it under its own tag:
from then on it descends from that state. A lineage with ancestors never adopts, nor does one
that saved a state: after a partition heals, a live plan's descendants never take the other
half's states.
"""

from __future__ import annotations

import hashlib
import re
import secrets

from p2ptrain.records import fields as f

MAX_LINEAGE = 32
ID_CHARS = 16
_ID = re.compile(r"^[0-9a-f]{16}$")
_TAG = re.compile(r"^([0-9a-f]{16})-e([0-9]{1,16})$")

Lineage = tuple[tuple[str, int], ...]


def lineage_id(parent_id: str, term: int, planner: str) -> str:
    """The id of the lineage a planner starts in `term` after `parent_id` ("" for none)."""
    return hashlib.sha256(f"{parent_id}|{term}|{planner}".encode()).hexdigest()[:ID_CHARS]


def next_lineage(
    previous: Lineage, continues: bool, term: int, epoch: int, planner: str
) -> Lineage:
    """The lineage of a plan `term`/`epoch` by `planner` that replaces a plan of lineage
    `previous`; `continues`: the previous plan is the same planner's, in the same term."""
    if continues and previous:
        return ((previous[0][0], epoch), *previous[1:])
    # a root's id is random: a restarted swarm whose planner and term repeat the earlier
    # swarm's is still a new lineage (it neither prunes nor mistakes that swarm's states)
    parent = previous[0][0] if previous else secrets.token_hex(8)
    return ((lineage_id(parent, term, planner), epoch), *previous)[:MAX_LINEAGE]


def tag_of(lineage: Lineage) -> str | None:
    """The tag of states saved under a plan of this lineage (None: the root, untagged)."""
    return f"{lineage[0][0]}-e{lineage[0][1]}" if lineage else None


def parse_tag(tag: str) -> tuple[str, int] | None:
    match = _TAG.fullmatch(tag)  # `$` alone lets a trailing newline through
    return None if match is None else (match[1], int(match[2]))


def id_of_tag(tag: str | None) -> str | None:
    """The lineage id of a state's tag (None: the root, or not a tag)."""
    parsed = None if tag is None else parse_tag(tag)
    return None if parsed is None else parsed[0]


def may_adopt(lineage: Lineage) -> bool:
    """Is this a swarm's first lineage (no ancestor recorded), which may adopt another
    lineage's state while it has none of its own (the module's docstring)?"""
    return len(lineage) <= 1


def rank(lineage: Lineage, tag: str | None) -> int | None:
    """How close a state of `tag` is to a plan of `lineage` (0: saved under its own lineage,
    len(lineage): the root), or None if the plan must not use it (another lineage's state)."""
    if tag is None:
        return len(lineage)
    parsed = parse_tag(tag)
    if parsed is None:
        return None
    for index, (entry_id, last_epoch) in enumerate(lineage):
        if entry_id == parsed[0]:
            return index if parsed[1] <= last_epoch else None
    return None


def to_wire(lineage: Lineage) -> list[list[str | int]]:
    return [[entry_id, epoch] for entry_id, epoch in lineage]


def parse(value: object, record: str, name: str = "lineage") -> Lineage:
    """A lineage off the wire: a list of at most MAX_LINEAGE [id, epoch] pairs, ids distinct."""
    if not isinstance(value, list) or len(value) > MAX_LINEAGE:
        raise f.malformed(record, f"lineage must be a list of at most {MAX_LINEAGE} entries")
    entries = []
    for entry in value:
        if not isinstance(entry, list) or len(entry) != 2:
            raise f.malformed(record, "a lineage entry must be [id, epoch]")
        if not isinstance(entry[0], str) or not _ID.fullmatch(entry[0]):
            raise f.malformed(record, f"a lineage id must be {ID_CHARS} lowercase hex digits")
        entries.append((entry[0], f.integer(entry[1], record, "a lineage epoch")))
    if len({entry_id for entry_id, _ in entries}) != len(entries):
        raise f.malformed(record, "a lineage id appears more than once")
    return tuple(entries)
