"""The `p2ptrain bench control` report: the JSON that control_bench.py's `run_benchmark` returns,
as a table per swarm size (traffic, first plan, estimate errors, plan cost, failover) and the
traffic by what was sent."""

from __future__ import annotations

from typing import Any


def render(result: dict[str, Any]) -> str:
    lines = [
        "peers  kB/s/node med  max   msg/s med  first plan s  RTT err med  p90   rate err med  p90"
        "   plan cost ratio  failover s",
    ]
    for r in result["runs"]:
        b, rtt, rate = r["bytes_per_node_s"], r["rtt_error"] or {}, r["rate_error"] or {}
        lines.append(
            f"{r['peers']:5d}  {b['median'] / 1e3:10.2f} {b['max'] / 1e3:7.1f}  "
            f"{r['messages_per_node_s']['median']:8.2f}  {r['first_plan_s']!s:>12}  "
            f"{rtt.get('median', float('nan')):10.3f} {rtt.get('p90', float('nan')):5.3f}  "
            f"{rate.get('median', float('nan')):12.3f} {rate.get('p90', float('nan')):5.3f}  "
            f"{r['plan_cost_ratio']!s:>16}  {r['failover_s']!s:>10}"
        )
    kinds = sorted({kind for r in result["runs"] for kind in r["bytes_per_node_s_by_kind"]})
    lines += ["", "kB/s/node median, by what was sent", "peers  " + "  ".join(kinds)]
    for r in result["runs"]:
        by_kind = r["bytes_per_node_s_by_kind"]
        lines.append(
            f"{r['peers']:5d}  "
            + "  ".join(f"{by_kind.get(kind, 0.0) / 1e3:{len(kind)}.2f}" for kind in kinds)
        )
    return "\n".join(lines)
