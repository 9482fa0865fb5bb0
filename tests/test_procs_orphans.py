"""`p2ptrain local` adopts the orphans of its nodes (a SIGKILLed supervisor's worker, which
then saves on its own) and stops them as it stops the nodes: nothing of a run outlives it. Run in
a fresh interpreter: a subreaper's setting would make pytest's own process adopt orphans."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import processes_with

# the parent adopts; a middleman starts a grandchild (its own group, catching SIGTERM to exit 3
# seconds later: a worker's save) and one that ignores SIGTERM, then dies; a sibling it started
# itself is kept
ADOPTER = """
import json, pathlib, subprocess, sys, time
from p2ptrain import procs

MARK, READY = sys.argv[1], pathlib.Path(sys.argv[2])
GRANDCHILD = (
    "import pathlib, signal, sys, time\\n"
    "signal.signal(signal.SIGTERM, lambda *_: (time.sleep(1.0), sys.exit(0)))\\n"
    f"pathlib.Path({str(READY / 'saver')!r}).touch()\\n"
    "time.sleep(600)\\n"
)
STUBBORN = (
    "import pathlib, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    f"pathlib.Path({str(READY / 'stubborn')!r}).touch(); time.sleep(600)"
)
assert procs.adopt_orphans()
kept = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", MARK])
ours = set(procs.children())
middleman = subprocess.Popen([sys.executable, "-c", (
    "import subprocess, sys\\n"
    f"subprocess.Popen([sys.executable, '-c', {GRANDCHILD!r}, {MARK!r}], start_new_session=True)\\n"
    f"subprocess.Popen([sys.executable, '-c', {STUBBORN!r}, {MARK!r}], start_new_session=True)\\n"
)])
middleman.wait()
deadline = time.monotonic() + 10
while len(list(READY.iterdir())) < 2 and time.monotonic() < deadline:
    time.sleep(0.05)
found = []
started = time.monotonic()
stopped = procs.stop_orphans(ours, 2.0, found.append)
took = time.monotonic() - started
alive = kept.poll() is None
kept.kill()
kept.wait()
print(json.dumps({"stopped": stopped, "found": found, "took": took, "kept_alive": alive}))
"""


def test_orphans_handed_to_an_adopter_are_stopped_and_its_own_children_kept(
    tmp_path: Path,
) -> None:
    mark = f"p2ptrain-orphan-test-{tmp_path.name}"
    done = subprocess.run(
        [sys.executable, "-c", ADOPTER, mark, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(result["stopped"]) == 2 and result["found"] == [result["stopped"]]
    assert result["kept_alive"]  # what it started itself is its owner's to stop
    # the one saving got its second; the one ignoring SIGTERM was killed at the 2 s grace
    assert 1.9 < result["took"] < 30.0, result
    assert not processes_with(mark), "an orphan outlived its adopter"
