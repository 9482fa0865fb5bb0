"""Where a stage trains (worker/device.py): device names, precision, the pipeline step on a
device and under autocast. The GPU tests skip where torch sees no CUDA GPU."""

from __future__ import annotations

import pytest
import torch

from p2ptrain.errors import UserError
from p2ptrain.records import Plan, RunSpec
from p2ptrain.train.model import build_model
from p2ptrain.worker.device import (
    FP32,
    Precision,
    cpu_threads,
    memory_bytes,
    precision_for,
    precision_note,
    resolve_device,
)
from p2ptrain.worker.pipeline import stage_step
from p2ptrain.worker.settings import WorkerSettings

SPEC = RunSpec().replace(
    stages=1,
    n_layer=2,
    n_head=2,
    n_embd=32,
    block_size=16,
    batch_size=4,
    micro_batches=2,
    compression="none",
)
ONE_STAGE = Plan.from_dict(
    {
        "term": 1,
        "epoch": 1,
        "planner": "a",
        "stages": 1,
        "pipelines": [["a"]],
        "spares": [],
        "data_addrs": {},
        "cost_s": 0.0,
    }
)
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here")


def test_auto_takes_the_best_device_here_and_cpu_is_always_there() -> None:
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    if expected == "cpu" and torch.backends.mps.is_available():
        expected = "mps"
    assert resolve_device("auto").type == expected
    assert resolve_device("cpu") == torch.device("cpu")
    assert precision_for(torch.device("cpu")) == Precision("cpu", None)
    assert memory_bytes(torch.device("cpu")) > 2**28


@pytest.mark.parametrize("name", ["gpu", "cuda:x", "cuda:1:2", "", "CPU"])
def test_a_device_name_that_is_none_is_refused(name: str) -> None:
    with pytest.raises(UserError, match="--device"):
        resolve_device(name)
    with pytest.raises(SystemExit):
        WorkerSettings.from_argv(["--ipc", "s", "--device", name])


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_a_gpu_asked_for_where_there_is_none_is_refused_with_a_reason() -> None:
    with pytest.raises(UserError, match="no CUDA GPU"):
        resolve_device("cuda:0")


def test_device_and_threads_travel_on_the_worker_command_line() -> None:
    settings = WorkerSettings(ipc="s", device="cuda:1", threads=0)
    assert WorkerSettings.from_argv(settings.to_argv()) == settings
    assert WorkerSettings(ipc="s").to_argv() == ["--ipc", "s"]  # auto, 1 thread: the defaults
    assert cpu_threads(3) == 3 and cpu_threads(0) >= 1


OLD_GPU_NOTE = "float16 if the run sets loss_scale, else fp32"


@pytest.mark.parametrize(
    ("capability", "plain", "scaled", "note"),
    [
        ((9, 0), torch.bfloat16, torch.bfloat16, "bfloat16"),  # Hopper
        ((8, 6), torch.bfloat16, torch.bfloat16, "bfloat16"),  # RTX 30xx
        ((7, 5), None, torch.float16, OLD_GPU_NOTE),  # T4, RTX 20xx
        ((7, 0), None, torch.float16, OLD_GPU_NOTE),  # V100
        ((6, 0), None, torch.float16, OLD_GPU_NOTE),  # P100
        ((6, 1), None, None, "fp32"),  # GTX 10xx: fp16 at 1/64 of fp32's rate
    ],
)
def test_a_gpu_without_bf16_arithmetic_computes_in_fp16_only_where_the_run_scales_its_loss(
    monkeypatch: pytest.MonkeyPatch,
    capability: tuple[int, int],
    plain: torch.dtype | None,
    scaled: torch.dtype | None,
    note: str,
) -> None:
    """torch's is_bf16_supported() says yes on a T4 (bf16 emulated: no faster than fp32, less
    precise); fp16 there underflows small gradients unless the run scales its loss. The GPU
    asked about is the node's own (cuda:1 here), not the first."""

    def capability_of(device: torch.device) -> tuple[int, int]:
        return capability if device == torch.device("cuda", 1) else (9, 0)

    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", capability_of)
    gpu = torch.device("cuda", 1)
    assert precision_for(gpu) == Precision("cuda", plain)
    assert precision_for(gpu, loss_scale=1024.0) == Precision("cuda", scaled)
    assert precision_note(gpu) == note
    assert precision_note(torch.device("cpu")) == "fp32"


