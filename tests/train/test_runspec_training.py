from pathlib import Path

import pytest

from p2ptrain.errors import UserError
from p2ptrain.records.run import RunSpec, load_run_spec


def test_training_fields_round_trip_through_json_dicts() -> None:
    spec = RunSpec(n_layer=2, compression="none", lr=5e-4, min_lr=5e-5)
    assert RunSpec.from_dict(spec.to_dict()) == spec


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"n_embd": 30, "n_head": 4}, "multiple of n_head"),
        ({"stages": 8}, "cannot exceed n_layer"),
        ({"compression": "int8"}, "compression"),
        ({"min_lr": 1.0}, "min_lr"),
        ({"batch_size": 0}, "batch_size"),
        ({"data_format": "csv"}, "data_format"),
    ],
)
def test_bad_training_fields_are_user_errors(changes: dict[str, object], message: str) -> None:
    with pytest.raises(UserError, match=message):
        RunSpec(**changes)


def test_toml_file(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text('[run]\nrun_id = "t"\nn_layer = 2\nlr = 1e-3\nbatch_size = 8\n')
    spec = load_run_spec(path)
    assert (spec.run_id, spec.n_layer, spec.batch_size) == ("t", 2, 8)
    path.write_text("[run]\nn_layers = 2\n")
    with pytest.raises(UserError, match="unknown"):
        load_run_spec(path)
