"""path_caps groups the path-limited samples by bin and reporter (linear in the samples, not two
N x N masks per bin and reporter): the same caps as the plain definition, kept here."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest

from p2ptrain.control.estimate.matrix import (
    MIN_PATH_SAMPLES,
    PATH_BIN_EDGES_MS,
    PATH_LIMITED_SHARE,
    path_caps,
)


def reference_caps(
    rtts: npt.NDArray[np.float64],
    rates: npt.NDArray[np.float64],
    measured_rates: npt.NDArray[np.float64],
    measured: npt.NDArray[np.bool_],
    reporters: npt.NDArray[np.int_] | None = None,
) -> npt.NDArray[np.float64]:
    """The definition, mask by mask (the implementation before the grouping)."""
    if reporters is None:
        reporters = np.arange(rtts.size).reshape(rtts.shape)
    limited = measured & (measured_rates < PATH_LIMITED_SHARE * np.nan_to_num(rates, nan=0.0))
    bins = np.digitize(rtts, PATH_BIN_EDGES_MS)
    caps = np.full(rtts.shape, np.inf)
    for b in np.unique(bins[limited]):
        in_bin = limited & (bins == b)
        voices = [
            float(np.median(measured_rates[in_bin & (reporters == who)]))
            for who in np.unique(reporters[in_bin])
        ]
        if len(voices) >= MIN_PATH_SAMPLES:
            caps[bins == b] = float(np.median(voices))
    return caps


def random_inputs(
    seed: int, n: int, num_reporters: int, share_measured: float, symmetric: bool
) -> tuple[npt.NDArray[np.float64], ...]:
    rng = np.random.default_rng(seed)
    rtts = rng.uniform(0.2, 3000.0, (n, n))
    rates = rng.uniform(1.0, 200.0, (n, n))
    measured_rates = rng.uniform(0.1, 150.0, (n, n))
    measured = rng.random((n, n)) < share_measured
    reporters = rng.integers(-1, num_reporters, (n, n))
    rtts[rng.random((n, n)) < 0.05] = np.nan  # an end without a coordinate
    rates[rng.random((n, n)) < 0.1] = np.nan  # a capacity never seen
    measured_rates[~measured] = np.nan
    if symmetric:  # as build_estimated makes them
        upper = np.triu(np.ones((n, n), dtype=bool), k=1)
        for m in (rtts, rates, measured_rates, measured, reporters):
            m[~upper] = m.T[~upper]
    return rtts, rates, measured_rates, measured, reporters


@pytest.mark.parametrize("seed", range(12))
def test_grouped_caps_equal_the_definition_on_random_inputs(seed: int) -> None:
    rng = np.random.default_rng(1000 + seed)
    n = int(rng.integers(2, 60))
    num_reporters = int(rng.integers(1, 12))
    share = float(rng.choice([0.02, 0.2, 0.6]))
    rtts, rates, measured_rates, measured, reporters = random_inputs(
        seed, n, num_reporters, share, symmetric=bool(seed % 2)
    )
    for who in (reporters, None):  # per reporter, and every sample its own voice
        got = path_caps(rtts, rates, measured_rates, measured, who)
        expected = reference_caps(rtts, rates, measured_rates, measured, who)
        assert got.shape == expected.shape and np.array_equal(got, expected)


def test_the_random_inputs_do_cap_pairs() -> None:
    """The comparison above means something: such inputs cap pairs in several bins."""
    rtts, rates, measured_rates, measured, reporters = random_inputs(3, 50, 8, 0.6, True)
    caps = path_caps(rtts, rates, measured_rates, measured, reporters)
    assert len(np.unique(caps[np.isfinite(caps)])) >= 3


def test_no_limited_sample_caps_nothing() -> None:
    rtts, rates, measured_rates, measured, reporters = random_inputs(7, 20, 4, 0.5, True)
    none = np.zeros_like(measured)
    assert np.isinf(path_caps(rtts, rates, measured_rates, none, reporters)).all()
    assert np.array_equal(
        path_caps(rtts, rates, measured_rates, none, reporters),
        reference_caps(rtts, rates, measured_rates, none, reporters),
    )
