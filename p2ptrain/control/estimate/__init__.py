"""Estimated links for a swarm too big to measure every pair: network coordinates for round
trips, access capacities for rates, a bounded neighbour set to measure, and the planner's matrix
that marks what is measured and what is estimated. Pure (numpy only): the live node and the
simulator of `p2ptrain bench control` share it."""
