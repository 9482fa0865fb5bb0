"""``p2ptrain testbed ACTION``: run the WAN emulator and inject faults into a running one (root).

p2ptrain testbed up [TOPOLOGY]           # until Ctrl-C; prints peers, namespaces, addresses
p2ptrain testbed exec PEER -- CMD ...    # run CMD inside the peer's namespace
p2ptrain testbed link A B --delay-ms 80 --rate-mbps 5 --loss 0.01 | --cut | --restore
p2ptrain testbed disconnect|reconnect|kill|freeze|thaw PEER
p2ptrain testbed cpu PEER CORES          # CPU quota of a peer's processes (0.25: 4x slower; none)
p2ptrain testbed nat PEER none|cone|symmetric   # put a peer behind an emulated NAT
p2ptrain testbed nat [PEER]              # NAT types, drops and live mappings
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
    up.add_argument(
        "--nat",
        action="append",
        default=[],
        metavar="PEER=TYPE",
        help="put a peer behind a NAT: none, cone or symmetric (repeatable; over the "
        'topology file\'s "nat" object)',
    )
    up.add_argument("--nat-tcp-timeout-s", type=float, help="idle TCP mappings expire (120)")
    up.add_argument("--nat-udp-timeout-s", type=float, help="idle UDP mappings expire (30)")

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
    nat = with_id("nat", "put a peer behind an emulated NAT, or show NATs and their mappings")
    nat.add_argument("peer", nargs="?", help="peer index, name or address")
    nat.add_argument("type", nargs="?", choices=("none", "cone", "symmetric"))
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
    if args.action == "nat":
        if args.type is not None:
            bed.set_nat(args.peer, args.type)
            name = bed.names[bed.index(args.peer)]
            print(f"{name}: {args.type}, reached at {bed.public_address(args.peer)}")
        else:
            _show_nat(bed, args.peer)
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
    from p2ptrain.testbed.nat import NatTimeouts, nat_from_topology_file

    topology = load_emulated_topology(args)
    cores = quotas_from_topology_file(args.topology, topology.peers) if args.topology else {}
    nat = nat_from_topology_file(args.topology, topology.peers) if args.topology else {}
    nat.update(_nat_flags(args.nat, list(topology.peers)))
    nat = {i: nat_type for i, nat_type in nat.items() if nat_type != "none"}
    defaults = NatTimeouts()
    timeouts = NatTimeouts(
        tcp_s=defaults.tcp_s if args.nat_tcp_timeout_s is None else args.nat_tcp_timeout_s,
        udp_s=defaults.udp_s if args.nat_udp_timeout_s is None else args.nat_udp_timeout_s,
    )
    # SIGTERM/SIGHUP unwind like Ctrl-C so that the namespaces are removed.
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _raise_interrupt)
    bed = Testbed.from_topology(
        topology,
        bandwidth_scale=args.bandwidth_scale,
        delay_scale=args.delay_scale,
        mtu=args.mtu,
        cpu_cores=cores,
        nat=nat,
        nat_timeouts=timeouts,
    )
    with bed:
        print(f"testbed {bed.id} up: {bed.num_peers} peers (Ctrl-C to tear down)")
        for i in range(bed.num_peers):
            behind = f"  behind a {nat[i]} NAT at {bed.nat_addresses[i]}" if i in nat else ""
            print(
                f"  {i:>3}  {bed.names[i]:<20} {bed.addresses[i]:<12} "
                f"ip netns exec {bed.namespaces[i]}{behind}"
            )
        sys.stdout.flush()
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
    print(f"testbed {bed.id} torn down")
    return 0


def _nat_flags(flags: list[str], names: list[str]) -> dict[int, str]:
    """--nat PEER=TYPE flags: {peer index: type} (peers by index or name)."""
    from p2ptrain.errors import UserError
    from p2ptrain.testbed.nat import check_nat_type

    nat = {}
    for flag in flags:
        peer, sep, nat_type = flag.partition("=")
        if not sep:
            raise UserError(f"--nat takes PEER=TYPE (e.g. 1=cone), got {flag!r}")
        if peer in names:
            index = names.index(peer)
        elif peer.isascii() and peer.isdigit() and int(peer) < len(names):
            index = int(peer)
        else:
            raise UserError(f"--nat {flag}: no peer {peer!r}")
        nat[index] = check_nat_type(nat_type)
    return nat


def _raise_interrupt(*_: Any) -> None:
    raise KeyboardInterrupt


def _show_nat(bed: Any, peer: str | None) -> None:
    wanted = None if peer is None else bed.index(peer)
    for s in bed.nat_stats():
        if wanted in (None, s["peer"]):
            print(
                f"  {s['peer']:>3}  {bed.names[s['peer']]:<20} {s['type']:<9} at {s['public']:<12} "
                f"{s['mappings']:>5} mappings, dropped {s['dropped_in']} in, {s['dropped_out']} out"
            )
    for m in bed.nat_mappings(wanted):
        print(
            f"  {m.peer:>3}  {m.protocol} :{m.private_port} -> {m.public_address}:{m.public_port}"
            f"  idle {m.idle_s:.1f} s  open to {' '.join(m.remotes)}"
        )


def _show(bed: Any) -> None:
    links, stats = bed.links(), bed.stats()
    nat = {s["peer"]: s for s in bed.nat_stats()}
    print(f"testbed {bed.state['id']}: {bed.num_peers} peers")
    for i in range(bed.num_peers):
        behind = "" if nat[i]["type"] == "none" else f"  {nat[i]['type']} NAT at {nat[i]['public']}"
        print(f"  {i:>3}  {bed.names[i]:<20} {bed.addresses[i]:<12} {bed.namespaces[i]}{behind}")
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
