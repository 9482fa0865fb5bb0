"""A run that pins its data (`data_sha256`): a peer whose corpus differs is refused before it
trains a step, in one line naming both digests, while a peer with the run's data trains. The
run names a relative path, so each node reads the corpus in its own working directory, as on
machines of their own."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import pytest

from tests.conftest import ProcessReaper
from tests.integration.test_admission import start_bootstrap, start_trainer

pytestmark = pytest.mark.integration

GOOD = b"the run's own corpus: every peer must train on these bytes. " * 40
OTHER = b"another corpus that a peer happens to hold under the same name. " * 40


def _steps(metrics: Path) -> list[int]:
    if not metrics.exists():
        return []
    lines = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    return [m["step"] for m in lines if m.get("type") == "metrics"]


def test_a_peer_with_other_data_is_refused_naming_both_digests(
    reaper: ProcessReaper, tmp_path: Path
) -> None:
    digest = hashlib.sha256(GOOD).hexdigest()  # = `p2ptrain digest` of a one-file text corpus
    run = tmp_path / "run.toml"
    run.write_text(
        f'[run]\nrun_id = "pinned"\ndata = "corpus.txt"\ndata_sha256 = "{digest}"\n'
        "stages = 1\nn_layer = 1\nn_head = 2\nn_embd = 32\nblock_size = 16\nbatch_size = 4\n"
        "steps = 6\ncompute_aware = false\n"
    )
    boot_addr = start_bootstrap(reaper, tmp_path, "--run", str(run))
    nodes = {}
    for name, corpus in (("good", GOOD), ("other", OTHER)):
        home = tmp_path / name
        home.mkdir()
        (home / "corpus.txt").write_bytes(corpus)
        nodes[name] = start_trainer(reaper, tmp_path, boot_addr, home)
    refused = nodes["other"]
    deadline = time.monotonic() + 180
    while refused.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    log = (tmp_path / "other" / "node.log").read_text()
    assert refused.poll() is not None, "the peer with other data still runs"
    other_digest = hashlib.sha256(OTHER).hexdigest()
    lines = [line for line in log.splitlines() if "is not the run's" in line]
    assert lines and digest in lines[0] and other_digest in lines[0], log[-3000:]
    assert _steps(tmp_path / "other" / "metrics.jsonl") == []  # not one step trained
    # the peer holding the run's data trains the run alone
    while len(set(_steps(tmp_path / "good" / "metrics.jsonl"))) < 6 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert set(_steps(tmp_path / "good" / "metrics.jsonl")) == set(range(6))
