"""`p2ptrain local`: train on a swarm of N peers on this machine, the project's main job.

Starts a bootstrap and N `p2ptrain join` nodes on 127.0.0.1 as real process trees (each:
supervisor, control process, worker with its hivemind DHT, averager and p2pd), lets the control
plane discover, measure, elect a planner and plan, trains with a progress line per step and stops
everything. `--direct` skips the control plane: N bare workers placed once by the scheduler over a
loopback topology (for debugging the data plane). `--emulate TOPOLOGY` runs the peers inside the
WAN testbed (p2ptrain/testbed). With --json the last stdout line is
{"steps", "first_step" (> 0: the swarm resumed the run), "loss": [per step from first_step],
"tokens_per_s", "plan": {"pipelines": [[peer id, ...], ...], ...}}.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

from p2ptrain import procs
from p2ptrain.errors import UserError
from p2ptrain.harness.local_progress import Progress, done_line
from p2ptrain.records import RunSpec
from p2ptrain.worker.faults import Faults
from p2ptrain.worker.settings import DEFAULT_DEVICE, device_arg

TEMP_PREFIX = "p2ptrain-local-"  # then UID-PID
DEFAULT_BANDWIDTH_SCALE = 0.02  # --emulate: the topology's links, scaled to what this box can carry


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--peers", type=int, default=4, help="number of peers (default 4)")
    parser.add_argument("--run", metavar="RUN.toml", help="run spec (default: the built-in run)")
    parser.add_argument("--steps", type=int, help="training steps (overrides the run spec)")
    parser.add_argument("--seed", type=int, help="seed (overrides the run spec)")
    parser.add_argument(
        "--no-compression", action="store_true", help="exact fp32 activations and averaging"
    )
    parser.add_argument(
        "--device",
        type=device_arg,
        default=DEFAULT_DEVICE,
        help="where every peer trains: auto (the first CUDA GPU, else MPS, else the CPU), cpu, "
        "mps, cuda or cuda:I; the peers share it (default %(default)s)",
    )
    parser.add_argument("--json", action="store_true", help="print a JSON summary as the last line")
    parser.add_argument("--workdir", help="keep logs and checkpoints here (default: a temp dir)")
    parser.add_argument(
        "--control-plane",
        action="store_true",
        help="run a bootstrap and N `p2ptrain join` nodes that discover, measure and elect a "
        "planner (the default; the flag is kept for old scripts)",
    )
    parser.add_argument(
        "--direct",
        action="store_true",
        help="skip the control plane: start N bare workers and place them once with the "
        "scheduler (no discovery, no re-planning; for debugging the data plane)",
    )
    parser.add_argument(
        "--emulate",
        metavar="TOPOLOGY",
        help="run the peers inside the WAN testbed (root), one per peer of this topology file, "
        "and plan on its emulated links (the peer count is the topology's)",
    )
    parser.add_argument(
        "--http",
        metavar="[HOST:]PORT",
        help="serve the live dashboard from the bootstrap on [HOST:]PORT (default host "
        "127.0.0.1): open http://127.0.0.1:PORT/ to watch the swarm",
    )
    parser.add_argument(
        "--bandwidth-scale",
        type=float,
        default=None,
        help=f"with --emulate: multiply the topology's bandwidths by this "
        f"(default {DEFAULT_BANDWIDTH_SCALE})",
    )


def run(args: argparse.Namespace, faults: Faults | None = None) -> int:
    """Train; `faults` go to every node's worker (tests: harness/with_faults.py)."""
    from p2ptrain.harness.direct_swarm import LocalSwarm, plan_for
    from p2ptrain.node.supervisor import check_device_here
    from p2ptrain.records.run import load_run_spec

    if not 1 <= args.peers <= 64:
        raise UserError(f"--peers must be between 1 and 64, got {args.peers}")
    # before anything is made (the work directory)
    if args.direct and args.control_plane:
        raise UserError("--direct and --control-plane exclude each other")
    if args.http is not None and (args.direct or args.emulate):
        raise UserError("--http serves the bootstrap's dashboard: not with --direct or --emulate")
    if args.bandwidth_scale is not None and not args.emulate:
        raise UserError("--bandwidth-scale scales an emulated topology's links: give --emulate")
    spec = load_run_spec(args.run)
    check_device_here(args.device)
    changes: dict[str, Any] = {}
    if args.steps is not None:
        changes["steps"] = args.steps
    if args.seed is not None:
        changes["seed"] = args.seed
    if args.no_compression:
        changes["compression"] = "none"
    workdir = Path(args.workdir) if args.workdir else temp_workdir()
    workdir.mkdir(parents=True, exist_ok=True)
    # a fresh run must not resume whatever an earlier run left; and unless the run names a
    # shared directory, each node keeps its own, as on separate machines (stage states then move
    # between nodes over the network: worker/resume/state_transfer.py)
    own_checkpoints = not spec.checkpoint.checkpoint_dir
    if own_checkpoints:
        changes["checkpoint_dir"] = str(workdir / "checkpoints")
    spec = spec.replace(**changes)
    out: TextIO = sys.stderr if args.json else sys.stdout
    for signum in (signal.SIGTERM, signal.SIGINT):  # SIGINT too: a script may have ignored it
        signal.signal(signum, _interrupt)
    started_s = time.monotonic()
    try:
        if args.emulate:
            result = _train_emulated(
                spec,
                Path(args.emulate),
                DEFAULT_BANDWIDTH_SCALE if args.bandwidth_scale is None else args.bandwidth_scale,
                workdir,
                out,
                args.direct,
                own_checkpoints,
                args.device,
            )
        elif not args.direct:
            from p2ptrain.web.server import parse_http_address

            print(f"starting a bootstrap and {args.peers} nodes (logs in {workdir}) ...", file=out)
            print(shared_cores_note(args.peers), file=out, flush=True)
            if args.http is not None:
                host, port = parse_http_address(args.http)
                print(f"dashboard: http://{host}:{port}/", file=out, flush=True)
            result = _train_with_control_plane(
                one_host_spec(spec),
                args.peers,
                workdir,
                out,
                own_checkpoints,
                faults=faults,
                http=args.http,
                device=args.device,
            )
        else:
            with LocalSwarm(spec, args.peers, workdir, device=args.device) as swarm:
                print(f"starting {args.peers} peers (logs in {workdir}) ...", file=out, flush=True)
                progress = Progress(spec.optim.steps, out)
                plan = plan_for(spec, swarm.wait_hellos())
                progress.on_plan(plan)
                swarm.send_plan(plan)
                result = swarm.train(progress.on_step)
                progress.finish()
    except (RuntimeError, TimeoutError) as exc:
        raise UserError(f"the local swarm failed: {exc}") from exc
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    print(done_line(result, time.monotonic() - started_s), file=out, flush=True)
    if args.json:
        summary = {
            "steps": result.steps,
            "first_step": result.first_step,
            "loss": result.loss,
            "tokens_per_s": result.tokens_per_s,
            "plan": {k: v for k, v in result.plan.to_dict().items() if k != "data_addrs"},
            "averaging": result.averaging,
            "outer_rounds": result.outer_rounds,
        }
        print(json.dumps(summary), flush=True)
    return 0


