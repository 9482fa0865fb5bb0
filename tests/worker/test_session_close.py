"""A session's end (worker/session.py: close) releases what it held whatever happens: a save
that raised left the averager open and the gc frozen, and the ended session's optimizer moments
and step-back copy stayed alive while the next session was built beside them. In a subprocess:
the session imports hivemind, which this process must not (it imports libp2p)."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import json
from types import SimpleNamespace
import torch
from p2ptrain.worker import session as session_module
from p2ptrain.worker.replica_rounds import StageReplicas
from p2ptrain.worker.session import Session

session_module.close_rounds = lambda transport: None
closed = []
model = torch.nn.Linear(4, 4)
optimizer = torch.optim.AdamW(model.parameters())
model(torch.ones(1, 4)).sum().backward()
optimizer.step()

def failing_save(at_end=False):
    raise OSError(28, "No space left on device")

ended = Session.__new__(Session)
replicas = StageReplicas(averager=SimpleNamespace(close=lambda: closed.append("averager")))
ended.__dict__.update(
    transport=None, save=failing_save, model=model, optimizer=optimizer,
    replicas=replicas, corpus=object(), _previous=object(),
)
try:
    ended.close()
    raised = None
except OSError as exc:
    raised = exc.errno
print(json.dumps({
    "raised": raised, "closed": closed, "moments": len(optimizer.state),
    "held": [name for name in ("model", "corpus", "_previous") if getattr(ended, name) is not None]
            + [name for name in ("averager", "outer") if getattr(replicas, name) is not None],
}))
"""


def test_a_session_that_fails_to_save_still_lets_go_of_what_it_held() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=120
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"raised": 28, "closed": ["averager"], "moments": 0, "held": []}
