"""The simulated network of `bench control`: the ground truth the estimates are judged against.

Each peer sits in one of the shipped cities (data/region_links.json: one-way delays and path
rates between AWS regions), behind an access link of its own: a last-mile round trip (what a
Vivaldi height should learn) and an upload and a download rate (consumer links, asymmetric, and
some datacenter peers). A round trip is the cities' delay both ways plus both last miles; a
transfer runs at the narrowest of the sender's uplink, the receiver's downlink and the path.
Probes see the truth through jitter (queueing adds to round trips, rates come in a little low)
and loss.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from p2ptrain.schedule.synthetic import load_region_links

LOSS = 0.01  # a probe lost (timed out)
RTT_JITTER = 0.05  # a round trip sample: x (1 + |N(0, this)|) + queueing
MEAN_QUEUEING_MS = 2.0
# (share of peers, download choices in Mbit/s, upload as a share of download (low, high))
ACCESS_KINDS = (
    (0.55, (100.0, 300.0, 500.0, 1000.0), (0.1, 0.5)),  # home cable / fibre
    (0.3, (1000.0,), (0.5, 1.0)),  # symmetric-ish fibre, university
    (0.15, (2000.0, 5000.0, 10000.0), (1.0, 1.0)),  # datacenter / cloud GPU
)
LAST_MILE_MS = (1.0, 25.0)  # a peer's own share of every round trip


@dataclass
class Truth:
    """Every simulated peer's place and access link, by index."""

    seed: int
    cities: list[str] = field(default_factory=list)
    city_delay_ms: npt.NDArray[np.float64] = field(default_factory=lambda: np.zeros((0, 0)))
    city_rate_mbps: npt.NDArray[np.float64] = field(default_factory=lambda: np.zeros((0, 0)))
    city: list[int] = field(default_factory=list)
    last_mile_ms: list[float] = field(default_factory=list)
    up_mbps: list[float] = field(default_factory=list)
    down_mbps: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        cities, delay, gbps, _, _ = load_region_links()
        self.cities, self.city_delay_ms, self.city_rate_mbps = cities, delay, gbps * 1e3
        self._rng = random.Random(self.seed)
        self._weights = [self._rng.uniform(0.5, 1.5) for _ in cities]

    def add_peer(self) -> int:
        """A new peer somewhere; returns its index."""
        rng = self._rng
        self.city.append(rng.choices(range(len(self.cities)), self._weights)[0])
        self.last_mile_ms.append(rng.uniform(*LAST_MILE_MS))
        kind = rng.choices(ACCESS_KINDS, [share for share, _, _ in ACCESS_KINDS])[0]
        _, downs, (low, high) = kind
        down = rng.choice(downs)
        self.down_mbps.append(down)
        self.up_mbps.append(down * rng.uniform(low, high))
        return len(self.city) - 1

    def rtt_ms(self, a: int, b: int) -> float:
        if a == b:
            return 0.0
        path = 2 * float(self.city_delay_ms[self.city[a], self.city[b]])
        return path + self.last_mile_ms[a] + self.last_mile_ms[b]

    def rate_mbps(self, sender: int, receiver: int) -> float:
        path = float(self.city_rate_mbps[self.city[sender], self.city[receiver]])
        return min(self.up_mbps[sender], self.down_mbps[receiver], path)

    def pair_rate_mbps(self, a: int, b: int) -> float:
        """The unordered pair's rate as the planner prices it: the slower direction."""
        return min(self.rate_mbps(a, b), self.rate_mbps(b, a))

    def sample_rtt_ms(self, a: int, b: int, rng: random.Random) -> float | None:
        """One probe's round trip (None: lost)."""
        if rng.random() < LOSS:
            return None
        noise = 1 + abs(rng.gauss(0.0, RTT_JITTER))
        return self.rtt_ms(a, b) * noise + rng.expovariate(1 / MEAN_QUEUEING_MS)

    def sample_rate_mbps(self, sender: int, receiver: int, rng: random.Random) -> float | None:
        if rng.random() < LOSS:
            return None
        return self.rate_mbps(sender, receiver) * rng.uniform(0.85, 1.0)

    def matrices(self, peers: list[int]) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """True round trips (ms) and pair rates (Mbit/s) among `peers`."""
        c = np.array([self.city[p] for p in peers])
        miles = np.array([self.last_mile_ms[p] for p in peers])
        up = np.array([self.up_mbps[p] for p in peers])
        down = np.array([self.down_mbps[p] for p in peers])
        rtt = 2 * self.city_delay_ms[np.ix_(c, c)] + miles[:, None] + miles[None, :]
        path = self.city_rate_mbps[np.ix_(c, c)]
        forward = np.minimum(np.minimum(up[:, None], down[None, :]), path)
        rate = np.minimum(forward, forward.T)
        np.fill_diagonal(rtt, 0.0)
        return rtt, rate
