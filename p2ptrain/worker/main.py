"""The worker process: the data plane of one node (torch + hivemind).

    python -m p2ptrain.worker --ipc SOCKET [--identity KEY]       # beside a control process
    python -m p2ptrain.worker --plan PLAN.json --name NAME        # static plan, for tests

Life of the process: watchdog -> hivemind DHT + p2pd (the node's data-plane address) -> hello ->
wait for a plan -> build this peer's stage -> train step by step (pipeline, then verified
gradient averaging, then the optimizer) -> checkpoint on interval, on a new plan and on exit.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from p2ptrain.errors import UserError
from p2ptrain.records.run import RunSpec
from p2ptrain.train.checkpoint import checkpoint_dir
from p2ptrain.worker import watchdog
from p2ptrain.worker.frames import Expected, FrameHeader, NotReady
from p2ptrain.worker.settings import WorkerSettings

log = logging.getLogger("p2ptrain.worker")

SHUTDOWN_GRACE_S = 3.0


def main(argv: list[str] | None = None) -> None:
    settings = WorkerSettings.from_argv(argv)
    watchdog.install()  # first, while the process has a single thread
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s worker %(process)d: %(message)s",
    )
    for noisy in ("hivemind", "hivemind.averaging", "hivemind.dht"):
        logging.getLogger(noisy).setLevel(
            logging.ERROR if settings.log_level.upper() != "DEBUG" else "DEBUG"
        )
    torch.set_num_threads(1)
    try:
        code = Worker(settings).run()
    except UserError as exc:
        log.error("%s", exc)
        code = 2
    logging.shutdown()
    os._exit(code)  # not sys.exit: hivemind's non-daemon threads must not keep us alive


class Worker:
    def __init__(self, settings: WorkerSettings) -> None:
        from p2ptrain.worker.ipc import IpcClient, PlanInbox

        self.settings = settings
        self.inbox = PlanInbox()
        self.ipc: IpcClient | None = IpcClient(settings.ipc, self.inbox) if settings.ipc else None
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.inbox.stop())

    def run(self) -> int:
        import hivemind

        from p2ptrain.worker.session import Session, SessionEnd
        from p2ptrain.worker.state_transfer import StateServer
        from p2ptrain.worker.transport import Transport

        identity_path = self._hivemind_identity()
        dht = hivemind.DHT(
            start=True,
            host_maddrs=[f"/ip4/{self.settings.listen_host}/tcp/0"],
            nat_port_map=False,
            identity_path=identity_path,
        )
        self.current: Session | None = None
        transport = Transport.start(dht.replicate_p2p, self._expect)
        state_server = StateServer(transport)
        try:
            data_addrs = [str(a) for a in dht.get_visible_maddrs()]
            log.info("data plane up: %s", data_addrs[0])
            self._hello(transport.peer_id, data_addrs)
            _warm_up_torch()
            version = 0
            while True:
                if not self.inbox.wait_newer(version):
                    return 0  # stopped before any (new) plan
                version = self.inbox.version
                message = self._resolved_plan(self.inbox.latest)
                problem = _not_actionable(message, transport.peer_id)
                if problem:
                    log.info("waiting for a better plan: %s", problem)
                    continue
                spec = RunSpec.from_dict(message["run"])
                if self.settings.checkpoint_dir:  # a node-local setting beats the run's default
                    spec = spec.replace(checkpoint_dir=self.settings.checkpoint_dir)
                state_server.directory = checkpoint_dir(spec)
                self.current = Session(
                    spec, message["plan"], dht, transport, self.inbox, self._report, version,
                    self.settings.faults,
                )  # fmt: skip
                self._report(
                    {"type": "session", "plan": message["plan"], "step": self.current.step}
                )
                end = self.current.train(version)
                self.current.close()
                self.current = None
                if end is SessionEnd.DONE or self.inbox.stopped:
                    return 0
                if end is SessionEnd.PEER_LOST and not self.ipc:
                    return 3  # a static plan cannot heal; a control plane re-plans
                # otherwise a new plan arrived, or we wait for the control plane's next one
        finally:
            if self.current is not None:
                self.current.close()  # the checkpoint: the only part of shutdown that matters

            # hivemind's own shutdown can hang for long; give it a moment, then leave: the
            # watchdog kills whatever of the process group is left when we exit
            def shut_down() -> None:
                transport.close()
                dht.shutdown()

            _run_bounded(shut_down, SHUTDOWN_GRACE_S)

    def _expect(self, header: FrameHeader) -> Expected | None:
        session = self.current
        if session is None:
            raise NotReady()  # between plans: the sender retries
        return session.expect(header)

    def _report(self, message: dict[str, Any]) -> None:
        if self.settings.metrics_log:  # what `p2ptrain local` follows, step by step
            with open(self.settings.metrics_log, "a") as f:
                f.write(json.dumps(message) + "\n")
        if message["type"] != "metrics":
            return  # the IPC contract has no other worker -> control message to carry it
        if self.ipc is not None:
            self.ipc.send(message)
        else:
            print(json.dumps(message), flush=True)

    def _hello(self, peer_id: str, data_addrs: list[str]) -> None:
        hello = {"type": "hello", "peer_id": peer_id, "data_addrs": data_addrs, "pid": os.getpid()}
        if self.ipc is not None:
            self.ipc.send(hello)
            return
        # static plan: rendezvous through files next to the plan (NAME.hello.json)
        assert self.settings.plan is not None
        plan_path = Path(self.settings.plan)
        tmp = plan_path.with_name(f".{self.settings.name}.hello.tmp")
        tmp.write_text(json.dumps(hello))
        tmp.replace(plan_path.with_name(f"{self.settings.name}.hello.json"))
        threading.Thread(target=self._wait_static_plan, args=(plan_path,), daemon=True).start()

    def _wait_static_plan(self, plan_path: Path) -> None:
        try:
            message = json.loads(plan_path.read_text())
        except (OSError, ValueError) as exc:
            log.error("cannot read plan %s: %s", plan_path, exc)
            self.inbox.stop()
            return
        names = {name for pipeline in message["plan"]["pipelines"] for name in pipeline}
        while not all(plan_path.with_name(f"{n}.hello.json").exists() for n in names):
            if self.inbox.stopped:
                return
            time.sleep(0.1)
        self.inbox.put_plan(message)

    def _resolved_plan(self, message: dict[str, Any] | None) -> dict[str, Any]:
        """With --plan, replace worker names by the peer ids and addresses they said hello with."""
        assert message is not None
        if not self.settings.plan:
            return message
        plan = dict(message["plan"])
        hellos = {}
        for pipeline in plan["pipelines"]:
            for name in pipeline:
                path = Path(self.settings.plan).with_name(f"{name}.hello.json")
                hellos[name] = json.loads(path.read_text())
        plan["pipelines"] = [[hellos[n]["peer_id"] for n in p] for p in plan["pipelines"]]
        plan["data_addrs"] = {h["peer_id"]: h["data_addrs"] for h in hellos.values()}
        plan.setdefault("epoch", 0)
        plan.setdefault("stages", len(plan["pipelines"][0]))
        return {**message, "plan": plan}

    def _hivemind_identity(self) -> str | None:
        """The node's Ed25519 key rewritten in the 64-byte form p2pd wants (same peer id)."""
        if not self.settings.identity:
            return None
        from p2ptrain import identity

        seed = identity.load_or_create_identity(self.settings.identity)
        fd, path = tempfile.mkstemp(prefix="p2ptrain-hivemind-", suffix=".key")
        with os.fdopen(fd, "wb") as f:  # mkstemp: mode 0600
            f.write(identity.hivemind_key_bytes(seed))
        return path


def _not_actionable(message: dict[str, Any], peer_id: str) -> str:
    """Why a plan message cannot be trained on yet ("" if it can)."""
    if not isinstance(message.get("run"), dict):
        return "no run spec"
    plan = message["plan"]
    addrs = plan.get("data_addrs") or {}
    members = {p for pipeline in plan.get("pipelines", []) for p in pipeline}
    missing = sorted(p for p in members - {peer_id} if not addrs.get(p))
    return f"no data-plane address for {', '.join(missing)}" if missing else ""


def _run_bounded(fn: Callable[[], object], timeout_s: float) -> None:
    thread = threading.Thread(target=fn, daemon=True)
    thread.start()
    thread.join(timeout_s)


def _warm_up_torch() -> None:
    # the first optimizer imports torch._dynamo (1-4 s): pay it while the swarm is still forming
    torch.optim.AdamW([torch.zeros(1, requires_grad=True)])
