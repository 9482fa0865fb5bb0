"""Where a worker saves (worker/checkpoint_place.py): the run spec is the organiser's word on
every volunteer's disk, so only a folder inside the node's working directory is taken from it;
an absolute or climbing one (/dev/shm, /, ../..) gives way to the default, and the node's own
--checkpoint-dir beats both. A run id is a folder's name: no / or \\, no leading dot."""

from __future__ import annotations

import pytest

from p2ptrain.errors import UserError
from p2ptrain.records import RunSpec
from p2ptrain.train.checkpoint import checkpoint_dir
from p2ptrain.worker.checkpoint_place import place_checkpoints


@pytest.mark.parametrize(
    "named,kept",
    [
        ("ckpt", True),
        ("runs/x/states", True),
        ("", True),
        ("/dev/shm", False),
        ("/", False),
        ("../../home/victim/.config", False),
        ("a/../../b", False),
        ("~/.ssh", False),
    ],
)
def test_a_spec_folder_is_taken_only_inside_the_working_directory(named: str, kept: bool) -> None:
    spec = RunSpec().replace(run_id="r", checkpoint_dir=named)
    placed = place_checkpoints(spec, None)
    assert placed.checkpoint.checkpoint_dir == (named if kept else "")
    assert not checkpoint_dir(placed).is_absolute()
    assert ".." not in checkpoint_dir(placed).parts


def test_the_nodes_own_folder_beats_the_specs() -> None:
    spec = RunSpec().replace(run_id="r", checkpoint_dir="/dev/shm")
    assert place_checkpoints(spec, "/srv/states").checkpoint.checkpoint_dir == "/srv/states"


@pytest.mark.parametrize("run_id", ["/dev/shm", "../../x", "a/b", "a\\b", ".hidden", ".."])
def test_a_run_id_that_is_no_plain_folder_name_is_refused(run_id: str) -> None:
    with pytest.raises(UserError, match="run_id"):
        RunSpec().replace(run_id=run_id)


def test_a_static_plans_own_spec_file_is_taken_as_it_is() -> None:
    spec = RunSpec().replace(run_id="r", checkpoint_dir="/srv/test-states")
    placed = place_checkpoints(spec, None, from_organiser=False)
    assert placed.checkpoint.checkpoint_dir == "/srv/test-states"
