"""The elected planner's work: when the swarm gets a new plan (plan_maker.py), whether the swarm
is ready for one (readiness.py), the measured matrices and the placement search (planner.py, run
in a child process: search_process.py), and what peers' compute says about it (compute.py)."""
