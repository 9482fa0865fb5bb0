"""The pipeline between stages: one stage's training step (stage_step.py), the tensor frames it
sends and receives (frames.py, frame_inbox.py) over p2pd streams (transport.py), and how long
it waits on a link (link_bounds.py)."""
