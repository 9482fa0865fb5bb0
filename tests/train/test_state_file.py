"""The stage-state file, format /3 (train/state_file.py): safetensors plus JSON metadata, no
pickle; AdamW's state comes back exactly; anything malformed is a WireError."""

from __future__ import annotations

import json
import pickle
import struct
from pathlib import Path
from typing import Any

import pytest
import safetensors
import safetensors.torch
import torch

from p2ptrain.errors import UserError, WireError
from p2ptrain.records.run import RunSpec
from p2ptrain.records.stage_state import FORMAT, StateMeta
from p2ptrain.train import state_file
from p2ptrain.train.checkpoint import save_stage
from p2ptrain.train.checkpoint_read import load_stage
from p2ptrain.train.model import build_stage
from p2ptrain.train.optim import make_optimizer

SPEC = RunSpec().replace(n_layer=2, n_head=2, n_embd=16, block_size=8, steps=10, weight_decay=0.1)


def _train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int) -> None:
    torch.manual_seed(0)
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(2, 8, 16)).float().pow(2).mean().backward()
        optimizer.step()


def _saved(tmp_path: Path) -> tuple[Path, torch.nn.Module, torch.optim.Optimizer]:
    model = build_stage(SPEC, 1, 2)
    optimizer = make_optimizer(model, SPEC)
    _train(model, optimizer, 3)
    path = tmp_path / "stage-L1-2.step3.pt"
    save_stage(path, SPEC, model, optimizer, step=3)
    return path, model, optimizer


def test_a_round_trip_restores_the_optimizer_exactly(tmp_path: Path) -> None:
    path, model, optimizer = _saved(tmp_path)
    fresh = build_stage(SPEC, 1, 2)
    fresh_opt = make_optimizer(fresh, SPEC)
    assert load_stage(path, SPEC, fresh, fresh_opt) == 3
    saved, loaded = optimizer.state_dict(), fresh_opt.state_dict()
    assert loaded["param_groups"] == saved["param_groups"]  # betas a tuple again, lr, decay...
    assert loaded["state"].keys() == saved["state"].keys()
    for index, values in saved["state"].items():
        assert loaded["state"][index].keys() == values.keys()
        for name, tensor in values.items():
            other = loaded["state"][index][name]
            assert other.dtype == tensor.dtype and torch.equal(other, tensor), (index, name)
    # and training goes on bit for bit as if never saved
    _train(model, optimizer, 2)
    _train(fresh, fresh_opt, 2)
    for a, b in zip(model.parameters(), fresh.parameters(), strict=True):
        assert torch.equal(a, b)


