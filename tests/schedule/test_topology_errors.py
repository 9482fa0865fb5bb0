import json
import subprocess
import sys
from pathlib import Path

import pytest

from p2ptrain.schedule import TopologyError, load_topology, scenario_path


def good_doc() -> dict:
    return {
        "format": "p2ptrain.topology/1",
        "peers": ["a", "b", "c", "d"],
        "delay_ms": [[0, 1, 2, 3], [1, 0, 1, 2], [2, 1, 0, 1], [3, 2, 1, 0]],
        "bandwidth_gbps": [[1, 1, 1, 1]] * 4,
        "workload": {"stages": 2, "replicas": 2, "c_dp_gb": 0.1, "c_pp_gb": 0.1},
    }


def broken(mutate) -> dict:  # type: ignore[no-untyped-def]
    doc = good_doc()
    mutate(doc)
    return doc


CASES = {
    "not square": (broken(lambda d: d["delay_ms"][1].append(5)), "not square"),
    "mismatched": (
        broken(lambda d: d.update(bandwidth_gbps=[[1] * 3] * 3)),
        "3x3 but there are 4 peers",
    ),
    "negative delay": (broken(lambda d: d["delay_ms"][0].__setitem__(1, -1)), "negative"),
    "nan delay": (broken(lambda d: d["delay_ms"][0].__setitem__(1, float("nan"))), "finite"),
    "zero bandwidth": (
        broken(lambda d: d["bandwidth_gbps"].__setitem__(0, [1, 0, 1, 1])),
        "must be > 0",
    ),
    "negative bandwidth": (
        broken(lambda d: d["bandwidth_gbps"].__setitem__(0, [1, -2, 1, 1])),
        "must be > 0",
    ),
    "nan bandwidth": (
        broken(lambda d: d["bandwidth_gbps"].__setitem__(0, [1, float("nan"), 1, 1])),
        "finite",
    ),
    "duplicate peers": (
        broken(lambda d: d.update(peers=["a", "b", "a", "d"])),
        "duplicate peer 'a'",
    ),
    "workload too big": (
        broken(lambda d: d["workload"].update(replicas=3)),
        "needs 2 stages x 3 replicas",
    ),
    "bad format": (broken(lambda d: d.update(format="other/2")), "format must be"),
    "missing field": (broken(lambda d: d.pop("delay_ms")), "missing field 'delay_ms'"),
    "string in matrix": (broken(lambda d: d["delay_ms"][0].__setitem__(1, "x")), "not a number"),
    # an OverflowError escaped for a JSON integer past any float
    "huge integer delay": (broken(lambda d: d["delay_ms"][0].__setitem__(1, 10**400)), "too large"),
    "huge integer workload": (broken(lambda d: d["workload"].update(c_dp_gb=10**400)), "too large"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_topology_is_one_clear_error(case: str, tmp_path: Path) -> None:
    doc, expected = CASES[case]
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(TopologyError, match=expected.replace("(", r"\(")):
        load_topology(path)


@pytest.mark.parametrize("text", ["[" * 100_000, '{"a":' * 100_000, "\udcff"])
def test_a_file_nested_past_the_stack_or_not_utf8_is_one_clear_error(
    text: str, tmp_path: Path
) -> None:
    path = tmp_path / "t.json"
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    with pytest.raises(TopologyError, match="not valid JSON"):  # was a RecursionError
        load_topology(path)


def test_values_near_the_floats_limit_do_not_overflow_when_averaged(tmp_path: Path) -> None:
    doc = good_doc()
    doc["delay_ms"][0][1] = doc["delay_ms"][1][0] = 1e308
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    assert load_topology(path).delay_ms[0, 1] == 1e308  # the sum was inf


def test_good_topology_loads(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps(good_doc()))
    assert load_topology(path).num_peers == 4


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "p2ptrain", "schedule", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_bad_input_exits_2_with_one_line(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps(CASES["negative delay"][0]))
    proc = run_cli("--topology", str(path))
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0
    assert "negative" in proc.stderr
    path.write_text("{not json")
    proc = run_cli("--topology", str(path))
    assert proc.returncode == 2 and "not valid JSON" in proc.stderr
    groups = tmp_path / "g.json"
    groups.write_text("[[0, 1], [1, 2]]")
    path.write_text(json.dumps(good_doc()))
    proc = run_cli("--topology", str(path), "--evaluate", str(groups))
    assert proc.returncode == 2 and "more than one group" in proc.stderr


def test_cli_json_contract() -> None:
    proc = run_cli("--topology", str(scenario_path("multi_datacenter")), "--json", "--seed", "1")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    for key in ("cost_s", "dp_cost_s", "pp_cost_s", "pipelines", "spares", "wall_s", "evaluations"):
        assert key in out
    assert len(out["pipelines"]) == 8 and all(len(p) == 8 for p in out["pipelines"])
    assert out["cost_s"] <= 16.0868 + 1e-4
    assert out["dp_cost_s"] + out["pp_cost_s"] == pytest.approx(out["cost_s"])


def test_the_other_readers_of_topology_files_refuse_deep_nesting(tmp_path: Path) -> None:
    """`schedule --groups` and the testbed's per-peer fields raised RecursionError."""
    from p2ptrain.cli.schedule_cmd import _read_groups
    from p2ptrain.errors import UserError
    from p2ptrain.testbed.topology_file import per_peer

    path = tmp_path / "t.json"
    path.write_text("[" * 100_000)
    with pytest.raises(UserError, match="not valid JSON"):
        _read_groups(path)
    assert per_peer(path, ["a"], "nat", "of peers", str) == {}  # load_topology says why


def test_a_directory_given_as_the_topology_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TopologyError, match="cannot read"):  # an IsADirectoryError traceback
        load_topology(tmp_path)
