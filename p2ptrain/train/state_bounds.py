"""How large a saved state of a stage may be, from the run spec alone: the bounds a state
fetched from a peer is held to (worker/resume/state_transfer.py), its tensors (which bound its
header: train/state_file.py) and its bytes.
"""

from __future__ import annotations

import torch

from p2ptrain.records.run import RunSpec
from p2ptrain.train import state_file
from p2ptrain.train.model import Stage

STATE_MARGIN = 1.25  # a saved state over its tensors' bytes: its header, alignment
STATE_OVERHEAD_BYTES = 4 * 1024**2


def expected_state_tensors(spec: RunSpec, layers: range) -> int:
    """The most tensors a saved state of `layers` holds (a fetched state's header is bounded by
    it: train/state_file.py, `max_header_bytes`)."""
    with torch.device("meta"):
        stage = Stage(spec.model_config(), layers, spec.optim.seed)
    return state_file.max_state_tensors(len(stage.state_dict()))


def expected_state_bytes(spec: RunSpec, layers: range) -> int:
    """An upper bound on the size of a saved state of `layers`: the weights and AdamW's two
    moments (under diloco also the anchor and outer momentum), with a margin for the file's
    structure (what state transfer accepts at most)."""
    with torch.device("meta"):  # shapes only: no memory, no init
        stage = Stage(spec.model_config(), layers, spec.optim.seed)
    weights = sum(t.numel() * t.element_size() for t in stage.state_dict().values())
    copies = 5 if spec.optim.sync == "diloco" else 3
    return int(copies * weights * STATE_MARGIN) + STATE_OVERHEAD_BYTES
