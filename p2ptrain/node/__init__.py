"""The node supervisor: one control process (+ one worker process), started and stopped together."""
