import pytest

from p2ptrain.errors import UserError
from p2ptrain.records.run import RunSpec, load_run_spec


def test_default_and_round_trip():
    spec = load_run_spec(None)
    assert spec == RunSpec()
    assert RunSpec.from_dict(spec.to_dict()) == spec


def test_toml_run_table(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('[run]\nrun_id = "demo"\nstages = 3\nc_dp_gb = 1\n')
    spec = load_run_spec(path)
    assert (spec.run_id, spec.swarm.stages, spec.swarm.c_dp_gb) == ("demo", 3, 1.0)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[run]\nstages = "four"\n', "must be int"),
        ("[run]\nstages = 0\n", "stages must be"),
        ("[run]\ncolour = 1\n", "unknown run spec field"),
        ("[run\n", "not valid TOML"),
        ('[run]\nrun_id = ""\n', "run_id"),
    ],
)
def test_bad_specs_are_user_errors(tmp_path, text, message):
    path = tmp_path / "run.toml"
    path.write_text(text)
    with pytest.raises(UserError, match=message):
        load_run_spec(path)


def test_missing_file_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="cannot read"):
        load_run_spec(tmp_path / "nope.toml")
