"""The hivemind data-parallel baseline: every peer holds the whole model, hivemind.Optimizer
averages the gradients. What a hivemind user runs today; `bench e2e` compares p2ptrain with it.

    python -m p2ptrain.harness.dp_trainer --run RUN.json --index I --num-peers N --rendezvous DIR
        [--listen-host IP] [--verbose]

Same model (build_model: one stage of one), same data and global batch as p2ptrain (peer i of N
trains on replica_rows(batch_size, N, i) of each step's batch), same AdamW and learning-rate
schedule. One global step = one hivemind epoch of target_batch_size = the global batch: each peer
reports its rows, waits until the swarm has the whole batch, then steps (so, like p2ptrain, every
step uses exactly the global batch; hivemind alone would let fast peers add extra batches).

Rendezvous through files in DIR (DataParallelSwarm, p2ptrain/harness/dp_swarm.py, is stdlib-only):
peer 0 writes `addrs-0.json`, the others join its DHT; every peer writes `ready-I` once its
optimizer exists and starts step 0 when the harness creates `go`. Each finished step appends one
JSON line {"step", "loss", "samples", "time_s"} (time_s: wall clock) to `metrics-I.jsonl`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

from p2ptrain.records import NetworkFacts, RunSpec
from p2ptrain.train.data import get_batch, load_corpus, replica_rows
from p2ptrain.train.model import build_model, loss_fn
from p2ptrain.train.optim import lr_at
from p2ptrain.worker import watchdog
from p2ptrain.worker.averaging.round_timeouts import averaging_timeouts
from p2ptrain.worker.private_tmp import PrivateTmp

RENDEZVOUS_TIMEOUT_S = 300.0
# bounded recovery: a peer the swarm left behind tries to download the state this many times
# (each bounded by LOAD_STATE_TIMEOUT_S, hivemind's default is 600 s) before it jumps ahead
MAX_RESYNC_ATTEMPTS = 3
LOAD_STATE_TIMEOUT_S = 30.0
POLL_S = 0.02
FULL_BATCH_PATIENCE_S = 30.0  # waited for the swarm's whole batch before the tracker's estimate
SHUTDOWN_GRACE_S = 5.0
log = logging.getLogger("p2ptrain.dp_trainer")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m p2ptrain.harness.dp_trainer", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--run", required=True, help="run spec as JSON (RunSpec.to_dict)")
    parser.add_argument("--index", type=int, required=True, help="this peer, 0..N-1")
    parser.add_argument("--num-peers", type=int, required=True)
    parser.add_argument("--rendezvous", required=True, help="directory shared with the harness")
    parser.add_argument(
        "--listen-host",
        default="127.0.0.1",
        metavar="IP",
        help="IPv4 address p2pd listens on (default %(default)s)",
    )
    parser.add_argument("--max-rtt-s", type=float, help="the slowest round trip (WAN testbed)")
    parser.add_argument("--min-rate-mbps", type=float, help="the slowest link (WAN testbed)")
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument("--verbose", action="store_true", help="hivemind.Optimizer's own logs")
    args = parser.parse_args(argv)
    watchdog.install()  # hivemind's children and p2pd die with us (worker/watchdog.py)
    PrivateTmp().use()  # and hivemind's sockets go with us: a killed peer left them in /tmp
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s dp %(process)d: %(message)s",
    )
    torch.set_num_threads(1)
    spec = RunSpec.from_dict(json.loads(Path(args.run).read_text()))
    code = 0
    try:
        network = None
        if args.max_rtt_s is not None:
            network = NetworkFacts(args.max_rtt_s, args.min_rate_mbps or 5.0)
        train(
            spec,
            args.index,
            args.num_peers,
            Path(args.rendezvous),
            args.listen_host,
            args.verbose,
            network,
        )
    except Exception:
        log.exception("data-parallel trainer failed")
        code = 1
    logging.shutdown()
    os._exit(code)  # hivemind's non-daemon threads must not keep us alive


def train(
    spec: RunSpec,
    index: int,
    num_peers: int,
    rendezvous: Path,
    listen_host: str,
    verbose: bool,
    network: NetworkFacts | None = None,
) -> None:
    """Join the swarm, train spec.optim.steps global steps, write one metrics line per step."""
    import hivemind
    from hivemind.compression import Float16Compression, NoCompression
    from hivemind.optim.grad_averager import GradientAverager

    dht = hivemind.DHT(
        start=True,
        host_maddrs=[f"/ip4/{listen_host}/tcp/0"],
        initial_peers=[] if index == 0 else _wait_json(rendezvous / "addrs-0.json"),
        nat_port_map=False,
    )
    if index == 0:
        _write_json(rendezvous / "addrs-0.json", [str(a) for a in dht.get_visible_maddrs()])
    model = build_model(spec)
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": spec.optim.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    rows = replica_rows(spec.optim.batch_size, num_peers, index)
    # the network the testbed states, else a local swarm's timeouts
    timeouts = averaging_timeouts(sum(p.numel() for p in params) * 2, network)
    opt = hivemind.Optimizer(
        dht=dht,
        run_id=f"{spec.run_id}_hivemind_dp",
        target_batch_size=spec.optim.batch_size,
        batch_size_per_step=len(rows),
        params=groups,
        optimizer=partial(
            torch.optim.AdamW,
            lr=spec.optim.lr,
            betas=(spec.optim.beta1, spec.optim.beta2),
            foreach=False,
        ),
        scheduler=partial(
            torch.optim.lr_scheduler.LambdaLR, lr_lambda=lambda e: lr_at(e, spec) / spec.optim.lr
        ),
        matchmaking_time=timeouts.min_matchmaking_s,
        averaging_timeout=max(spec.wire.averaging_timeout_s, timeouts.allreduce_s),
        # tuned in the baseline's favour: a group of everyone forms as soon as all have joined
        # (hivemind's default waits the whole matchmaking_time), and no per-epoch parameter
        # averaging (all peers start from the same weights and apply the same averaged step)
        grad_averager_factory=partial(GradientAverager, target_group_size=num_peers),
        average_state_every=10**9,
        # hivemind would initialise Adam's state with one zero-gradient step, which shifts Adam's
        # bias correction by a step: the loss curve would differ from every other run's
        averager_opts={"initialize_optimizer": False},
        load_state_timeout=LOAD_STATE_TIMEOUT_S,
        grad_compression=(
            NoCompression() if spec.wire.compression == "none" else Float16Compression()
        ),
        verbose=verbose,
    )
    corpus = load_corpus(spec)
    (rendezvous / f"ready-{index}").touch()
    _wait_path(rendezvous / "go")
    metrics = rendezvous / f"metrics-{index}.jsonl"
    attempts = 0
    patience_s = max(FULL_BATCH_PATIENCE_S, timeouts.allreduce_s)  # for the whole batch
    try:
        while opt.local_epoch < spec.optim.steps:
            step = opt.local_epoch
            x, y = get_batch(corpus, spec, step, rows)
            loss = loss_fn(model(x), y)
            loss.backward()
            # say we have our rows, wait for the swarm's whole batch, then take the global step
            opt.tracker.report_local_progress(step, len(rows))
            _wait_until(partial(_swarm_ready, opt, step, time.monotonic(), patience_s))
            opt.step(batch_size=len(rows))
            opt.zero_grad()
            if opt.local_epoch == step:
                attempts += 1
                if attempts < MAX_RESYNC_ATTEMPTS:
                    log.warning("step %d: the swarm did not advance; computing it again", step)
                    continue
                _jump_ahead(opt, step, metrics)
                attempts = 0
                continue
            attempts = 0
            _write_step(metrics, step, loss.item(), len(rows))
        time.sleep(timeouts.linger_s)  # our last reduced parts may still be on their way
    finally:
        done = threading.Thread(target=lambda: (opt.shutdown(), dht.shutdown()), daemon=True)
        done.start()
        done.join(SHUTDOWN_GRACE_S)


def _jump_ahead(opt: Any, step: int, metrics: Path) -> None:
    """The bounded recovery: after a partial all-reduce the swarm moved on, and the state
    downloads that would catch us up keep failing (docs/benchmarks.md, run 3). Take the swarm's
    epoch with our own parameters and record the steps we missed with no rows, so the swarm's
    steps stay complete; the parameters may drift from the others' (a baseline's cost, logged)."""
    target = max(step + 1, opt.tracker.global_epoch)
    log.warning(
        "step %d: %d state downloads failed; jumping to the swarm's step %d with our own "
        "parameters",
        step,
        MAX_RESYNC_ATTEMPTS,
        target,
    )
    opt.state_averager.local_epoch = target
    opt.tracker.report_local_progress(target, 0)
    for missed in range(step, target):
        _write_step(metrics, missed, 0.0, 0)


def _write_step(metrics: Path, step: int, loss: float, samples: int) -> None:
    record = {"step": step, "loss": loss, "samples": samples, "time_s": time.time()}
    with metrics.open("a") as f:
        f.write(json.dumps(record) + "\n")


def _swarm_ready(opt: Any, step: int, since: float, patience_s: float) -> bool:
    """The swarm has the whole batch of this step (or has moved past it); after patience_s,
    whenever hivemind's tracker says so. The tracker alone also said so once its estimated end
    of the step passed: on a loaded machine, before the other peers' rows were counted, and a
    peer then stepped on part of the batch (a test of the baseline failed once so)."""
    tracker = opt.tracker
    if opt.local_epoch != step or tracker.global_epoch > step:
        return True
    if tracker.global_progress.samples_accumulated >= tracker.target_batch_size:
        return True
    # a peer that died must not stop the others for good: the tracker's estimate then decides
    return time.monotonic() - since > patience_s and bool(tracker.ready_to_update_epoch)


def _wait_until(condition: Callable[[], object]) -> None:
    # bounded anyway by the tracker: past its estimated end of epoch it says ready
    while not condition():
        time.sleep(POLL_S)


def _wait_path(path: Path) -> None:
    deadline = time.monotonic() + RENDEZVOUS_TIMEOUT_S
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear in {RENDEZVOUS_TIMEOUT_S:.0f} s")
        time.sleep(0.05)


def _wait_json(path: Path) -> Any:
    _wait_path(path)
    return json.loads(path.read_text())


def _write_json(path: Path, value: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(value))
    tmp.replace(path)


if __name__ == "__main__":
    main()
