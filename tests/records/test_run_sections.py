"""The run spec in sections (issue 27): one name per size, the sectioned TOML and wire forms, and
the flat form of older files and peers still read, each field routed to its section."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import pytest

from p2ptrain.errors import UserError, WireError
from p2ptrain.records.run import FLAT_NAMES, RunSpec, load_run_spec
from p2ptrain.records.run_sections import ModelSpec, OptimSpec, SwarmSpec, WireSpec
from tests.records.test_fuzz import fuzz

# what external checks write: a flat [run] table
FLAT_FILE = """[run]
run_id = "flat"
sync = "diloco"
inner_steps = 5
n_layer = 2
batch_size = 8
steps = 12
compression = "int8"
model = "llama"
data = "stdlib"
"""

SECTIONED_FILE = """[run]
run_id = "sectioned"

[run.swarm]
stages = 2

[run.model]
family = "llama"
n_layer = 2

[run.data]
source = "stdlib"

[run.optim]
steps = 12
batch_size = 8
sync = "diloco"
inner_steps = 5

[run.wire]
compression = "int8"
"""


def _load(tmp_path: Path, text: str) -> RunSpec:
    path = tmp_path / "run.toml"
    path.write_text(text)
    return load_run_spec(path)


def test_every_field_has_one_section_and_one_flat_name() -> None:
    spec = RunSpec()
    assert len(FLAT_NAMES) == len(spec.to_flat_dict()) - 1  # run_id sits at the top
    for flat_name, (section, name) in FLAT_NAMES.items():
        assert spec.to_flat_dict()[flat_name] == getattr(getattr(spec, section), name)
    assert not {"hidden_size", "num_hidden_layers", "num_attention_heads"} & set(FLAT_NAMES)


def test_sections_are_frozen_defaulted_and_check_their_own_fields() -> None:
    assert (SwarmSpec().stages, OptimSpec().steps, WireSpec().compression) == (2, 40, "fp16")
    with pytest.raises(UserError, match="stages must be"):
        SwarmSpec(stages=0)
    with pytest.raises(UserError, match="n_layer = 8 conflicts with 12 from the preset"):
        ModelSpec(preset="125m", n_layer=8)
    with pytest.raises(UserError, match="topk_fraction"):
        WireSpec(topk_fraction=0.0)
    with pytest.raises(AttributeError):
        SwarmSpec().stages = 3  # type: ignore[misc]
    # each fragment needs its own phase within H
    assert OptimSpec(inner_steps=4, outer_fragments=4).outer_fragments == 4
    with pytest.raises(UserError, match="outer_fragments"):
        OptimSpec(inner_steps=4, outer_fragments=5)
    with pytest.raises(UserError, match="outer_fragments"):
        OptimSpec(outer_fragments=0)


def test_replace_routes_each_flat_name_to_its_section() -> None:
    spec = RunSpec().replace(stages=4, n_layer=8, model="llama", data="stdlib", sync="diloco")
    assert (spec.swarm.stages, spec.model.n_layer, spec.model.family) == (4, 8, "llama")
    assert (spec.data.source, spec.optim.sync) == ("stdlib", "diloco")
    assert spec.wire == RunSpec().wire  # untouched sections stay
    with pytest.raises(TypeError, match="no field 'hidden_size'"):
        RunSpec().replace(hidden_size=64)
    with pytest.raises(UserError, match="cannot exceed n_layer"):  # checks across sections
        RunSpec().replace(stages=8)


def test_the_sectioned_and_the_flat_file_give_the_same_spec(tmp_path: Path) -> None:
    flat, sectioned = _load(tmp_path, FLAT_FILE), _load(tmp_path, SECTIONED_FILE)
    assert flat == sectioned.replace(run_id="flat")
    assert (flat.optim.sync, flat.optim.inner_steps, flat.model.n_layer) == ("diloco", 5, 2)
    assert (flat.optim.batch_size, flat.optim.steps, flat.wire.compression) == (8, 12, "int8")
    top_level = _load(tmp_path, FLAT_FILE.replace("[run]\n", ""))  # flat, without [run]
    assert top_level == flat


def test_to_toml_writes_a_file_that_reads_back(tmp_path: Path) -> None:
    spec = RunSpec().replace(run_id="t", model="llama", n_layer=3, lr=5e-4, min_lr=1e-5)
    text = spec.to_toml()
    assert "[run.model]" in text and 'family = "llama"' in text
    assert _load(tmp_path, text) == spec


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("hidden_size = 256", "run spec: `hidden_size` is now `n_embd` (one name per size)"),
        ("num_hidden_layers = 8", "run spec: `num_hidden_layers` is now `n_layer`"),
        ("num_attention_heads = 8", "run spec: `num_attention_heads` is now `n_head`"),
    ],
)
def test_an_old_hugging_face_size_name_fails_with_one_line_saying_how_to_move(
    tmp_path: Path, line: str, message: str
) -> None:
    with pytest.raises(UserError, match=re.escape(message)) as caught:
        _load(tmp_path, f'[run]\nmodel = "llama"\n{line}\n')
    assert "\n" not in str(caught.value)
    with pytest.raises(UserError, match=re.escape(message)):  # in the model's own table too
        _load(tmp_path, f'[run.model]\nfamily = "llama"\n{line}\n')


def test_an_old_size_name_that_repeats_the_size_or_says_derived_still_loads(
    tmp_path: Path,
) -> None:
    spec = _load(tmp_path, "[run]\nn_embd = 64\nhidden_size = 64\nnum_hidden_layers = 0\n")
    assert spec == RunSpec().replace(n_embd=64)
    # an older peer's flat dict: every field, the llama size names 0 (= derived)
    older = {**RunSpec().to_flat_dict(), "hidden_size": 0, "num_attention_heads": 0}
    assert RunSpec.from_dict(older) == RunSpec()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[run]\ncolour = 1\n", "unknown run spec field\\(s\\): colour"),
        ("[run.model]\nstages = 2\n", "model.stages \\(a field of \\[run.swarm\\]\\)"),
        ("[run.modle]\nn_layer = 2\n", "unknown run spec field\\(s\\): modle"),
        ("[run.model]\nmodel = 'llama'\n", "model.model"),  # in its table it is `family`
        ("[run]\nsteps = 3\n[run.optim]\nsteps = 4\n", "given twice"),
        ('[run.optim]\nsteps = "four"\n', "'optim.steps' must be int"),
    ],
)
def test_a_bad_key_fails_with_one_line(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(UserError, match=message) as caught:
        _load(tmp_path, text)
    assert "\n" not in str(caught.value) and not isinstance(caught.value, WireError)


def test_the_wire_form_is_sectioned_and_round_trips() -> None:
    spec = RunSpec().replace(run_id="w", preset="tiny", model="llama", sync="diloco")
    doc = spec.to_dict()
    assert list(doc) == ["run_id", "swarm", "model", "data", "optim", "wire", "checkpoint"]
    assert doc["model"]["n_layer"] == 2 and doc["optim"]["sync"] == "diloco"
    assert RunSpec.from_dict(doc) == spec
    assert RunSpec.from_dict(spec.to_flat_dict()) == spec  # a flat dict still decodes


@pytest.mark.parametrize(
    "data",
    [
        {"optim": {"steps": 10**400}},
        {"optim": {"lr": math.inf}},
        {"swarm": {"stages": "two"}},
        {"model": {"hidden_size": 5}},
        {"model": 3},
        {"swarm": {"stages": 1}, "stages": 1},
        {7: 1},
        {"wire": {"": None}},
    ],
)
def test_bad_sectioned_dicts_are_wire_errors(data: Any) -> None:
    with pytest.raises(WireError):
        RunSpec.from_dict(data)


@pytest.mark.parametrize(
    "sample",
    [
        RunSpec().replace(model="llama", preset="tiny", stages=1, sync="diloco").to_dict(),
        RunSpec().replace(run_id="f", data_sha256="a" * 64, resume="never").to_flat_dict(),
    ],
    ids=["sectioned", "flat"],
)
def test_run_spec_decoding_is_total(sample: dict[str, Any]) -> None:
    num_valid = fuzz(RunSpec.from_dict, sample, 1500, seed=3)
    assert 0 < num_valid < 1500  # some mutations decode, the rest reach the checks


def test_the_shipped_example_reads() -> None:
    example = Path(__file__).parents[2] / "bootstrap" / "run.example.toml"
    spec = load_run_spec(example)
    assert (spec.run_id, spec.swarm.stages, spec.swarm.c_dp_gb) == ("my-first-run", 2, 0.0)


def test_a_run_whose_frames_a_receiver_refuses_fails_at_load(tmp_path: Path) -> None:
    """7b at block_size 4096 and 32 rows in one micro-batch: honest fp16 frames of 1 GiB, over
    the 512 MiB a receiver reads (worker/pipeline/frames.py), so every step failed."""
    path = tmp_path / "run.toml"
    path.write_text('[run]\npreset = "7b"\nblock_size = 4096\nbatch_size = 32\nmicro_batches = 1\n')
    with pytest.raises(UserError, match="pipeline frame would hold 1073741824 bytes"):
        load_run_spec(path)
    halves = RunSpec().replace(preset="7b", block_size=4096, batch_size=32, micro_batches=2)
    assert halves.optim.micro_batches == 2  # 512 MiB exactly: what a receiver still reads
    with pytest.raises(WireError, match="pipeline frame"):
        RunSpec.from_dict({**halves.to_dict(), "optim": {"batch_size": 33, "micro_batches": 2}})


def test_a_run_of_one_stage_sends_no_frames_and_loads_whatever_its_batch() -> None:
    one = RunSpec().replace(preset="7b", block_size=4096, batch_size=32, micro_batches=1, stages=1)
    assert one.swarm.stages == 1  # no pipeline frame ever travels
