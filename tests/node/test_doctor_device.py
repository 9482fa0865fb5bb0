"""`p2ptrain doctor`'s device line (node/doctor.py): where `join --device` would train and in
what precision under the run it asked the bootstrap for, from the daemon check's child
(worker/daemon_check.py: device_facts); a device that is not here FAILs with a fix."""

from __future__ import annotations

import pytest
import torch

from p2ptrain.node.doctor import device_check, finish_daemon_check, run_precision
from p2ptrain.records import DeviceFacts
from p2ptrain.worker.daemon_check import device_facts

T4 = DeviceFacts("cuda Tesla T4", 15 * 2**30, "fp32", "float16")
H200 = DeviceFacts("cuda NVIDIA H200", 140 * 2**30, "bfloat16", "bfloat16")


def test_the_line_names_the_device_and_the_runs_precision() -> None:
    assert device_check(H200, 1.0, False).line() == (
        "ok   device cuda NVIDIA H200 (140 GiB): passes in bfloat16"
    )
    # an older GPU: fp16 only where the run scales its loss
    assert device_check(T4, 1.0, False).text.endswith("passes in fp32")
    assert device_check(T4, 1024.0, False).text.endswith("passes in float16")
    assert device_check(T4, None, False).text.endswith(
        "passes in fp32 (float16 if the run sets loss_scale)"  # the run spec did not arrive
    )
    assert run_precision(T4, 1024.0) == "float16"


def test_a_device_not_here_fails_and_no_worker_means_no_check() -> None:
    missing = DeviceFacts(error="--device cuda: this machine has no CUDA GPU torch can use")
    check = device_check(missing, 1.0, False)
    assert check.status == "FAIL" and "no CUDA GPU" in check.text and "--device auto" in check.fix
    assert device_check(T4, 1.0, True).status == "skip"  # --control-only: no worker
    assert device_check(None, 1.0, False).status == "skip"  # the child said nothing
    no_torch = DeviceFacts(error="the train extra is not installed (torch missing)")
    assert device_check(no_torch, 1.0, False).status == "skip"  # the daemon's line FAILs


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
def test_the_child_reports_this_machines_cpu_or_why_a_device_is_not_here() -> None:
    cpu = device_facts("cpu")
    assert cpu["name"] == "cpu" and cpu["precision"] == cpu["precision_scaled"] == "fp32"
    assert "no CUDA GPU" in device_facts("cuda")["error"]
    assert "auto, cpu, mps, cuda or cuda:I" in device_facts("gpu")["error"]


@pytest.mark.parametrize(
    "output",
    [
        b"[1]",
        b'{"ok": true, "addrs": {"a": 1}}',
        b'{"ok": false, "error": 5}',
        b"[" * 100_000,
        b'{"ok": true, "device": {"memory_bytes": "x"}}',
        b'{"ok": true, "device": {"memory_bytes": 1e400}}',
        b"",
    ],
)
def test_a_child_s_reply_that_does_not_decode_is_a_failed_check(output: bytes) -> None:
    check, device = finish_daemon_check(_Said(output))  # type: ignore[arg-type]
    assert check.status == "FAIL" and "exit code 1" in check.text and device is None


class _Said:
    """A finished child process that printed `output`."""

    returncode = 1

    def __init__(self, output: bytes) -> None:
        self.output = output

    def communicate(self, timeout: float) -> tuple[bytes, bytes]:
        return self.output, b""
