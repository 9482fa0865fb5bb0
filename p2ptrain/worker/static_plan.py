"""A worker without a control plane (`python -m p2ptrain.worker --plan PLAN.json --name NAME`):
the plan file names its workers, and each says hello with a file beside it (NAME.hello.json:
its peer id and data addresses). Once every named worker has, the plan with their ids and
addresses is the one to train on."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from p2ptrain.records import Hello, Plan, PlanMessage, RunSpec
from p2ptrain.worker.ipc import PlanInbox

HELLO_POLL_S = 0.1


def rendezvous(
    plan_path: Path, name: str, hello: Hello, inbox: PlanInbox, fail: Callable[[str], None]
) -> None:
    """Say hello beside the plan (written whole, then renamed), and put the plan in `inbox`
    once every worker it names has said hello (a thread of its own); a plan that cannot be
    read or used is `fail`ed with why (the worker stops, exit code 1)."""
    tmp = plan_path.with_name(f".{name}.hello.tmp")
    tmp.write_text(json.dumps(hello.to_dict()))
    tmp.replace(plan_path.with_name(f"{name}.hello.json"))
    args = (plan_path, name, inbox, fail)
    threading.Thread(target=_wait_for_plan, args=args, daemon=True).start()


def _wait_for_plan(
    plan_path: Path, name: str, inbox: PlanInbox, fail: Callable[[str], None]
) -> None:
    try:
        static = json.loads(plan_path.read_text())
        names = Plan.from_dict(plan_fields(static["plan"], {})).peers()
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
        why = f"missing {exc}" if isinstance(exc, KeyError) else str(exc)
        fail(f"cannot read plan {plan_path}: {why}")
        return
    if name not in names:
        fail(f"plan {plan_path} names no worker {name!r} (it names {', '.join(sorted(names))})")
        return
    hello_paths = {worker: plan_path.with_name(f"{worker}.hello.json") for worker in names}
    while not all(path.exists() for path in hello_paths.values()):
        if inbox.stopped:
            return
        time.sleep(HELLO_POLL_S)
    try:
        hellos = {n: Hello.from_dict(json.loads(p.read_text())) for n, p in hello_paths.items()}
        plan = Plan.from_dict(plan_fields(static["plan"], hellos))
        inbox.put_plan(PlanMessage(plan, RunSpec.from_dict(static["run"])))
    except (OSError, ValueError, KeyError, RecursionError) as exc:
        fail(f"cannot use plan {plan_path}: {exc}")


def plan_fields(plan: dict[str, Any], hellos: dict[str, Hello]) -> dict[str, Any]:
    """A static plan file's plan (pipelines of worker names, optionally epoch, spares and
    stage_layers), with each name replaced by the peer id it said hello with (if known) and the
    data addresses."""
    peer_of = {name: hello.peer_id for name, hello in hellos.items()}
    pipelines = [[peer_of.get(n, n) for n in pipeline] for pipeline in plan["pipelines"]]
    return {
        "term": 0,
        "epoch": plan.get("epoch", 0),
        "planner": "static",
        "stages": plan.get("stages", len(pipelines[0]) if pipelines else 0),
        "pipelines": pipelines,
        "spares": [peer_of.get(n, n) for n in plan.get("spares", [])],
        "data_addrs": {h.peer_id: list(h.data_addrs) for h in hellos.values()},
        "cost_s": 0.0,
        "stage_layers": plan.get("stage_layers", []),
    }
