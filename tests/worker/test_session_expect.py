"""A frame that arrives while the current session failed to agree on a start (it is the
worker's current session for a moment) is refused like any unexpected frame: the session had
no start step yet, and the handler's AttributeError closed the stream without an answer. In a
subprocess: the session imports hivemind, which this process must not (it imports libp2p)."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import json
from types import SimpleNamespace
import torch
from p2ptrain.worker.pipeline import frames
from p2ptrain.worker.session import Session

header = frames.header_for(torch.zeros(2, 2).half(), frames.ACTIVATION, "run", (1, 0), 5, 0, "p")
failed = SimpleNamespace(role=SimpleNamespace(stage=1), start_step=None)  # no start agreed
print(json.dumps({"expected": Session.expect(failed, header)}))
"""


def test_a_session_without_a_start_expects_no_frame() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=120
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"expected": None}
