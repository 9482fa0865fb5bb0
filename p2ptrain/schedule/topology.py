"""Topologies: who is in the swarm and the measured links between them (format p2ptrain.topology/1).

A topology is validated once, when it is built; everything downstream trusts it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from p2ptrain.errors import UserError
from p2ptrain.schedule.compute import PeerCompute

FORMAT = "p2ptrain.topology/1"
MAX_TOPOLOGY_BYTES = 64 * 1024 * 1024
MAX_PEERS = 16384

FloatMatrix = npt.NDArray[np.float64]


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class TopologyError(UserError):
    """A topology file or value that cannot be used; the message names the problem."""


@dataclass(frozen=True)
class Workload:
    """What is being trained, in the paper's units.

    c_dp_gb: GB of one stage's gradients (exchanged inside a data-parallel group), per exchange.
    c_pp_gb: GB of one replica's activations crossing one stage boundary.
    steps_per_sync: steps per data-parallel exchange: 1 averages every step (the paper, and
        sync = "step"); DiLoCo's H exchanges the (compressed) pseudo-gradient once every H
        steps, its cost spread over them.
    """

    stages: int
    replicas: int
    c_dp_gb: float
    c_pp_gb: float
    steps_per_sync: int = 1

    def __post_init__(self) -> None:
        for name in ("stages", "replicas", "steps_per_sync"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise TopologyError(f"workload.{name} must be a positive integer, got {value!r}")
        for name in ("c_dp_gb", "c_pp_gb"):
            value = getattr(self, name)
            if not _is_number(value) or not math.isfinite(value) or value < 0:
                raise TopologyError(f"workload.{name} must be a finite number >= 0, got {value!r}")


# The paper's GPT-3 XL workload (24 layers, 8 stages x 8 replicas), used when a topology has none.
PAPER_WORKLOAD = Workload(stages=8, replicas=8, c_dp_gb=0.65, c_pp_gb=0.47124922275543213)


@dataclass(frozen=True)
class Topology:
    """N peers with symmetric one-way delay (ms) and bandwidth (Gbit/s) between every pair."""

    peers: list[str]
    delay_ms: FloatMatrix
    bandwidth_gbps: FloatMatrix
    regions: list[str] | None = None
    workload: Workload | None = None
    name: str = "topology"
    source: str = field(default="", compare=False)
    # each peer's measured compute (compute.py); None: the paper's model, communication only
    compute: PeerCompute | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        peers = self.peers
        if not isinstance(peers, list) or not all(isinstance(p, str) and p for p in peers):
            raise TopologyError("peers must be a list of non-empty strings")
        num_peers = len(peers)
        if num_peers < 1:
            raise TopologyError("peers is empty")
        if num_peers > MAX_PEERS:
            raise TopologyError(f"{num_peers} peers is more than the limit of {MAX_PEERS}")
        seen: set[str] = set()
        for peer in peers:
            if peer in seen:
                raise TopologyError(f"duplicate peer {peer!r}")
            seen.add(peer)
        delay = _square_matrix("delay_ms", self.delay_ms, num_peers)
        bandwidth = _square_matrix("bandwidth_gbps", self.bandwidth_gbps, num_peers)
        off_diagonal = ~np.eye(num_peers, dtype=bool)
        if (delay < 0).any():
            i, j = np.argwhere(delay < 0)[0]
            raise TopologyError(f"delay_ms[{i}][{j}] is negative ({delay[i, j]})")
        bad_bw = off_diagonal & ~(bandwidth > 0)
        if bad_bw.any():
            i, j = np.argwhere(bad_bw)[0]
            raise TopologyError(f"bandwidth_gbps[{i}][{j}] must be > 0, got {bandwidth[i, j]}")
        # The graph is treated as symmetric (the paper averages the two directions).
        # halves first: two finite values near the float's limit overflow as a sum
        object.__setattr__(self, "delay_ms", delay / 2 + delay.T / 2)
        object.__setattr__(self, "bandwidth_gbps", bandwidth / 2 + bandwidth.T / 2)
        if self.regions is not None and (
            not isinstance(self.regions, list)
            or len(self.regions) != num_peers
            or not all(isinstance(r, str) for r in self.regions)
        ):
            raise TopologyError(f"regions must be a list of {num_peers} strings, one per peer")
        if self.workload is not None:
            self.check_fits(self.workload.stages, self.workload.replicas)
        if self.compute is not None and self.compute.num_peers != num_peers:
            raise TopologyError(f"compute must have one entry per peer ({num_peers})")

    @property
    def num_peers(self) -> int:
        return len(self.peers)

    def check_fits(self, stages: int, replicas: int) -> None:
        """Raise TopologyError unless stages x replicas tasklets fit on the peers."""
        if stages < 1 or replicas < 1:
            raise TopologyError(f"stages and replicas must be >= 1, got {stages} x {replicas}")
        if stages * replicas > self.num_peers:
            raise TopologyError(
                f"the workload needs {stages} stages x {replicas} replicas = {stages * replicas} "
                f"peers but the topology has only {self.num_peers}"
            )

    def region_of(self, peer: int) -> str:
        return self.regions[peer] if self.regions is not None else self.peers[peer]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "format": FORMAT,
            "name": self.name,
            "peers": self.peers,
            "delay_ms": self.delay_ms.tolist(),
            "bandwidth_gbps": self.bandwidth_gbps.tolist(),
        }
        if self.source:
            out["source"] = self.source
        if self.regions is not None:
            out["regions"] = self.regions
        if self.workload is not None:
            w = self.workload
            out["workload"] = {
                "stages": w.stages,
                "replicas": w.replicas,
                "c_dp_gb": w.c_dp_gb,
                "c_pp_gb": w.c_pp_gb,
            }
            if w.steps_per_sync != 1:
                out["workload"]["steps_per_sync"] = w.steps_per_sync
        return out


def _square_matrix(name: str, value: object, num_peers: int) -> FloatMatrix:
    if isinstance(value, np.ndarray):
        matrix = value
    else:
        if not isinstance(value, list) or not all(isinstance(row, list) for row in value):
            raise TopologyError(f"{name} must be a list of lists of numbers")
        if any(len(row) != len(value) for row in value):
            raise TopologyError(f"{name} is not square (rows of different lengths)")
        if not all(_is_number(x) for row in value for x in row):
            raise TopologyError(f"{name} holds a value that is not a number")
        matrix = np.array(value, dtype=np.float64)
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
        raise TopologyError(f"{name} is not square: shape {matrix.shape}")
    if matrix.shape[0] != num_peers:
        raise TopologyError(
            f"{name} is {matrix.shape[0]}x{matrix.shape[1]} but there are {num_peers} peers"
        )
    matrix = matrix.astype(np.float64, copy=True)
    bad = ~np.isfinite(matrix)
    if bad.any():
        i, j = np.argwhere(bad)[0]
        raise TopologyError(f"{name}[{i}][{j}] is {matrix[i, j]} (must be a finite number)")
    return matrix


def topology_from_json(doc: object, *, origin: str = "topology") -> Topology:
    """Build a Topology from a parsed p2ptrain.topology/1 document."""
    try:
        return _topology_from_json(doc, origin)
    except OverflowError:  # a JSON integer past any float (10**400)
        raise TopologyError(f"{origin}: a number is too large for a float") from None


def _topology_from_json(doc: object, origin: str) -> Topology:
    if not isinstance(doc, dict):
        raise TopologyError(f"{origin}: expected a JSON object")
    fmt = doc.get("format")
    if fmt != FORMAT:
        raise TopologyError(f"{origin}: format must be {FORMAT!r}, got {fmt!r}")
    for key in ("peers", "delay_ms", "bandwidth_gbps"):
        if key not in doc:
            raise TopologyError(f"{origin}: missing field {key!r}")
    workload = None
    if doc.get("workload") is not None:
        raw = doc["workload"]
        if not isinstance(raw, dict):
            raise TopologyError(f"{origin}: workload must be an object")
        missing = [k for k in ("stages", "replicas", "c_dp_gb", "c_pp_gb") if k not in raw]
        if missing:
            raise TopologyError(f"{origin}: workload is missing {', '.join(missing)}")
        workload = Workload(
            raw["stages"],
            raw["replicas"],
            raw["c_dp_gb"],
            raw["c_pp_gb"],
            raw.get("steps_per_sync", 1),
        )
    name = doc.get("name", Path(origin).stem)
    try:
        return Topology(
            peers=doc["peers"],
            delay_ms=doc["delay_ms"],
            bandwidth_gbps=doc["bandwidth_gbps"],
            regions=doc.get("regions"),
            workload=workload,
            name=str(name),
            source=str(doc.get("source", "")),
        )
    except TopologyError as exc:
        raise TopologyError(f"{origin}: {exc}") from None


def load_topology(path: str | Path) -> Topology:
    """Read and validate a topology file; every problem is one TopologyError line."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise TopologyError(f"{path}: cannot read ({exc.strerror})") from None
    if size > MAX_TOPOLOGY_BYTES:
        raise TopologyError(f"{path}: {size} bytes is over the {MAX_TOPOLOGY_BYTES}-byte limit")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:  # a directory, a file gone meanwhile
        raise TopologyError(f"{path}: cannot read ({exc.strerror})") from None
    except (ValueError, RecursionError) as exc:  # not UTF-8 JSON, or nested past the stack
        raise TopologyError(f"{path}: not valid JSON ({str(exc)[:80]})") from None
    return topology_from_json(doc, origin=str(path))


def scenario_path(name: str) -> Path:
    """Path of one of the paper's scenarios shipped with the package."""
    path = Path(__file__).resolve().parent.parent / "data" / "scenarios" / f"{name}.json"
    if not path.exists():
        raise TopologyError(f"unknown scenario {name!r}")
    return path


PAPER_SCENARIOS = (
    "datacenter_on_demand",
    "datacenter_spot",
    "multi_datacenter",
    "regional",
    "worldwide",
)
