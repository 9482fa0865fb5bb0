"""Where a new plan's stage state comes from: the start step its members agree on
(start_step.py), adopting an earlier swarm's states (adopt.py), states assembled from other
layer ranges (covers.py), fetching a state from a member (state_transfer.py), loading it
(restore.py), and re-syncing diverged replicas (resync.py)."""