def _train_emulated(
    spec: Any,
    topology_path: Path,
    bandwidth_scale: float,
    workdir: Path,
    out: TextIO,
    direct: bool,
    own_checkpoints: bool,
    device: str,
) -> Any:
    """The local swarm inside the WAN testbed: node i in peer i's namespace; the control plane
    measures the emulated links and plans on them (with `direct`: bare workers, planned once on
    the configured links)."""
    from p2ptrain.harness.testbed_swarm import EmulatedSwarm, plan_on_testbed
    from p2ptrain.schedule import load_topology
    from p2ptrain.testbed.netns import require_root
    from p2ptrain.testbed.testbed import Testbed

    require_root()
    if not bandwidth_scale > 0:
        raise UserError(f"--bandwidth-scale must be > 0, got {bandwidth_scale}")
    topology = load_topology(topology_path)
    if not direct:
        from p2ptrain.harness.testbed_sites import TestbedSites
        from p2ptrain.testbed.nat import nat_from_topology_file

        # peers behind the file's emulated NATs join as volunteers behind home routers do
        nat = nat_from_topology_file(topology_path, topology.peers)
        with Testbed.from_topology(topology, bandwidth_scale=bandwidth_scale, nat=nat) as bed:
            print(
                f"starting a bootstrap and {topology.num_peers} nodes in the emulated WAN "
                f"(logs in {workdir}) ...",
                file=out,
                flush=True,
            )
            return _train_with_control_plane(
                spec,
                topology.num_peers,
                workdir,
                out,
                own_checkpoints,
                sites=TestbedSites(bed),
                device=device,
            )
    with (
        Testbed.from_topology(topology, bandwidth_scale=bandwidth_scale) as bed,
        EmulatedSwarm(spec, bed, workdir, device) as swarm,
    ):
        print(
            f"starting {topology.num_peers} emulated peers (logs in {workdir}) ...",
            file=out,
            flush=True,
        )
        progress = Progress(spec.optim.steps, out)
        plan, _ = plan_on_testbed(bed, spec, swarm.wait_hellos())
        progress.on_plan(plan)
        swarm.send_plan(plan)
        result = swarm.train(progress.on_step)
        progress.finish()
        return result


def _train_with_control_plane(
    spec: Any, num_peers: int, workdir: Path, out: TextIO, own_checkpoints: bool, **options: Any
) -> Any:
    """A bootstrap and `num_peers` join nodes train (harness/local_run.py), a line per step."""
    from p2ptrain.harness.local_run import train_with_control_plane

    progress = Progress(spec.optim.steps, out)
    result = train_with_control_plane(
        spec,
        num_peers,
        workdir,
        progress.on_plan,
        progress.on_step,
        own_checkpoints=own_checkpoints,
        on_report=progress.on_report,
        **options,
    )
    progress.finish()
    return result


def temp_workdir() -> Path:
    """A fresh work directory in the temp directory, named with our uid and PID; those a killed
    `local` left (checkpoints and all: its `finally` never ran) are removed first."""
    parent, prefix = Path(tempfile.gettempdir()), f"{TEMP_PREFIX}{os.getuid()}-"
    procs.sweep_pid_dirs(parent, prefix)
    return procs.make_pid_dir(parent, prefix)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # unwinds through LocalSwarm, which kills every process group


def one_host_spec(spec: RunSpec) -> RunSpec:
    """The run as peers that share one machine plan it: on their links, at the run's `stages`.
    Each worker's stage time describes a machine of its own, which these peers are not; priced
    anyway, diloco's planner would trade the pipeline for replicas (1 x 4: no stage boundary)."""
    return spec.replace(compute_aware=False)


def shared_cores_note(num_peers: int) -> str:
    """What a plan made on one machine means: the peers share this machine's cores, so the
    planner does not price their compute (one_host_spec)."""
    cores = os.cpu_count() or 1
    return (
        f"note: the {num_peers} peers share this machine's {cores} core(s): the plan shows how "
        "a swarm splits the model into pipeline stages and data-parallel replicas, not the "
        "speed-up separate machines would give (the planner prices the links only, at the "
        "run's stages)"
    )
