"""Runs a hivemind probe script in its own process (hivemind is not imported beside libp2p):
its one JSON result line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any


def run_probe(probe: Path, case: str, timeout_s: float = 150) -> dict[str, Any]:
    """`python PROBE CASE`: it must exit 0; the last line of its stdout, as JSON."""
    done = subprocess.run(
        [sys.executable, str(probe), case], capture_output=True, text=True, timeout=timeout_s
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result
