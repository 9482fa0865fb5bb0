"""Does the data plane's daemon start here, and where would the stage train? `python -m
p2ptrain.worker.daemon_check --listen MADDR [--device NAME]` starts hivemind's p2pd on MADDR (as a
worker would), prints one JSON line `{"ok": true, "addrs": [...], "p2pd": PATH, "go_runtime":
{...}, "device": {...}}` (the daemon's Go settings, as it runs: worker/daemon_env.py) or `{"ok":
false, "error": ..., "device": {...}}`, stops it and exits (0 or 1). `device` (device_facts):
`{"name", "memory_bytes", "precision", "precision_scaled"}` (what the passes compute in, without
and with the run's `loss_scale`: worker/device.py) or `{"error"}` (the device is not here).

`p2ptrain doctor` runs it as a child process: hivemind and py-libp2p are never imported into one
process. As a worker does, it installs the watchdog first (p2pd, which has no parent-death signal,
dies with the check however the check ends: a Ctrl-C or SIGKILL of the doctor) and keeps
hivemind's sockets in a private temp folder (worker/private_tmp.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from typing import Any

from p2ptrain.records.fields import MAX_ADDRS
from p2ptrain.records.messages import DaemonCheckReply, one_line
from p2ptrain.worker import watchdog
from p2ptrain.worker.private_tmp import PrivateTmp

START_TIMEOUT_S = 30.0


async def start_and_stop(listen: str) -> dict[str, Any]:
    from importlib.resources import files

    import hivemind.hivemind_cli as cli
    from hivemind.p2p import P2P
    from hivemind.p2p.p2p_daemon import P2PD_FILENAME

    from p2ptrain.worker import daemon_env

    daemon_env.use_for_daemons()  # as a worker starts its daemon
    # no UPnP port mapping and no AutoNAT: nothing but the listener is touched
    p2p = await P2P.create(
        host_maddrs=[listen], nat_port_map=False, auto_nat=False, startup_timeout=START_TIMEOUT_S
    )
    try:
        addrs = [str(a) for a in await p2p.get_visible_maddrs()]
        go_runtime = _daemon_go_runtime()
    finally:
        await p2p.shutdown()
    path = str(files(cli) / P2PD_FILENAME)
    return {"ok": True, "addrs": addrs[:MAX_ADDRS], "p2pd": path, "go_runtime": go_runtime}


def _daemon_go_runtime() -> dict[str, str]:
    """GOGC and GOMEMLIMIT in our p2pd child's environment (empty where /proc cannot say)."""
    import psutil

    for child in psutil.Process().children(recursive=True):
        try:
            if child.name() == "p2pd":
                env = child.environ()
                return {k: env[k] for k in ("GOGC", "GOMEMLIMIT") if k in env}
        except psutil.Error:
            continue
    return {}


def device_facts(name: str) -> dict[str, Any]:
    """Where `--device name` trains here, and in what precision; or why it cannot."""
    try:
        import torch  # noqa: F401  (the train extra: its absence is the daemon's error too)

        from p2ptrain.worker.compute_probe import device_name
        from p2ptrain.worker.device import memory_bytes, precision_for, resolve_device

        device = resolve_device(name)
        return {
            "name": device_name(device),
            "memory_bytes": memory_bytes(device),
            "precision": precision_for(device).name,
            "precision_scaled": precision_for(device, loss_scale=2.0).name,
        }
    except ImportError as exc:
        return {"error": f"the train extra is not installed ({exc.name} missing)"}
    except Exception as exc:  # a UserError (not here), or a driver's
        return {"error": one_line(str(exc) or type(exc).__name__)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m p2ptrain.worker.daemon_check")
    parser.add_argument("--listen", required=True, metavar="MADDR", help="/ip4/HOST/tcp/PORT")
    parser.add_argument("--device", default="auto", help="as `join --device` (default auto)")
    args = parser.parse_args(argv)
    watchdog.install(signal.SIGKILL)  # before any thread; nothing to save on the parent's death
    private = PrivateTmp()
    try:
        private.use()
        result = asyncio.run(start_and_stop(args.listen))
    except ImportError as exc:
        result = {"ok": False, "error": f"the data plane is not installed ({exc.name} missing)"}
    except Exception as exc:
        result = {"ok": False, "error": one_line(f"{type(exc).__name__}: {exc}")}
    finally:
        private.remove()
    result["device"] = device_facts(args.device)
    print(
        json.dumps(DaemonCheckReply.from_dict(result).to_dict()), flush=True
    )  # as doctor reads it
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
