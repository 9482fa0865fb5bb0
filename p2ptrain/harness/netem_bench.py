"""`p2ptrain bench netem`: configured vs measured RTT and throughput on a sample of emulated links.

Acceptance (issue 5): measured RTT within 10% of configured (with a 1 ms floor on the tolerance)
and measured throughput within 10% of the configured rate, on every sampled link. Throughput is
the link's capacity as UDP sent faster than the link sees it; one TCP flow's goodput is reported
beside it (tcp_mbps_measured) for information.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from typing import Any

from p2ptrain.flags import python_module
from p2ptrain.testbed.links import LinkTable, configured_rtt_ms
from p2ptrain.testbed.testbed import Testbed

RTT_TOLERANCE = 0.10
RTT_FLOOR_MS = 1.0
RATE_TOLERANCE = 0.10
BULK_RTTS = 15
BLAST_S = 1.5
BLAST_RTTS = 4
DEFAULT_CITIES = ["Oregon", "Virginia", "Frankfurt", "Tokyo"]
PROBE = python_module("p2ptrain.harness.link_probe")


def sample_pairs(links: LinkTable, num_links: int) -> list[tuple[int, int]]:
    """num_links unordered pairs spread evenly over the range of configured RTTs (deterministic)."""
    pairs = sorted(
        ((a, b) for a, b in links if a < b), key=lambda p: (configured_rtt_ms(links, *p), p)
    )
    if num_links >= len(pairs):
        return pairs
    if num_links == 1:
        return [pairs[-1]]
    step = (len(pairs) - 1) / (num_links - 1)
    return [pairs[round(i * step)] for i in range(num_links)]


def measure_link(bed: Testbed, a: int, b: int, port: int, bulk_s: float) -> dict[str, Any]:
    """One row: a pings and sends bulk data to b's probe server (for at least BULK_RTTS RTTs,
    so that slow start is a small part of the transfer)."""
    rtt_cfg = configured_rtt_ms(bed.configured, a, b)
    bulk_s = max(bulk_s, BULK_RTTS * rtt_cfg / 1000.0)
    rtt = json.loads(bed.run(a, [*PROBE, "rtt", bed.address(b), str(port)], 60).stdout)
    capacity = json.loads(
        bed.run(
            a,
            [
                *PROBE,
                "blast",
                bed.address(b),
                str(port),
                "--mbps",
                str(bed.configured[(a, b)].rate_mbps),
                "--seconds",
                str(max(BLAST_S, BLAST_RTTS * rtt_cfg / 1000.0)),
            ],
            120,
        ).stdout
    )
    bulk = json.loads(
        bed.run(
            a, [*PROBE, "bulk", bed.address(b), str(port), "--seconds", str(bulk_s)], 120
        ).stdout
    )
    mbps_cfg = bed.configured[(a, b)].rate_mbps
    row = {
        "a": bed.names[a],
        "b": bed.names[b],
        "rtt_ms_configured": round(rtt_cfg, 3),
        "rtt_ms_measured": round(rtt["rtt_ms"], 3),
        "mbps_configured": round(mbps_cfg, 3),
        "mbps_measured": round(capacity["mbps"], 3),
        "tcp_mbps_measured": round(bulk["mbps"], 3),
    }
    row["rtt_ok"] = abs(rtt["rtt_ms"] - rtt_cfg) <= max(RTT_TOLERANCE * rtt_cfg, RTT_FLOOR_MS)
    row["mbps_ok"] = abs(capacity["mbps"] - mbps_cfg) <= RATE_TOLERANCE * mbps_cfg
    return row


def run_netem_bench(
    topology: Any,
    *,
    num_links: int,
    bulk_s: float,
    bandwidth_scale: float | None,
    delay_scale: float,
    progress: Callable[[str], None],
) -> dict[str, Any]:
    """Build the testbed, measure the sampled links one at a time (so they do not share CPU)."""
    rows = []
    with Testbed.from_topology(
        topology, bandwidth_scale=bandwidth_scale, delay_scale=delay_scale
    ) as bed:
        pairs = sample_pairs(bed.configured, num_links)
        ports: dict[int, int] = {}
        for b in sorted({b for _, b in pairs}):
            server = bed.spawn(b, [*PROBE, "serve", bed.address(b)], stdout=subprocess.PIPE)
            assert server.stdout is not None
            ports[b] = json.loads(server.stdout.readline())["port"]
        for a, b in pairs:
            progress(f"measuring {bed.names[a]} -> {bed.names[b]}")
            rows.append(measure_link(bed, a, b, ports[b], bulk_s))
    return {
        "topology": getattr(topology, "name", "topology"),
        "bandwidth_scale": bandwidth_scale,
        "delay_scale": delay_scale,
        "bulk_s": bulk_s,
        "links": rows,
        "pass": all(r["rtt_ok"] and r["mbps_ok"] for r in rows),
    }


def render(result: dict[str, Any]) -> str:
    """A text table of the result."""
    header = (
        f"{'link':<28} {'RTT cfg ms':>10} {'RTT meas':>9} {'err':>6}   "
        f"{'Mb/s cfg':>8} {'Mb/s meas':>9} {'err':>6}   {'TCP Mb/s':>8}"
    )
    lines = [header, "-" * len(header)]
    for r in result["links"]:
        rtt_err = (r["rtt_ms_measured"] - r["rtt_ms_configured"]) / r["rtt_ms_configured"]
        rate_err = (r["mbps_measured"] - r["mbps_configured"]) / r["mbps_configured"]
        lines.append(
            f"{r['a'] + ' - ' + r['b']:<28} {r['rtt_ms_configured']:>10.2f} "
            f"{r['rtt_ms_measured']:>9.2f} {rtt_err:>+6.1%}{'' if r['rtt_ok'] else '!'}  "
            f"{r['mbps_configured']:>8.2f} {r['mbps_measured']:>9.2f} "
            f"{rate_err:>+6.1%}{'' if r['mbps_ok'] else '!':1} {r['tcp_mbps_measured']:>9.2f}"
        )
    verdict = "PASS" if result["pass"] else "FAIL"
    lines.append(
        f"\n{verdict}: RTT within {RTT_TOLERANCE:.0%} (floor {RTT_FLOOR_MS:g} ms), "
        f"throughput within {RATE_TOLERANCE:.0%} ('!' marks a miss)\n"
        "Mb/s meas: rate of UDP sent 30% faster than the link; TCP Mb/s: one TCP flow's goodput "
        "(information: TCP's own sawtooth and loss recovery move it by a few %)"
    )
    return "\n".join(lines)
