"""`p2ptrain local --device`: a name it does not know, or a device that is not here, is refused
before anything starts, and the direct workers are started on it. (Through the control plane,
every node's `join --device`: the integration tests that compare with the CPU reference pass
`--device cpu`, and on a GPU machine fail without it.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from p2ptrain.app import main
from p2ptrain.harness.direct_swarm import LocalSwarm
from p2ptrain.records import RunSpec


def test_an_unknown_device_name_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["local", "--device", "gpu"])
    assert exited.value.code == 2
    assert "auto, cpu, mps, cuda or cuda:I, got 'gpu'" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
def test_a_missing_gpu_is_refused_before_any_node_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workdir = tmp_path / "run"
    assert main(["local", "--device", "cuda", "--workdir", str(workdir)]) == 2
    assert "--device cuda: this machine has no CUDA GPU" in capsys.readouterr().err
    assert not workdir.exists()  # nothing was started, not even its work directory


def test_direct_workers_are_started_on_the_device_given(tmp_path: Path) -> None:
    swarm = LocalSwarm(RunSpec(), 2, tmp_path, device="cpu")
    started: list[list[str]] = []
    swarm.spawn = lambda index, argv, env: started.append(argv)  # type: ignore[method-assign]
    swarm._start_worker(0, str(tmp_path / "ipc.sock"))
    argv = started[0]
    assert argv[argv.index("--device") + 1] == "cpu"
