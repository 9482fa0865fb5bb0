"""The planner's own embedding of the swarm's round trips, fitted to every measured sample it has.

Each node's Vivaldi coordinate (coordinates.py) moves a little per probe it sends: at a probe a
second it needs several hundred samples to settle, far longer than a planner can wait for its
first plan (`bench control` at 300 peers, 98 s in: error median 0.22, 90th percentile 2.3, round
trips within a city over-estimated 4.5x). The planner sees more than any node: the measurements of
every node's neighbour set (their telemetry), ~16-23 links a node by then. It fits one embedding (a
Euclidean part and a height, as Vivaldi's) to all of them at once, by Adam on the squared relative
error (a near link counts as much as a far one: estimates are judged relatively), and predicts
every unmeasured pair from it (same run: 0.07 / 0.29).

Every peer starts near the origin, at an offset derived from its id (the nodes' coordinates are no
better start: a fit from them keeps their folds). A peer with fewer than MIN_LINKS_PLACED measured
links is not placed: its pairs keep the Vivaldi estimate. Deterministic, and independent of the
peers' order up to rounding.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from p2ptrain.control.estimate.coordinates import MIN_HEIGHT_MS
from p2ptrain.records.estimate import COORDINATE_DIMENSIONS

FloatMatrix = npt.NDArray[np.float64]

FIT_ITERATIONS = 1000
START_SPREAD_MS = 20.0  # each peer starts at an offset this large from the origin
QUANTUM = 0.02  # the fit sees measured round trips on a grid of this many log-steps (2%)
NUM_REMEMBERED = 4
FIRST_STEP_MS = 20.0  # Adam's step size, decaying geometrically to LAST_STEP_MS
LAST_STEP_MS = 0.1
ADAM_BETAS = (0.9, 0.999)
# a sample's relative error counts as at most this factor: a member claiming 0.05 ms to every
# peer (its own word stands where the other end did not probe it) pulled the fit ~10^5 times
# harder than an honest sample per link, and folded two cities into one
MAX_ERROR_FACTOR = 3.0
# the least round trip the model can predict (two heights): a claim of 1e-160 ms overflowed the
# weights to infinity, the fit became NaN and every pair fell back to the nodes' coordinates
MIN_FIT_RTT_MS = 2 * MIN_HEIGHT_MS
# a peer the fit places: one with at least this many measured links (fewer leave it free to
# turn about the peers it measured; its pairs keep the Vivaldi estimate)
MIN_LINKS_PLACED = COORDINATE_DIMENSIONS + 1


def fitted_rtts(peers: Sequence[str], measured_rtt: FloatMatrix) -> FloatMatrix:
    """Predicted round trips (ms) among `peers` from an embedding fitted to `measured_rtt` (NaN
    where not measured; symmetric); NaN for a pair with an end the fit did not place. A pure
    function of the peers and the measurements on a QUANTUM grid, remembered for the latest
    few: the live planner asks every second, and most seconds nothing moved by a grid step."""
    quantized = np.exp(np.round(np.log(measured_rtt) / QUANTUM) * QUANTUM)  # NaN stays NaN
    key = hashlib.blake2b(
        "\n".join(peers).encode() + b"\0" + quantized.tobytes(), digest_size=16
    ).digest()
    if key not in _recent_fits:
        _recent_fits[key] = _fit(peers, quantized)
        while len(_recent_fits) > NUM_REMEMBERED:
            del _recent_fits[next(iter(_recent_fits))]
    return _recent_fits[key].copy()


_recent_fits: dict[bytes, FloatMatrix] = {}


def _fit(peers: Sequence[str], measured_rtt: FloatMatrix) -> FloatMatrix:
    n = len(peers)
    upper = np.triu(np.isfinite(measured_rtt) & (measured_rtt > 0), k=1)
    first, second = np.nonzero(upper)
    rtts = measured_rtt[first, second].astype(np.float64)
    vectors = np.array([_start(peer) for peer in peers]).reshape(n, COORDINATE_DIMENSIONS)
    heights = np.full(n, MIN_HEIGHT_MS)
    if rtts.size:
        vectors, heights = _descend(vectors, heights, first, second, rtts)
    distance = np.linalg.norm(vectors[:, None, :] - vectors[None, :, :], axis=2)
    predicted = distance + heights[:, None] + heights[None, :]
    num_links = np.bincount(first, minlength=n) + np.bincount(second, minlength=n)
    placed = num_links >= MIN_LINKS_PLACED
    predicted[~(placed[:, None] & placed[None, :])] = np.nan
    return predicted


def _start(peer: str) -> list[float]:
    """A peer's starting point: a small offset derived from its id (no two start together)."""
    return [
        START_SPREAD_MS * (zlib.crc32(f"{peer}/{k}".encode()) / 2**32 - 0.5)
        for k in range(COORDINATE_DIMENSIONS)
    ]


def _descend(
    vectors: FloatMatrix,
    heights: npt.NDArray[np.float64],
    first: npt.NDArray[np.intp],
    second: npt.NDArray[np.intp],
    rtts: npt.NDArray[np.float64],
) -> tuple[FloatMatrix, npt.NDArray[np.float64]]:
    """Adam on the squared relative error of the measured pairs, bounded per sample: the
    error counts as at most MAX_ERROR_FACTOR, and its pull is divided by the larger of the
    measured and the predicted round trip (the measured alone: a tiny claim pulled hardest)."""
    n, dims = vectors.shape
    params = np.concatenate([vectors, heights[:, None]], axis=1)
    mean, square = np.zeros_like(params), np.zeros_like(params)
    beta1, beta2 = ADAM_BETAS
    rtts = np.maximum(rtts, MIN_FIT_RTT_MS)
    clip = MAX_ERROR_FACTOR - 1.0
    decay = (LAST_STEP_MS / FIRST_STEP_MS) ** (1.0 / FIT_ITERATIONS)
    step = FIRST_STEP_MS
    gradient = np.empty_like(params)
    for t in range(1, FIT_ITERATIONS + 1):
        apart = params[first, :dims] - params[second, :dims]
        length = np.sqrt(np.einsum("ij,ij->i", apart, apart)) + 1e-9
        predicted = length + params[first, dims] + params[second, dims]
        error = np.clip((predicted - rtts) / rtts, -clip, clip)
        residual = 2.0 * error / np.maximum(rtts, predicted)
        pull = apart * (residual / length)[:, None]
        for k in range(dims):
            gradient[:, k] = np.bincount(first, pull[:, k], n) - np.bincount(second, pull[:, k], n)
        gradient[:, dims] = np.bincount(first, residual, n) + np.bincount(second, residual, n)
        mean = beta1 * mean + (1 - beta1) * gradient
        square = beta2 * square + (1 - beta2) * gradient * gradient
        params -= step * (mean / (1 - beta1**t)) / (np.sqrt(square / (1 - beta2**t)) + 1e-12)
        np.maximum(params[:, dims], MIN_HEIGHT_MS, out=params[:, dims])
        step *= decay
    return params[:, :dims], params[:, dims]
