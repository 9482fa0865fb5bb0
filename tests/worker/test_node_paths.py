"""Where a worker saves and what it reads (worker/node_paths.py): the run spec is the
organiser's word on every volunteer's disk, so only a folder inside the node's working
directory is taken from it; an absolute or climbing one (/dev/shm, /, ../..) gives way to the
default, and the node's own --checkpoint-dir beats both. A run id is a folder's name: no / or
\\, no leading dot. An unpinned run's data or tokenizer outside the working directory is not
read (~/.ssh was trained on), unless the node names its own copy (--corpus, --tokenizer)."""

from __future__ import annotations

from pathlib import Path

import pytest

from p2ptrain.errors import UserError
from p2ptrain.records import RunSpec
from p2ptrain.train.checkpoint_folder import checkpoint_dir
from p2ptrain.worker.node_paths import node_spec, place_checkpoints, place_data
from p2ptrain.worker.settings import WorkerSettings


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


PIN = "ab" * 32


@pytest.mark.parametrize("named", ["/home/victim/.ssh", "~/.ssh", "../../etc", "a/../../b"])
@pytest.mark.parametrize("field", ["data", "tokenizer"])
def test_an_unpinned_spec_path_outside_the_working_directory_is_not_read(
    named: str, field: str
) -> None:
    spec = RunSpec().replace(run_id="r", **{field: named})
    with pytest.raises(UserError, match="--corpus" if field == "data" else "--tokenizer"):
        place_data(spec, None, None)
    # pinned: any path, since only the run's bytes pass the digest check
    assert place_data(spec.replace(data_sha256=PIN), None, None) == spec.replace(data_sha256=PIN)
    # not the organiser's word (a static plan's local file): taken as it is
    assert place_data(spec, None, None, from_organiser=False) == spec


@pytest.mark.parametrize("named", ["embedded", "stdlib", "corpus.txt", "data/shards", ""])
def test_built_in_data_and_paths_inside_the_working_directory_are_read(named: str) -> None:
    spec = RunSpec().replace(run_id="r", data=named or "embedded", tokenizer=named and "tok.json")
    assert place_data(spec, None, None) == spec


def test_the_nodes_own_copies_beat_the_specs_paths() -> None:
    spec = RunSpec().replace(run_id="r", data="/data/corpus", tokenizer="/data/tok.json")
    settings = WorkerSettings(corpus="/srv/my-copy", tokenizer="/srv/tok.json")
    placed = node_spec(spec, settings, from_organiser=True)
    assert (placed.data.source, placed.data.tokenizer) == ("/srv/my-copy", "/srv/tok.json")
    # one named, the other still the spec's, outside: refused for that one
    with pytest.raises(UserError, match=r"tokenizer '/data/tok\.json'"):
        place_data(spec, "/srv/my-copy", None)


@pytest.mark.parametrize("built_in", ["embedded", "stdlib"])
def test_a_leftover_corpus_flag_does_not_replace_a_built_in_corpus(built_in: str) -> None:
    """It would train this peer on other bytes than the run's, unpinned: silently."""
    spec = RunSpec().replace(run_id="r", data=built_in)
    assert place_data(spec, "/srv/my-copy", None).data.source == built_in


def test_a_harness_passes_its_own_specs_paths_as_its_nodes_copies() -> None:
    """`p2ptrain local` (through join, or --direct) starts nodes on the user's own spec: its
    paths become the nodes' --corpus and --tokenizer, absolute."""
    import os

    from p2ptrain.worker.node_paths import own_copies

    spec = RunSpec().replace(run_id="r", data="corpus", tokenizer="~/tok.json")
    corpus, tokenizer = own_copies(spec)
    assert corpus == os.path.abspath("corpus")
    assert tokenizer == os.path.expanduser("~/tok.json")
    assert own_copies(RunSpec()) == (None, None)  # the embedded corpus: no path
    # a node given them reads them, wherever they are, unpinned
    placed = place_data(RunSpec().replace(data="/abs/corpus"), corpus, tokenizer)
    assert (placed.data.source, placed.data.tokenizer) == (corpus, tokenizer)


@pytest.mark.parametrize("named", [".ssh", ".ssh/id_ed25519", "data/.env", "./.aws"])
def test_an_unpinned_hidden_path_is_not_read_even_inside_the_working_directory(named: str) -> None:
    spec = RunSpec().replace(run_id="r", data=named)
    with pytest.raises(UserError, match="hidden path"):
        place_data(spec, None, None)
    assert place_data(spec.replace(data_sha256=PIN), None, None).data.source == named


def test_a_node_run_from_its_home_reads_no_unpinned_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A volunteer who joins from ~ (or from /): the working directory holds every private
    folder of that user, hidden or not (Documents/, mail/)."""
    from p2ptrain.worker.node_paths import unpinned_readable

    home = tmp_path / "home" / "volunteer"
    work = home / "runs"
    work.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(home)
    spec = RunSpec().replace(run_id="r", data="Documents/taxes")
    with pytest.raises(UserError, match="home directory"):
        place_data(spec, None, None)
    assert not unpinned_readable("corpus.txt", cwd="/", home=str(home))
    # below the home, in a folder of its own: read
    monkeypatch.chdir(work)
    assert place_data(spec, None, None) == spec
    assert unpinned_readable("corpus.txt", cwd=str(work), home=str(home))
    # the node's own copy is always read
    assert place_data(spec, str(home / "Documents" / "mine"), None).data.source.endswith("mine")
