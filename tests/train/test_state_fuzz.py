"""Fuzzing the readers of a stage-state file (format /3): mutated bytes, a mutated safetensors
header (the tensors' entries), mutated metadata and swapped tensors. state_file's check,
check_whole and read give the file's metadata or dict, or WireError; checkpoint_read.read_state
a validated state or UserError; other_run a reason or None, never an exception."""

from __future__ import annotations

import json
import random
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import safetensors.torch
import torch

from p2ptrain.errors import UserError, WireError
from p2ptrain.records.run import RunSpec
from p2ptrain.records.stage_state import StateMeta
from p2ptrain.train import state_file
from p2ptrain.train.checkpoint import save_stage
from p2ptrain.train.checkpoint_read import other_run, read_state
from p2ptrain.train.model import build_stage
from p2ptrain.train.optim import make_optimizer
from tests.records.test_fuzz import _mutate, assert_no_slip

SPEC = RunSpec().replace(n_layer=2, n_head=2, n_embd=16, block_size=8, steps=10, weight_decay=0.1)
NUM_CASES = 200
DTYPES = [torch.float16, torch.int64, torch.bool, torch.uint8, torch.float64, torch.complex64]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    model = build_stage(SPEC, 1, 2)
    optimizer = make_optimizer(model, SPEC)
    torch.manual_seed(0)
    model(torch.randn(2, 8, 16)).float().pow(2).mean().backward()
    optimizer.step()
    path = tmp_path_factory.mktemp("state") / "stage-L1-2.step3.pt"
    save_stage(path, SPEC, model, optimizer, step=3)
    return path.read_bytes()


def _parts(raw: bytes) -> tuple[dict[str, Any], bytes]:
    (length,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + length]), raw[8 + length :]


def _joined(header: object, body: bytes) -> bytes | None:
    try:
        text = json.dumps(header).encode()
    except (ValueError, RecursionError):
        return None
    return struct.pack("<Q", len(text)) + text + body


def _bytes_mutated(rng: random.Random, raw: bytes) -> bytes | None:
    (length,) = struct.unpack("<Q", raw[:8])
    data = bytearray(raw)
    for _ in range(rng.randint(1, 4)):
        at = min(rng.randrange(len(data) if rng.random() < 0.3 else 8 + length), len(data) - 1)
        roll = rng.random()
        if roll < 0.5:
            data[at] = rng.randrange(256)
        elif roll < 0.8:
            del data[at : at + rng.randint(1, 64)]
        else:
            del data[at:]
    return bytes(data)


def _header_mutated(rng: random.Random, raw: bytes) -> bytes | None:
    header, body = _parts(raw)
    metadata = header.pop("__metadata__")
    mutated = _mutate(rng, header)
    if isinstance(mutated, dict):
        mutated["__metadata__"] = metadata
    return _joined(mutated, body)


def _metadata_mutated(rng: random.Random, raw: bytes) -> bytes | None:
    header, body = _parts(raw)
    (key, text), *_ = header["__metadata__"].items()
    try:
        header["__metadata__"] = {key: json.dumps(_mutate(rng, json.loads(text)))}
    except (ValueError, RecursionError):
        return None
    return _joined(header, body)


def _tensors_swapped(rng: random.Random, raw: bytes) -> bytes | None:
    header, _ = _parts(raw)
    tensors = safetensors.torch.load(raw)
    name = rng.choice(sorted(tensors))
    roll = rng.random()
    if roll < 0.25:
        tensors[name] = tensors[name].to(rng.choice(DTYPES))
    elif roll < 0.5:
        value = rng.choice([float("nan"), float("inf"), -1.0, 1e38])
        tensors[name] = torch.full_like(tensors[name], value)
    elif roll < 0.7:
        tensors[name] = tensors[name].reshape(-1)[: max(0, tensors[name].numel() - 1)]
    elif roll < 0.85:
        tensors[rng.choice([name + "x", "optim/99/exp_avg", "optim/٣/exp_avg"])] = tensors[
            name
        ].clone()
    else:
        del tensors[name]
    steps = [n for n in tensors if n.endswith("/step")]
    if steps and rng.random() < 0.3:
        value = rng.choice([-1.0, 1.5, float("nan"), 1e30])
        tensors[rng.choice(steps)] = torch.tensor(value)
    tensors = {n: t.contiguous() for n, t in tensors.items()}
    return safetensors.torch.save(tensors, metadata=header["__metadata__"])


def _outcome(error: type[Exception], read: Callable[..., object], *args: Any) -> object:
    """What `read(*args)` gave, or None for `error` (its only other outcome)."""
    try:
        return read(*args)
    except error as exc:
        assert str(exc)
        if isinstance(exc, WireError):
            assert_no_slip(exc)
        return None


MUTATIONS = [_bytes_mutated, _header_mutated, _metadata_mutated, _tensors_swapped]


@pytest.mark.parametrize("mutation", MUTATIONS, ids=[m.__name__ for m in MUTATIONS])
def test_a_mutated_state_file_is_read_or_refused_with_the_one_error(
    tmp_path: Path, saved: bytes, mutation: Callable[[random.Random, bytes], bytes | None]
) -> None:
    rng = random.Random(len(mutation.__name__))
    num_refused = 0
    for index in range(NUM_CASES):
        data = mutation(rng, saved)
        if data is None:
            continue
        path = tmp_path / f"stage-L1-2.step{index}.pt"  # a new name: other_run remembers files
        path.write_bytes(data)
        meta = _outcome(WireError, state_file.check, path, 100)
        assert meta is None or isinstance(meta, StateMeta)
        whole = _outcome(WireError, state_file.check_whole, path)
        assert whole is None or isinstance(whole, StateMeta)
        state = _outcome(WireError, state_file.read, path)
        assert state is None or isinstance(state, dict)
        if _outcome(UserError, read_state, path, SPEC, range(1, 2)) is None:
            num_refused += 1
        problem = other_run(path, SPEC)
        assert problem is None or isinstance(problem, str)
    assert num_refused > 0


def test_the_saved_state_itself_is_read(tmp_path: Path, saved: bytes) -> None:
    path = tmp_path / "stage-L1-2.step3.pt"
    path.write_bytes(saved)
    assert state_file.check_whole(path).step == 3
    assert read_state(path, SPEC, range(1, 2))["step"] == 3
    assert other_run(path, SPEC) is None


@pytest.mark.parametrize("digits", ["٣", "²", "١٢"])
def test_an_optimizer_tensor_named_with_odd_digits_is_refused(
    tmp_path: Path, saved: bytes, digits: str
) -> None:
    """ "optim/٣/exp_avg" is not parameter 3's moment: one tensor has one name."""
    header, _ = _parts(saved)
    tensors = safetensors.torch.load(saved)
    name = next(n for n in tensors if n.startswith("optim/3/"))
    tensors[name.replace("/3/", f"/{digits}/")] = tensors.pop(name)
    path = tmp_path / "stage-L1-2.step3.pt"
    path.write_bytes(safetensors.torch.save(tensors, metadata=header["__metadata__"]))
    with pytest.raises(WireError, match="unexpected tensor"):
        state_file.read(path)