def test_the_file_is_safetensors_with_json_metadata_and_no_pickle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, model, _ = _saved(tmp_path)
    assert not state_file.is_pickled(path)
    with safetensors.safe_open(str(path), "pt") as opened:
        meta = StateMeta.from_json(opened.metadata()[state_file.METADATA_KEY])
        names = set(opened.keys())
    assert meta.step == 3 and meta.layers == (1, 2) and meta.run_id == SPEC.run_id
    assert {f"model/{n}" for n in model.state_dict()} <= names
    assert {f"optim/0/{f}" for f in ("exp_avg", "exp_avg_sq", "step")} <= names

    def no_unpickling(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a state file was unpickled")

    monkeypatch.setattr(torch, "load", no_unpickling)
    monkeypatch.setattr(pickle, "loads", no_unpickling)
    monkeypatch.setattr(pickle, "load", no_unpickling)
    fresh = build_stage(SPEC, 1, 2)
    assert load_stage(path, SPEC, fresh, make_optimizer(fresh, SPEC)) == 3


def _safetensors(tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None) -> bytes:
    return safetensors.torch.save(tensors, metadata=metadata)


def _meta(**changes: Any) -> str:
    meta = {
        "format": FORMAT,
        "run_id": "r",
        "model": {},
        "layers": [0, 1],
        "step": 1,
        "param_groups": [{"lr": 0.1, "betas": [0.9, 0.95], "params": [0]}],
    }
    return json.dumps({**meta, **changes})


BAD_FILES: list[bytes] = [
    b"",
    b"\x00" * 7,
    struct.pack("<Q", 2**63) + b"{}",
    struct.pack("<Q", 4) + b"{}",  # a header longer than the file
    struct.pack("<Q", 2) + b"[]",
    struct.pack("<Q", 5) + b"\xff\xfe{}x",
    struct.pack("<Q", 3000) + b"[" * 3000,
    _safetensors({"model/w": torch.ones(2)}, None),  # no metadata
    _safetensors({"model/w": torch.ones(2)}, {"p2ptrain": "not json"}),
    _safetensors(
        {"model/w": torch.ones(2)}, {"p2ptrain": _meta(format="p2ptrain.stage-checkpoint/2")}
    ),
    _safetensors({"model/w": torch.ones(2)}, {"p2ptrain": _meta(step=-1)}),
    _safetensors({"model/w": torch.ones(2)}, {"p2ptrain": _meta(layers=[2, 1])}),
    _safetensors(
        {"model/w": torch.ones(2)},
        {"p2ptrain": _meta(param_groups=[{"lr": "x" * 99, "params": [0]}])},
    ),
    _safetensors({"model/w": torch.ones(2)}, {"p2ptrain": _meta(step=float("nan"))}),
    _safetensors({"model/w": torch.ones(2)}, {"p2ptrain": _meta().replace("0.1", "NaN")}),
    _safetensors({"evil": torch.ones(2)}, {"p2ptrain": _meta()}),  # not a name of the layout
    _safetensors({"optim/7/exp_avg": torch.ones(2)}, {"p2ptrain": _meta()}),  # no such param
    _safetensors({"model/w": torch.ones(2)}, {"p2ptrain": _meta()})[:-3],  # a torn body
]


@pytest.mark.parametrize("body", BAD_FILES, ids=range(len(BAD_FILES)))
def test_a_malformed_state_file_is_a_wire_error(tmp_path: Path, body: bytes) -> None:
    path = tmp_path / "s.pt"
    path.write_bytes(body)
    with pytest.raises(WireError):
        state_file.read(path)
    model = build_stage(SPEC, 0, 2)
    with pytest.raises(UserError):  # what load_stage makes of it: the file is refused
        load_stage(path, SPEC, model, make_optimizer(model, SPEC))


def test_random_bytes_and_torn_files_are_wire_errors(tmp_path: Path) -> None:
    valid = _safetensors({"model/w": torch.ones(4)}, {"p2ptrain": _meta()})
    path = tmp_path / "s.pt"
    rng = torch.Generator().manual_seed(0)
    refused = 0
    for index in range(300):
        body = bytearray(valid)
        cut = int(torch.randint(0, len(body), (1,), generator=rng))
        if index % 3 == 0:
            body = body[:cut]
        elif index % 3 == 1:
            body[cut] = int(torch.randint(0, 256, (1,), generator=rng))
        else:
            body = bytearray(
                torch.randint(0, 256, (cut,), generator=rng, dtype=torch.uint8).numpy()
            )
        path.write_bytes(bytes(body))
        try:
            state_file.read(path)
        except WireError:  # anything else fails the test
            refused += 1
    assert refused > 100


def _padded_state(num_bytes: int) -> bytes:
    """A state file whose header is padded with `{},` to `num_bytes`: what parses into GBs."""
    valid = _safetensors({"model/w": torch.ones(2)}, {"p2ptrain": _meta()})
    (size,) = struct.unpack("<Q", valid[:8])
    header, body = valid[8 : 8 + size].rstrip(), valid[8 + size :]
    fill = num_bytes - len(header) - len(',"pad":[]')
    padded = header[:-1] + b',"pad":[' + (b"{}," * (fill // 3))[:-1] + b"]}"
    return struct.pack("<Q", len(padded)) + padded + body


def test_a_header_longer_than_the_expected_tensors_need_is_refused_unparsed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, model, _ = _saved(tmp_path)
    with safetensors.safe_open(str(path), "pt") as opened:
        num_tensors = len(opened.keys())
    bound = state_file.max_state_tensors(len(model.state_dict()))
    assert num_tensors <= bound
    assert state_file.check(path, max_tensors=bound).step == 3  # our own state passes
    limit = state_file.max_header_bytes(bound)
    assert limit < 20 * 1024**2  # the metadata's cap and a little: not safetensors' 100 MiB

    crafted = tmp_path / "crafted.pt"
    crafted.write_bytes(_padded_state(limit - 64))
    assert state_file.check(crafted, max_tensors=bound).step == 1  # within the bound: parsed
    crafted.write_bytes(_padded_state(limit + 64))

    def no_parsing(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("an oversized header was parsed")

    monkeypatch.setattr(state_file.json, "loads", no_parsing)
    with pytest.raises(WireError, match="oversized stage state"):
        state_file.check(crafted, max_tensors=bound)
