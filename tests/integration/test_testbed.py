"""The WAN testbed for real: namespaces, the forwarder, measured links, faults and teardown (root)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from p2ptrain.testbed import LinkSpec, Testbed, TestbedHandle, cleanup_stale
from p2ptrain.testbed.netns import list_netns
from tests.conftest import REPO_ROOT

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="the testbed needs root (namespaces, TUN)"),
]

PROBE = [sys.executable, "-m", "p2ptrain.harness.link_probe"]


def symmetric_links(delay_ms: dict[tuple[int, int], float], rate_mbps: float) -> dict:
    links = {}
    for (a, b), delay in delay_ms.items():
        links[(a, b)] = links[(b, a)] = LinkSpec(delay_ms=delay, rate_mbps=rate_mbps)
    return links


@pytest.fixture
def bed() -> Iterator[Testbed]:
    with Testbed(symmetric_links({(0, 1): 20.0, (0, 2): 5.0, (1, 2): 40.0}, 20.0)) as testbed:
        yield testbed
    assert not [ns for ns in list_netns() if ns.startswith(f"p2tb{testbed.id}")]


def start_probe_server(bed: TestbedHandle, peer: int) -> int:
    server = bed.spawn(peer, [*PROBE, "serve", bed.address(peer)], stdout=subprocess.PIPE)
    assert server.stdout is not None
    return int(json.loads(server.stdout.readline())["port"])


def probe(bed: TestbedHandle, peer: int, *args: str) -> dict:
    done = bed.run(peer, [*PROBE, *args], timeout_s=60)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def test_links_have_the_configured_rtt_and_rate(bed: Testbed) -> None:
    port = start_probe_server(bed, 1)
    rtt = probe(bed, 0, "rtt", bed.address(1), str(port), "--count", "10")
    assert abs(rtt["rtt_ms"] - 40.0) <= 4.0
    assert rtt["rtt_min_ms"] >= 40.0  # never faster than the configured delay
    capacity = probe(bed, 0, "blast", bed.address(1), str(port), "--mbps", "20", "--seconds", "1")
    assert capacity["mbps"] == pytest.approx(20.0, rel=0.1)
    # The other pairs have their own delays: all traffic goes through the forwarder.
    port2 = start_probe_server(bed, 2)
    # (never below the configured delay; the user-space forwarder adds a little under load).
    # The fastest ping of each: the link's delay, whatever a stall of this (virtual) host adds
    # (a stall over two of three pings in CI put an 80 ms link's median at 88.5 ms)
    rtt2 = probe(bed, 0, "rtt", bed.address(2), str(port2), "--count", "5")["rtt_min_ms"]
    assert 10.0 * 0.95 <= rtt2 <= 10.0 * 1.3, rtt2
    assert probe(bed, 1, "rtt", bed.address(2), str(port2), "--count", "3")["rtt_min_ms"] == (
        pytest.approx(80.0, rel=0.1)
    )


def test_link_faults_apply_at_runtime_and_restore(bed: Testbed) -> None:
    port = start_probe_server(bed, 1)

    def rtt_ms() -> float:
        # the fastest of 3, as above (a 65 ms link's median was 75.5 ms in that CI run)
        return float(probe(bed, 0, "rtt", bed.address(1), str(port), "--count", "3")["rtt_min_ms"])

    bed.set_link(0, 1, delay_ms=60.0)
    assert rtt_ms() == pytest.approx(120.0, rel=0.1)
    bed.set_link(0, 1, delay_ms=5.0, both_ways=False)  # 5 out, 60 back
    assert rtt_ms() == pytest.approx(65.0, rel=0.1)
    bed.cut_link(0, 1)
    assert probe(bed, 0, "rtt", bed.address(1), str(port), "--count", "1")["lost"] == 1
    bed.restore_link(0, 1)
    assert rtt_ms() == pytest.approx(40.0, rel=0.1)
    bed.disconnect(1)
    assert all(not spec.up for (a, b), spec in bed.links().items() if 1 in (a, b))
    assert all(spec.up for (a, b), spec in bed.links().items() if 1 not in (a, b))
    assert probe(bed, 0, "rtt", bed.address(1), str(port), "--count", "1")["lost"] == 1
    bed.reconnect(1)
    assert rtt_ms() == pytest.approx(40.0, rel=0.1)
    stats = bed.stats()
    assert stats[(0, 1)]["dropped"] >= 2 and stats[(0, 1)]["packets"] > 0


def process_state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_peer_faults_freeze_thaw_kill(bed: Testbed) -> None:
    sleeper = bed.spawn(2, ["sleep", "60"])
    time.sleep(0.3)
    assert bed.freeze(2) >= 1
    time.sleep(0.1)
    assert process_state(sleeper.pid) == "T"
    assert bed.thaw(2) >= 1
    time.sleep(0.1)
    assert process_state(sleeper.pid) in "SR"
    assert bed.kill(2) >= 1
    assert sleeper.wait(timeout=5) == -signal.SIGKILL


def test_failure_inside_the_testbed_tears_everything_down() -> None:
    before = set(list_netns())
    with contextlib.suppress(RuntimeError), Testbed(symmetric_links({(0, 1): 1.0}, 10.0)) as bed:
        sleeper = bed.spawn(0, ["sleep", "60"])
        assert len(set(list_netns()) - before) == 2
        raise RuntimeError("boom")
    assert set(list_netns()) == before
    assert sleeper.poll() is not None
    assert not Path(bed.state["control"]).exists()
    assert not list(Path("/sys/class/net").glob(f"p2tb{bed.id}*"))


def test_a_killed_owner_leaves_nothing_that_cleanup_does_not_remove() -> None:
    script = (
        "import time\nfrom p2ptrain.testbed import Testbed, LinkSpec\n"
        "s = LinkSpec(delay_ms=1.0, rate_mbps=10.0)\n"
        "bed = Testbed({(0, 1): s, (1, 0): s}); bed.start()\n"
        "print(bed.id, flush=True); time.sleep(60)\n"
    )
    owner = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        start_new_session=True,
        cwd=REPO_ROOT,
    )
    try:
        assert owner.stdout is not None
        testbed_id = owner.stdout.readline().decode().strip()
        assert testbed_id
        os.killpg(owner.pid, signal.SIGKILL)
        owner.wait()
        # The forwarder sees its stdin close and exits: its TUN devices vanish with it.
        deadline = time.monotonic() + 5
        while (
            list(Path("/sys/class/net").glob(f"p2tb{testbed_id}*")) and time.monotonic() < deadline
        ):
            time.sleep(0.05)
        assert not list(Path("/sys/class/net").glob(f"p2tb{testbed_id}*"))
        removed = cleanup_stale()
        assert sorted(removed) == [f"p2tb{testbed_id}-0", f"p2tb{testbed_id}-1"]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(owner.pid, signal.SIGKILL)
        owner.wait()
        cleanup_stale()


@pytest.mark.slow  # a bench's CLI (CI time); the links it measures are tested above
def test_bench_netem_cli_json() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "p2ptrain",
            "bench",
            "netem",
            "--peers",
            "3",
            "--links",
            "2",
            "--seconds",
            "1",
            "--json",
            "--out",
            "/tmp/p2ptrain-test-netem.json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(result["links"]) == 2 and result["pass"]
    for row in result["links"]:
        assert {
            "a",
            "b",
            "rtt_ms_configured",
            "rtt_ms_measured",
            "mbps_configured",
            "mbps_measured",
        } <= set(row)
