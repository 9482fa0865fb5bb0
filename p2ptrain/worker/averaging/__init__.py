"""Data-parallel averaging of one stage: verified gradient rounds in the plan's groups
(stage_averager.py, planned_group.py, checks.py), the robust all-reduce (robust.py,
robust_allreduce.py) and DiLoCo's outer rounds (outer_rounds.py)."""
