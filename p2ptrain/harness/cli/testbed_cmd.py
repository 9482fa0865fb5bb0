"""``p2ptrain testbed ACTION``: run the WAN emulator and inject faults into a running one (root).

p2ptrain testbed up [TOPOLOGY]           # until Ctrl-C; prints peers, namespaces, addresses
p2ptrain testbed exec PEER -- CMD ...    # run CMD inside the peer's namespace
p2ptrain testbed link A B --delay-ms 80 --rate-mbps 5 --loss 0.01 | --cut | --restore
p2ptrain testbed disconnect|reconnect|kill|freeze|thaw PEER
p2ptrain testbed cpu PEER CORES          # CPU quota of a peer's processes (0.25: 4x slower; none)
p2ptrain testbed show | list | cleanup
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    up = actions.add_parser("up", help="start a testbed and keep it until Ctrl-C or SIGTERM")
    from p2ptrain.harness.cli.wan_bench import add_emulation_arguments  # stdlib only: cheap

    add_emulation_arguments(up, default_peers=4, positional_topology=True)
    up.add_argument("--mtu", type=int, default=9000, help="MTU of the peers' interfaces")

    def with_id(name: str, help_text: str) -> argparse.ArgumentParser:
        p = actions.add_parser(name, help=help_text)
        p.add_argument("--id", help="which testbed (when several run)")
        return p

    ex = with_id("exec", "run a command inside a peer's namespace")
    ex.add_argument("peer", help="peer index, name or address")
    ex.add_argument("argv", nargs=argparse.REMAINDER, help="-- command and arguments")
    link = with_id("link", "change, cut or restore the link between two peers")
    link.add_argument("a")
    link.add_argument("b")
    link.add_argument("--delay-ms", type=float, help="one-way delay")
    link.add_argument("--rate-mbps", type=float)
    link.add_argument("--jitter-ms", type=float, help="uniform +- jitter (order is kept)")
    link.add_argument("--loss", type=float, help="packet loss probability 0..1")
    link.add_argument("--one-way", action="store_true", help="only the direction A -> B")
    mode = link.add_mutually_exclusive_group()
    mode.add_argument("--cut", action="store_true", help="drop every packet")
    mode.add_argument("--restore", action="store_true", help="back to the configured values")
    for name, help_text in (
        ("disconnect", "cut every link of a peer"),
        ("reconnect", "undo disconnect"),
        ("kill", "SIGKILL every process of a peer"),
        ("freeze", "SIGSTOP every process of a peer"),
        ("thaw", "SIGCONT every process of a peer"),
    ):
        with_id(name, help_text).add_argument("peer", help="peer index, name or address")
    quota = with_id("cpu", "limit a peer's processes to CORES of CPU time (a slow peer)")
    quota.add_argument("peer", help="peer index, name or address")
    quota.add_argument("cores", help="e.g. 0.25 (a quarter of one core), or 'none' for no limit")
    with_id("show", "peers, current links and per-link counters")
    actions.add_parser("list", help="running testbeds")
    actions.add_parser("cleanup", help="remove namespaces left by a testbed whose owner died")


def run(args: argparse.Namespace) -> int:
    from p2ptrain.errors import UserError
    from p2ptrain.testbed import TestbedHandle, cleanup_stale, list_testbeds, require_root

    require_root()
    if args.action == "up":
        return _up(args)
    if args.action == "list":
        for state in list_testbeds():
            print(f"{state['id']}  {len(state['names'])} peers  owner pid {state['owner_pid']}")
        return 0
    if args.action == "cleanup":
        removed = cleanup_stale()
        print(f"removed {len(removed)} namespaces" + (f": {' '.join(removed)}" if removed else ""))
        return 0
    bed = TestbedHandle.attach(args.id)
    if args.action == "exec":
        argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
        if not argv:
            raise UserError("exec needs a command: p2ptrain testbed exec PEER -- CMD ...")
        return subprocess.call(bed.command(args.peer, argv))
    if args.action == "link":
        if args.cut:
            bed.cut_link(args.a, args.b, both_ways=not args.one_way)
        elif args.restore:
            bed.restore_link(args.a, args.b)
        else:
            bed.set_link(
                args.a,
                args.b,
                both_ways=not args.one_way,
                delay_ms=args.delay_ms,
                rate_mbps=args.rate_mbps,
                jitter_ms=args.jitter_ms,
                loss=args.loss,
            )
        return 0
    if args.action == "cpu":
        if args.cores == "none":
            bed.set_cpu(args.peer, None)
        else:
            try:
                bed.set_cpu(args.peer, float(args.cores))
            except ValueError:
                raise UserError(f"CORES must be a number or 'none', got {args.cores!r}") from None
        return 0
    if args.action in ("disconnect", "reconnect"):
        getattr(bed, args.action)(args.peer)
        return 0
    if args.action in ("kill", "freeze", "thaw"):
        count = getattr(bed, args.action)(args.peer)
        print(f"{args.action}: {count} processes in {bed.namespace(args.peer)}")
        return 0
    _show(bed)
    return 0


def _up(args: argparse.Namespace) -> int:
    from p2ptrain.harness.cli.wan_bench import load_emulated_topology
    from p2ptrain.testbed import Testbed
    from p2ptrain.testbed.cpu import quotas_from_topology_file

    topology = load_emulated_topology(args)
    cores = quotas_from_topology_file(args.topology, topology.peers) if args.topology else {}
    # SIGTERM/SIGHUP unwind like Ctrl-C so that the namespaces are removed.
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _raise_interrupt)
    bed = Testbed.from_topology(
        topology,
        bandwidth_scale=args.bandwidth_scale,
        delay_scale=args.delay_scale,
        mtu=args.mtu,
        cpu_cores=cores,
    )
    with bed:
        print(f"testbed {bed.id} up: {bed.num_peers} peers (Ctrl-C to tear down)")
        for i in range(bed.num_peers):
            print(
                f"  {i:>3}  {bed.names[i]:<20} {bed.addresses[i]:<12} ip netns exec {bed.namespaces[i]}"
            )
        sys.stdout.flush()
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
    print(f"testbed {bed.id} torn down")
    return 0


def _raise_interrupt(*_: Any) -> None:
    raise KeyboardInterrupt


def _show(bed: Any) -> None:
    links, stats = bed.links(), bed.stats()
    print(f"testbed {bed.state['id']}: {bed.num_peers} peers")
    for i in range(bed.num_peers):
        print(f"  {i:>3}  {bed.names[i]:<20} {bed.addresses[i]:<12} {bed.namespaces[i]}")
    print(
        f"\n  {'link':<10} {'delay ms':>9} {'Mb/s':>8} {'jitter':>7} {'loss':>6} {'up':>3} "
        f"{'packets':>9} {'bytes':>12} {'dropped':>8}"
    )
    for (a, b), spec in sorted(links.items()):
        s = stats[(a, b)]
        print(
            f"  {f'{a}->{b}':<10} {spec.delay_ms:>9.2f} {spec.rate_mbps:>8.2f} "
            f"{spec.jitter_ms:>7.2f} {spec.loss:>6.3f} {'yes' if spec.up else 'NO':>3} "
            f"{s['packets']:>9} {s['bytes']:>12} {s['dropped']:>8}"
        )
