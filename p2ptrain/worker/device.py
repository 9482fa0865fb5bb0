"""Where a worker's stage trains: the device, its memory, and the precision it computes in.

`--device auto` takes the best the machine has: the first CUDA GPU, else Apple's MPS, else the
CPU. On a GPU with bf16 arithmetic (compute capability 8.0 and later: Ampere, Ada, Hopper;
AMD's MI100 and later, RDNA 3) the passes run under autocast in bf16. An older GPU (Turing's T4
and RTX 20xx, Volta, the P100) has none: torch's `is_bf16_supported()` still says yes there, by
emulation, no faster than fp32 and less precise. There the passes run in fp16 if the run scales
its loss (`loss_scale` > 1, else fp16 gradients underflow), else in fp32; on a GTX 10xx (slow
fp16) in fp32. Weights, gradients, optimizer state and everything
that leaves the device (frames, averaging, checkpoints) stay fp32. On the CPU everything is
fp32, on as many threads as the node is given.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from p2ptrain.errors import UserError
from p2ptrain.worker.settings import DEVICE_PATTERN

AUTO = "auto"


def check_device_name(name: str) -> str:
    """`name` if it is one `--device` accepts (auto, cpu, mps, cuda, cuda:I), else UserError."""
    if not DEVICE_PATTERN.fullmatch(name):
        raise UserError(f"--device must be auto, cpu, mps, cuda or cuda:I, got {name!r}")
    return name


def resolve_device(name: str) -> torch.device:
    """The device `name` means on this machine; UserError if it is not here."""
    check_device_name(name)
    if name == AUTO:
        if torch.cuda.is_available():
            return torch.device("cuda", 0)
        if _mps_available():
            return torch.device("mps")
        return torch.device("cpu")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UserError(f"--device {name}: this machine has no CUDA GPU torch can use")
        index = 0 if device.index is None else device.index
        if index >= torch.cuda.device_count():
            raise UserError(f"--device {name}: only {torch.cuda.device_count()} CUDA GPU(s) here")
        return torch.device("cuda", index)
    if device.type == "mps" and not _mps_available():
        raise UserError("--device mps: this machine has no MPS device torch can use")
    return device


def device_problem(name: str) -> str | None:
    """Why `--device name` cannot train here, or None: `python -m p2ptrain.worker.device NAME`
    prints it, so that `join` refuses before the node joins (node/supervisor.py), without torch
    in the supervisor's memory for the whole run."""
    try:
        resolve_device(name)
    except UserError as exc:
        return str(exc)
    return None


def _mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


@dataclass(frozen=True)
class Precision:
    """The dtype the passes autocast to on `device_type`; None: plain fp32."""

    device_type: str = "cpu"
    autocast: torch.dtype | None = None

    @contextlib.contextmanager
    def passes(self) -> Iterator[None]:
        """The context a forward pass runs in (backward follows the forward's dtypes)."""
        if self.autocast is None:
            yield
            return
        with torch.autocast(self.device_type, dtype=self.autocast):
            yield

    @property
    def name(self) -> str:
        return "fp32" if self.autocast is None else str(self.autocast).removeprefix("torch.")


FP32 = Precision()


BF16_CAPABILITY = (8, 0)  # the first CUDA compute capability with bf16 arithmetic (Ampere)
# fp16 at full rate or better: Volta on, and the P100 (6.0); Pascal's other parts (6.1, 6.2:
# the GTX 10xx) compute fp16 at 1/64 of fp32's rate
FP16_CAPABILITY, P100 = (7, 0), (6, 0)
# AMD GPUs with bf16 matrix instructions (CDNA 1-3: MI100, MI200, MI300; RDNA 3 and 4); older
# ones (MI50, RDNA 1-2) have none, and torch's is_bf16_supported() says yes there as well
ROCM_BF16_ARCHS = ("gfx908", "gfx90a", "gfx94", "gfx95", "gfx11", "gfx12")


def precision_for(device: torch.device, loss_scale: float = 1.0) -> Precision:
    """bf16 autocast on a GPU with bf16 arithmetic; on an older GPU fp16 where the run scales
    its loss (`loss_scale` > 1) and the GPU computes fp16 at full rate, else fp32; fp32 off
    the GPU."""
    if device.type != "cuda":
        return Precision(device.type, None)
    if torch.version.hip:  # ROCm's GPUs are "cuda" devices to torch
        arch = str(getattr(torch.cuda.get_device_properties(device), "gcnArchName", ""))
        bf16, fast_fp16 = arch.startswith(ROCM_BF16_ARCHS), True
    else:
        capability = torch.cuda.get_device_capability(device)
        bf16 = capability >= BF16_CAPABILITY
        fast_fp16 = capability >= FP16_CAPABILITY or capability == P100
    if bf16:
        return Precision("cuda", torch.bfloat16)
    return Precision("cuda", torch.float16 if loss_scale > 1.0 and fast_fp16 else None)


def precision_note(device: torch.device) -> str:
    """What `device` computes the passes in, before the run (and its `loss_scale`) is known."""
    scaled, plain = precision_for(device, 2.0).name, precision_for(device).name
    return plain if scaled == plain else f"{scaled} if the run sets loss_scale, else {plain}"


def memory_bytes(device: torch.device) -> int:
    """The memory a stage on `device` may use: the GPU's own, or the machine's (CPU, MPS)."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    if device.type == "mps":
        recommended = getattr(torch.mps, "recommended_max_memory", None)
        if recommended is not None:
            return int(recommended())
    return system_memory_bytes()


def system_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX: unknown
        return 0


def cpu_threads(requested: int) -> int:
    """The torch threads to use: `requested`, or (0) every core this process may run on."""
    if requested > 0:
        return requested
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def sync(device: torch.device) -> None:
    """Wait for the device's queued kernels (a clock read after this is the real time)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


if __name__ == "__main__":
    if (problem := device_problem(sys.argv[1])) is not None:
        print(problem)
        sys.exit(2)
