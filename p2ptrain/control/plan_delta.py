"""A plan pulled as its changes against a plan the asker holds (control/plan_pull.py).

A re-plan (a failover's repair, a drift or churn re-plan) keeps most of the placement: the
data addresses, most of the pipelines. The delta is the new envelope without its body, the
body's top-level fields that changed, and `data_addrs` as entries set and dropped. The asker
rebuilds the envelope's exact bytes (canonical JSON: control/wire.py) from the body it holds,
and wire.decode checks the planner's signature over them as over any envelope: a wrong delta
or base cannot forge a plan, only fail to rebuild one (then the whole plan is asked for).
A delta's lists are refused past the base's own sizes (no honest delta drops more than the base
holds) and matched as sets: a 4 MiB delta of short ids against a 1,000-peer base was ~10^9 list
comparisons on the event loop. Pure: no I/O.
"""

from __future__ import annotations

import json
from typing import Any

from p2ptrain.errors import WireError

ADDRS = "data_addrs"


def delta(base_body: dict[str, Any], envelope: bytes) -> dict[str, Any]:
    """`envelope` (a signed plan) as its changes against `base_body`."""
    signed = json.loads(envelope)
    body = signed.pop("body")
    changed = {k: v for k, v in body.items() if k != ADDRS and base_body.get(k) != v}
    old, new = base_body.get(ADDRS, {}), body.get(ADDRS, {})
    return {
        "envelope": signed,
        "changed": changed,
        "dropped": sorted(k for k in base_body if k not in body),
        "addrs_set": {p: a for p, a in new.items() if old.get(p) != a},
        "addrs_dropped": sorted(p for p in old if p not in new),
    }


def rebuild(base_body: dict[str, Any], change: dict[str, Any]) -> bytes:
    """The envelope's bytes from `base_body` and its `change` (a delta's); WireError if the
    delta is not one (the signature is checked later, by wire.decode)."""
    try:
        base_addrs = base_body.get(ADDRS, {})
        dropped = _dropped(change["dropped"], base_body, "dropped")
        addrs_dropped = _dropped(change["addrs_dropped"], base_addrs, "addrs_dropped")
        body = {k: v for k, v in base_body.items() if k not in dropped}
        body.update(change["changed"])
        addrs = {p: a for p, a in body.get(ADDRS, {}).items() if p not in addrs_dropped}
        addrs.update(change["addrs_set"])
        if addrs or ADDRS in base_body or ADDRS in change["changed"]:
            body[ADDRS] = addrs
        signed = dict(change["envelope"], body=body)
        return json.dumps(signed, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise WireError(f"malformed plan delta: {exc}") from None


def _dropped(listed: Any, held: dict[str, Any], name: str) -> frozenset[Any]:
    """A delta's list of what it drops of `held`, as a set; no longer than `held` (the delta
    of a plan against this base drops at most all of it)."""
    if not isinstance(listed, list):
        raise TypeError(f"{name} is not a list")
    if len(listed) > len(held):
        raise ValueError(f"{name} lists {len(listed)} entries, the base holds {len(held)}")
    return frozenset(listed)
