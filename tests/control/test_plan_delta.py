"""Issue 29: a re-plan pulled as its changes against the plan the asker holds
(control/plan_delta.py): the asker rebuilds the planner's exact signed bytes, and a delta
that is wrong cannot forge a plan, only fail to rebuild one."""

from __future__ import annotations

import json
import os
import random
from typing import Any

import pytest

from p2ptrain import identity
from p2ptrain.control import plan_delta, wire
from tests.records.test_fuzz import _mutate, assert_no_slip

SEED = os.urandom(32)
PLANNER = identity.peer_id_of(SEED)
PEERS = [identity.peer_id_of(os.urandom(32)) for _ in range(300)]


def body(epoch: int, pipelines: list[list[str]], spares: list[str]) -> dict[str, Any]:
    placed = [p for pipe in pipelines for p in pipe] + spares
    return {
        "term": 1,
        "epoch": epoch,
        "planner": PLANNER,
        "stages": 2,
        "pipelines": pipelines,
        "spares": spares,
        "data_addrs": {p: [f"/ip4/198.51.100.{PEERS.index(p) % 250}/tcp/4002"] for p in placed},
        "cost_s": 1.0 + epoch,
    }


def signed(b: dict[str, Any], seq: int = 1) -> bytes:
    return wire.sign(SEED, "plan", seq, b, run_id="r")


def test_a_repair_rebuilds_the_exact_signed_bytes_from_a_small_delta() -> None:
    pairs = [PEERS[i : i + 2] for i in range(0, 280, 2)]
    old = body(1, pairs, PEERS[280:])
    repaired = [list(p) for p in pairs]
    repaired[3][1] = PEERS[280]  # a dead peer replaced by a spare: its address dropped
    new_body = body(2, repaired, PEERS[281:])
    new = signed(new_body, seq=2)
    change = plan_delta.delta(old, new)
    assert plan_delta.rebuild(old, change) == new
    assert wire.decode(plan_delta.rebuild(old, change)).body.epoch == 2
    assert len(json.dumps(change)) < len(new) / 2
    assert change["addrs_dropped"] == [PEERS[7]] and "data_addrs" not in change["changed"]


def test_a_wrong_delta_cannot_forge_a_plan() -> None:
    old = body(1, [PEERS[0:2]], [])
    new = signed(body(2, [PEERS[2:4]], []))
    change = plan_delta.delta(old, new)
    forged = dict(change, changed={**change["changed"], "pipelines": [PEERS[4:6]]})
    with pytest.raises(wire.WireError, match="signature"):
        wire.decode(plan_delta.rebuild(old, forged))
    other_base = body(1, [PEERS[6:8]], [])  # not the base the delta was made against
    with pytest.raises(wire.WireError):
        wire.decode(plan_delta.rebuild(other_base, change))
    for bad in ({}, {"envelope": 1}, dict(change, dropped=5), dict(change, changed=[1])):
        with pytest.raises(wire.WireError, match="malformed plan delta"):
            plan_delta.rebuild(old, bad)


@pytest.mark.parametrize("seed", [1, 2])
def test_a_mutated_delta_rebuilds_bytes_or_is_the_wire_error(seed: int) -> None:
    """The delta comes off the wire: rebuilding from any mutation of it, and decoding what it
    rebuilds, gives a plan or the one wire error, never another exception."""
    rng = random.Random(seed)
    old = body(1, [PEERS[0:2]], [PEERS[2]])
    change = plan_delta.delta(old, signed(body(2, [PEERS[2:4]], [PEERS[0]])))
    for _ in range(1500):
        try:
            wire.decode(plan_delta.rebuild(old, _mutate(rng, change)))
        except wire.WireError as exc:
            assert_no_slip(exc)


def test_a_delta_dropping_more_than_its_base_holds_is_refused() -> None:
    """A 4 MiB delta could list ~1.4M short ids to drop: refused past the base's own size (an
    honest one drops at most all of it), even where it would rebuild the signed bytes."""
    pairs = [PEERS[i : i + 2] for i in range(0, 100, 2)]
    old = body(1, pairs, [])
    new = signed(body(2, pairs[1:], []), seq=2)
    change = plan_delta.delta(old, new)
    assert plan_delta.rebuild(old, change) == new
    padding = [identity.peer_id_of(os.urandom(32)) for _ in range(100)]
    for name, padded in (
        ("addrs_dropped", change["addrs_dropped"] + padding),
        ("dropped", change["dropped"] + padding[: len(old) + 1]),
    ):
        with pytest.raises(wire.WireError, match=f"malformed plan delta: {name} lists"):
            plan_delta.rebuild(old, dict(change, **{name: padded}))


class CountedId(str):
    """A peer id that counts the comparisons made with it."""

    comparisons = 0

    def __eq__(self, other: object) -> bool:
        CountedId.comparisons += 1
        return str.__eq__(self, other)

    __hash__ = str.__hash__


def test_rebuilding_matches_each_peer_against_the_dropped_ones_as_a_set() -> None:
    """Each of the base's peers was looked for in the dropped list: N^2 comparisons, ~10^9 on
    the event loop for a 1,000-peer base and a delta of the longest lists allowed."""
    old = body(1, [PEERS[i : i + 2] for i in range(0, 300, 2)], [])
    new = signed(body(2, [PEERS[0:2]], []), seq=2)
    change = plan_delta.delta(old, new)
    dropped = [CountedId(p) for p in change["addrs_dropped"]]
    assert len(dropped) == 298
    CountedId.comparisons = 0
    assert plan_delta.rebuild(old, dict(change, addrs_dropped=dropped)) == new
    assert CountedId.comparisons < 2 * len(dropped)  # the list's: ~len(dropped)^2 / 2
