from pathlib import Path

import pytest

from p2ptrain.errors import UserError
from p2ptrain.records.run import RunSpec, load_run_spec


def test_training_fields_round_trip_through_json_dicts() -> None:
    spec = RunSpec().replace(n_layer=2, compression="none", lr=5e-4, min_lr=5e-5)
    assert RunSpec.from_dict(spec.to_dict()) == spec


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"n_embd": 30, "n_head": 4}, "multiple of n_head"),
        ({"stages": 8}, "cannot exceed n_layer"),
        ({"compression": "int4"}, "compression"),
        ({"min_lr": 1.0}, "min_lr"),
        ({"batch_size": 0}, "batch_size"),
        ({"data_format": "csv"}, "data_format"),
        ({"model": "gpt-j"}, "model must be"),
        ({"preset": "13b"}, "preset must be"),
        ({"preset": "125m", "n_layer": 8}, "n_layer = 8 conflicts with 12 from the preset"),
        ({"intermediate_size": 256}, "llama field"),  # model = "nanogpt"
        ({"model": "llama", "num_key_value_heads": 3}, "must divide n_head"),
        ({"model": "llama", "n_embd": 20, "n_head": 4}, "must be even"),
        ({"model": "llama", "rope_theta": -1.0}, ">= 0"),
        ({"model": "llama", "tie_word_embeddings": True}, "stages = 1"),
        ({"model": "llama", "preset": "tiny", "stages": 3}, "cannot exceed n_layer"),
    ],
)
def test_bad_training_fields_are_user_errors(changes: dict[str, object], message: str) -> None:
    with pytest.raises(UserError, match=message):
        RunSpec().replace(**changes)


def test_toml_file(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text('[run]\nrun_id = "t"\nn_layer = 2\nlr = 1e-3\nbatch_size = 8\n')
    spec = load_run_spec(path)
    assert (spec.run_id, spec.model.n_layer, spec.optim.batch_size) == ("t", 2, 8)
    path.write_text("[run]\nn_layers = 2\n")
    with pytest.raises(UserError, match="unknown"):
        load_run_spec(path)


def test_a_preset_sets_the_sizes_every_reader_of_the_spec_sees() -> None:
    spec = RunSpec().replace(model="llama", preset="7b")
    assert (spec.model.n_layer, spec.model.n_head, spec.model.n_embd) == (32, 32, 4096)
    config = spec.model_config()
    assert (config.n_inner, config.n_kv_head, config.vocab_size) == (11008, 32, 256)
    assert (config.rms_norm_eps, config.rope_theta) == (1e-5, 10_000.0)
    # the preset's own sizes may be repeated
    assert RunSpec().replace(preset="350m", n_layer=24, n_embd=1024).model.n_head == 16
    filled = RunSpec().replace(model="llama", preset="1.3b")
    assert (filled.model.n_layer, filled.model.n_head, filled.model.n_embd) == (24, 16, 2048)
    assert RunSpec.from_dict(filled.to_dict()) == filled  # filled sizes read back the same
    nanogpt = RunSpec().replace(preset="125m").model_config()
    assert (nanogpt.family, nanogpt.n_inner, nanogpt.n_kv_head) == ("nanogpt", 3072, 12)


def test_a_llama_spec_without_a_preset_derives_its_sizes() -> None:
    config = RunSpec().replace(model="llama", n_layer=2, n_head=4, n_embd=256).model_config()
    assert (config.n_kv_head, config.n_inner) == (4, 768)  # 8/3 x 256, rounded up to 256
    tiny = RunSpec().replace(model="llama", preset="tiny").model_config()
    assert (tiny.n_layer, tiny.n_head, tiny.n_kv_head, tiny.n_embd) == (2, 4, 2, 64)