@pytest.mark.parametrize(
    ("arch", "plain", "scaled"),
    [
        ("gfx90a:sramecc+:xnack-", torch.bfloat16, torch.bfloat16),  # MI200
        ("gfx942", torch.bfloat16, torch.bfloat16),  # MI300
        ("gfx1100", torch.bfloat16, torch.bfloat16),  # RX 7900
        ("gfx1030", None, torch.float16),  # RX 6800: no bf16
        ("gfx906", None, torch.float16),  # MI50
    ],
)
def test_on_rocm_bf16_is_judged_by_the_gpus_architecture(
    monkeypatch: pytest.MonkeyPatch, arch: str, plain: torch.dtype | None, scaled: torch.dtype
) -> None:
    """ROCm's torch says bf16 is supported on every AMD GPU, and reports an architecture, not
    a CUDA compute capability."""

    class Properties:
        gcnArchName = arch

    monkeypatch.setattr(torch.version, "hip", "6.2")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: Properties())
    gpu = torch.device("cuda", 0)
    assert precision_for(gpu) == Precision("cuda", plain)
    assert precision_for(gpu, loss_scale=1024.0) == Precision("cuda", scaled)


def _step(
    device: torch.device, precision: Precision, spec: RunSpec = SPEC
) -> tuple[float, torch.Tensor]:
    """One real pipeline step of the whole model as one stage; its loss and flat gradient."""
    role = ONE_STAGE.role_of("a")
    assert role is not None
    model = build_model(spec).to(device)
    corpus = torch.randint(
        0, spec.model.vocab_size, (4096,), generator=torch.Generator().manual_seed(1)
    )
    loss = stage_step.run_step(
        model, spec, role, None, corpus, 3, lambda: False, precision=precision
    )
    stage_step.unscale_grads(model, spec)
    assert loss is not None
    grads = torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])
    return loss, grads.cpu()


def test_a_step_under_bf16_autocast_stays_close_to_fp32() -> None:
    """CPU autocast to bf16 (what a GPU without fp32 speed runs): the passes really ran in bf16
    (the numbers differ) and the loss and gradient stay close to fp32's."""
    cpu = torch.device("cpu")
    loss, grads = _step(cpu, FP32)
    low_loss, low_grads = _step(cpu, Precision("cpu", torch.bfloat16))
    assert low_loss != loss
    assert low_loss == pytest.approx(loss, rel=2e-2)
    assert torch.isfinite(low_grads).all()
    cosine = float(low_grads @ grads / (low_grads.norm() * grads.norm()))
    assert cosine > 0.99


def test_a_loss_scale_is_divided_out_of_the_gradients_exactly() -> None:
    """loss_scale 1024 (for fp16 passes): the reported loss and the unscaled gradients are the
    unscaled run's (a power of two: exact in fp32)."""
    cpu = torch.device("cpu")
    loss, grads = _step(cpu, FP32)
    scaled_loss, scaled_grads = _step(cpu, FP32, SPEC.replace(loss_scale=1024.0))
    assert scaled_loss == loss
    torch.testing.assert_close(scaled_grads, grads, rtol=1e-6, atol=0)


@needs_cuda
def test_a_step_on_the_gpu_matches_the_cpu() -> None:
    gpu = resolve_device("cuda")
    loss, grads = _step(torch.device("cpu"), FP32)
    gpu_loss, gpu_grads = _step(gpu, precision_for(gpu))
    assert gpu_loss == pytest.approx(loss, rel=2e-2)
    cosine = float(gpu_grads @ grads / (gpu_grads.norm() * grads.norm()))
    assert cosine > 0.99
    assert precision_for(gpu).autocast == (
        torch.bfloat16 if torch.cuda.get_device_capability(gpu)[0] >= 8 else None
    )
    exact_loss, exact_grads = _step(gpu, Precision("cuda", None))  # fp32 on the GPU
    assert exact_loss == pytest.approx(loss, rel=1e-4)
    torch.testing.assert_close(exact_grads, grads, rtol=1e-3, atol=1e-5)


@needs_cuda
def test_fp16_passes_with_the_runs_loss_scale_match_the_cpu() -> None:
    """What a GPU without bf16 runs when the run sets loss_scale (checked on any GPU: fp16
    autocast is everywhere)."""
    gpu = resolve_device("cuda")
    scaled = SPEC.replace(loss_scale=1024.0)
    loss, grads = _step(torch.device("cpu"), FP32)
    half_loss, half_grads = _step(gpu, Precision("cuda", torch.float16), scaled)
    assert half_loss == pytest.approx(loss, rel=2e-2)
    assert torch.isfinite(half_grads).all()
    cosine = float(half_grads @ grads / (half_grads.norm() * grads.norm()))
    assert cosine > 0.99
