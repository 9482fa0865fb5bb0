"""The operator's metrics and the step profile are two records: the CPU profile lives only in
StepProfile (issue 27), which a metrics log may carry beside each step's metrics."""

from __future__ import annotations

import dataclasses

import pytest

from p2ptrain.errors import WireError
from p2ptrain.records import MetricsReport, StepProfile, message_from_dict
from p2ptrain.records.profile import TREE_FIELDS
from tests.records.samples import metrics_dict, profile_dict


def test_the_operators_metrics_carry_no_cpu_profile() -> None:
    names = {f.name for f in dataclasses.fields(MetricsReport)}
    assert not {n for n in names if "cpu" in n} and "frames" not in names
    profile = {f.name for f in dataclasses.fields(StepProfile)}
    assert {"forward_cpu_s", "backward_cpu_s", "update_cpu_s", "frames", *TREE_FIELDS} <= profile
    # an older worker's metrics with CPU fields still decode: the fields are left behind
    old = MetricsReport.from_dict({**metrics_dict(), "averaging_cpu_s": 0.05, "frames": 8})
    assert "averaging_cpu_s" not in old.to_dict()


def test_a_profile_round_trips_and_dispatches_on_its_type() -> None:
    profile = message_from_dict(profile_dict())
    assert isinstance(profile, StepProfile) and profile.plan_key == (2, 5)
    assert StepProfile.from_dict(profile.to_dict()) == profile
    # the tree's clock may be unreadable (None); the thread's never is
    unread = StepProfile.from_dict({**profile_dict(), **dict.fromkeys(TREE_FIELDS)})
    assert unread.averaging_cpu_s is None and unread.frames == 8
    for bad in (
        {**profile_dict(), "forward_cpu_s": None},
        {**profile_dict(), "frames": -1},
        {**profile_dict(), "helpers_cpu_s": -0.5},
    ):
        with pytest.raises(WireError):
            StepProfile.from_dict(bad)
