"""Fuzzing the readers of a user's files and of the node's own socket: a run spec's TOML, a
token (text or file), a key file, a spare's copies.json, an IPC line. Each gives its record
(None or {} where its docstring says so) or its one documented error, never another exception:
UserError (one line, exit 2) for the CLI's files, WireError for a token, nothing at all for the
readers that drop what they cannot use."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from p2ptrain import ipc_lines
from p2ptrain.errors import UserError, WireError
from p2ptrain.key_file import PRIVATE_HEADER_32, PRIVATE_HEADER_64, load_identity
from p2ptrain.records import RunSpec, issue_token, load_run_spec
from p2ptrain.records.token import Token, read_token
from p2ptrain.worker.resume.copy_sources import FILE_NAME, read_sources
from tests.records.samples import SAMPLES, A
from tests.records.test_fuzz import _mutate_bytes, assert_no_slip, json_texts

# what a TOML value can be that a run spec's field never is, or is only at its edge
TOML_VALUES = [
    "9" * 5000,  # past Python's 4300-digit limit on int(): tomllib's ValueError
    "-9" + "9" * 30,
    "0x7fffffffffffffffff",
    "1e400",
    "nan",
    "-inf",
    "1979-05-27",
    "07:32:00",
    "1979-05-27T07:32:00Z",
    "[1, 2]",
    "[" * 3000 + "]" * 3000,
    "{a = 1}",
    "{" + "b = {" * 500 + "c = 1" + "}" * 501,
    '"²"',
    '"٣"',
    '"\\u0000"',
    '"' + "x" * 5000 + '"',
    "true",
    '""',
    "-1",
    "0",
    "'''\nmulti\n'''",
]
TOML_SNIPPETS = [b"[", b"]", b"[[run]]", b"=", b'"', b"'", b"\n", b"\xff", b"\x00", b"."]


def _toml_text(rng: random.Random, sample: str) -> bytes:
    """A run spec's TOML with a value swapped, a line dropped or doubled, or bytes mutated."""
    lines = sample.splitlines()
    roll = rng.random()
    if roll < 0.5:
        values = [i for i, line in enumerate(lines) if " = " in line]
        for _ in range(rng.randint(1, 3)):
            index = rng.choice(values)
            name = lines[index].split(" = ")[0]
            lines[index] = f"{name} = {rng.choice(TOML_VALUES)}"
    elif roll < 0.65:
        index = rng.randrange(len(lines))
        lines.insert(rng.randrange(len(lines)), lines[index])
    elif roll < 0.75:
        del lines[rng.randrange(len(lines))]
    else:
        data = bytearray(_mutate_bytes(rng, sample.encode()))
        at = rng.randint(0, len(data))
        data[at:at] = rng.choice(TOML_SNIPPETS)
        return bytes(data)
    return "\n".join(lines).encode()


@pytest.mark.parametrize("top", [False, True])
def test_a_mutated_run_spec_file_is_a_spec_or_one_user_error(tmp_path: Path, top: bool) -> None:
    sample = RunSpec().replace(run_id="r", steps=7).to_toml()
    if top:  # the sections at the top level, without the [run] table
        sample = sample.replace("[run]\n", "").replace("[run.", "[")
    path = tmp_path / "run.toml"
    path.write_text(sample)
    assert load_run_spec(path).run_id == "r"
    rng = random.Random(3 + top)
    num_valid = 0
    for _ in range(400):
        path.write_bytes(_toml_text(rng, sample))
        try:
            assert isinstance(load_run_spec(path), RunSpec)
            num_valid += 1
        except UserError as exc:
            assert str(exc) and "\n" not in str(exc)  # the CLI prints it as one line
            if isinstance(exc, WireError):
                assert_no_slip(exc)
    assert 0 < num_valid < 400  # some mutations keep a spec, most reach a check


def test_an_integer_past_4300_digits_in_a_run_spec_is_a_user_error(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    for text in ("[run.optim]\nsteps = " + "9" * 5000, "steps = " + "1" * 4400):
        path.write_text(text + "\n")
        with pytest.raises(UserError, match="not valid TOML"):
            load_run_spec(path)


TOKEN = issue_token(bytes(range(32)), A, True, 2e9, run_id="r")


def test_a_mutated_token_text_or_file_is_a_token_or_a_wire_error(tmp_path: Path) -> None:
    text = TOKEN.encode()
    assert read_token(text) == TOKEN
    rng = random.Random(5)
    path = tmp_path / "token.txt"
    for index in range(300):
        if index % 2:
            given = text[: rng.randint(0, len(text))] + rng.choice(["", "\x00", "/", "é", "A" * 9])
        else:
            path.write_bytes(_mutate_bytes(rng, text.encode()))
            given = str(path)
        try:
            assert isinstance(read_token(given), Token)
        except WireError as exc:
            assert_no_slip(exc)
    for given in (str(tmp_path), "a\x00b", "", " ", str(tmp_path / "absent")):
        with pytest.raises(WireError):
            read_token(given)


def test_a_key_file_of_any_bytes_is_a_seed_or_a_user_error(tmp_path: Path) -> None:
    rng = random.Random(7)
    path = tmp_path / "key"
    for _ in range(300):
        header = rng.choice([b"", PRIVATE_HEADER_32, PRIVATE_HEADER_64, b"\x08\x01"])
        body = rng.randbytes(rng.choice([0, 1, 32, 36, 64, 68, 100]))
        path.write_bytes((header + body)[: rng.choice([36, 68, 200])])
        try:
            seed = load_identity(path)
            assert isinstance(seed, bytes) and len(seed) == 32
        except UserError as exc:
            assert "\n" not in str(exc)
    for directory_or_absent in (tmp_path, tmp_path / "absent"):
        with pytest.raises(UserError):
            load_identity(directory_or_absent)


def test_a_mutated_copies_file_is_a_mapping_or_empty(tmp_path: Path) -> None:
    sample = json.dumps({"stage-L0-2.step3.pt": A}).encode()
    (tmp_path / FILE_NAME).write_bytes(sample)
    assert len(read_sources(tmp_path)) == 1
    for text in [*json_texts(random.Random(9), sample, 400), b"[" * 3000, b"\xff"]:
        (tmp_path / FILE_NAME).write_bytes(text)
        sources = read_sources(tmp_path)
        assert isinstance(sources, dict)
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in sources.items())


def test_a_mutated_ipc_line_is_a_message_or_none() -> None:
    rng = random.Random(13)
    messages = [data for _, data in SAMPLES if "type" in data]
    for data in messages:
        for text in json_texts(rng, json.dumps(data).encode(), 60):
            message = ipc_lines.decode(text)
            assert message is None or hasattr(message, "to_dict")
    for text in (b"", b"\n", b"[" * 3000, b"\xff", b"9" * 5000, b"null"):
        assert ipc_lines.decode(text) is None
