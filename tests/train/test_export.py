"""`p2ptrain export`: stage checkpoints merged into a Hugging Face directory that transformers
loads, computing our model's logits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from p2ptrain.app import main
from p2ptrain.errors import UserError
from p2ptrain.records.run import RunSpec
from p2ptrain.train.checkpoint import record_step, save_stage
from p2ptrain.train.checkpoint_folder import checkpoint_path
from p2ptrain.train.export import export_hf, hf_name
from p2ptrain.train.model import Stage, build_layers, build_model
from p2ptrain.train.optim import make_optimizer
from p2ptrain.train.recut import model_wide
from p2ptrain.train.reference import train_reference
from p2ptrain.train.snapshot import StageSnapshot

transformers = pytest.importorskip("transformers")

TINY_LLAMA = RunSpec().replace(
    run_id="export", model="llama", preset="tiny", block_size=16, batch_size=4, steps=3, lr=3e-3
)


def cut(spec: RunSpec, whole: Stage, layers: range) -> Stage:
    """The stage of `layers` holding the whole model's weights."""
    stage = build_layers(spec, layers)
    weights = {model_wide(n, whole.layers): t for n, t in whole.state_dict().items()}
    stage.load_state_dict({n: weights[model_wide(n, layers)] for n in stage.state_dict()})
    return stage


def checkpoint_as_stages(spec: RunSpec, whole: Stage, directory: Path, cuts: list[range]) -> None:
    for layers in cuts:
        stage = cut(spec, whole, layers)
        snapshot = StageSnapshot.take(stage, make_optimizer(stage, spec), spec.optim.steps)
        record_step(directory, spec, stage, snapshot)


def hf_logits(out: Path, idx: torch.Tensor) -> torch.Tensor:
    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        return model(idx).logits  # type: ignore[no-any-return]


def write_run(path: Path, spec: RunSpec) -> Path:
    path.write_text(spec.to_toml())
    return path


def test_a_trained_two_stage_llama_exports_to_transformers_with_the_same_logits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = TINY_LLAMA.replace(checkpoint_dir=str(tmp_path / "ckpt"))
    whole = build_model(spec)
    train_reference(spec, model=whole)
    checkpoint_as_stages(spec, whole, tmp_path / "ckpt", [range(0, 1), range(1, 2)])
    run = write_run(tmp_path / "run.toml", spec)
    out = tmp_path / "hf"
    assert main(["export", "--run", str(run), "--out", str(out)]) == 0
    assert "step 3" in capsys.readouterr().out
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["num_key_value_heads"] == 2
    idx = torch.randint(
        0, 256, (2, spec.model.block_size), generator=torch.Generator().manual_seed(1)
    )
    with torch.no_grad():
        ours = whole(idx)
    assert (hf_logits(out, idx) - ours).abs().max() < 1e-4


def test_a_tied_one_stage_llama_exports_its_one_embedding(tmp_path: Path) -> None:
    spec = TINY_LLAMA.replace(stages=1, tie_word_embeddings=True, rope_theta=500.0)
    whole = build_model(spec)
    train_reference(spec, steps=2, model=whole)
    save_stage(checkpoint_path(tmp_path, whole.layers), spec, whole, make_optimizer(whole, spec), 2)
    assert (
        export_hf(spec, tmp_path, tmp_path / "hf").step == 2
    )  # the latest file alone (no history)
    idx = torch.randint(0, 256, (2, spec.model.block_size))
    with torch.no_grad():
        ours = whole(idx)
    assert (hf_logits(tmp_path / "hf", idx) - ours).abs().max() < 1e-4


def test_a_nanogpt_run_exports_as_gpt2(tmp_path: Path) -> None:
    spec = RunSpec().replace(
        run_id="export", n_layer=3, n_head=2, n_embd=32, block_size=16, steps=2
    )
    whole = build_model(spec)
    train_reference(spec, model=whole)
    checkpoint_as_stages(spec, whole, tmp_path, [range(0, 2), range(2, 3)])
    export_hf(spec, tmp_path, tmp_path / "hf")
    idx = torch.randint(0, 256, (2, spec.model.block_size))
    with torch.no_grad():
        ours = whole(idx)
    assert (hf_logits(tmp_path / "hf", idx) - ours).abs().max() < 1e-4


def test_an_export_needs_every_layer_at_one_step(tmp_path: Path) -> None:
    spec = TINY_LLAMA
    whole = build_model(spec)
    checkpoint_as_stages(spec, whole, tmp_path, [range(0, 1)])  # the last stage is missing
    with pytest.raises(UserError, match="cover the whole model") as refused:
        export_hf(spec, tmp_path, tmp_path / "hf")
    assert "holds L0-1; it lacks layer(s) 1: copy every node's" in str(refused.value)
    checkpoint_as_stages(spec, whole, tmp_path, [range(1, 2)])
    assert export_hf(spec, tmp_path, tmp_path / "hf").step == spec.optim.steps
    with pytest.raises(UserError, match="step 1 "):
        export_hf(spec, tmp_path, tmp_path / "hf", step=1)


def test_hugging_face_names() -> None:
    assert hf_name("block3.self_attn.q_proj.weight", "llama") == (
        "model.layers.3.self_attn.q_proj.weight"
    )
    assert hf_name("embed.embed_tokens.weight", "llama") == "model.embed_tokens.weight"
    assert hf_name("head.norm.weight", "llama") == "model.norm.weight"
    assert hf_name("head.lm_head.weight", "llama") == "lm_head.weight"
    assert hf_name("block0.attn.c_attn.bias", "nanogpt") == "transformer.h.0.attn.c_attn.bias"
    assert hf_name("embed.wpe.weight", "nanogpt") == "transformer.wpe.weight"
    assert hf_name("head.ln_f.weight", "nanogpt") == "transformer.ln_f.weight"
