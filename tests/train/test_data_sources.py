"""A local data source comes from the organiser's signed spec: a volunteer reads only regular
files, a bounded number of bytes, and never "/", its home directory or a path with ".."."""

import logging
import os
import socket
from pathlib import Path

import numpy as np
import pytest

from p2ptrain.errors import UserError
from p2ptrain.records.run import RunSpec
from p2ptrain.train import data
from p2ptrain.train.data import corpus_sha256, load_tokens

SPEC = RunSpec().replace(block_size=16)


def test_devices_fifos_and_sockets_are_refused_not_read(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="not a regular file"):
        load_tokens(SPEC.replace(data="/dev/zero"))  # would never end
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(UserError, match="not a regular file"):
        load_tokens(SPEC.replace(data=str(fifo)))  # would wait for a writer forever
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(tmp_path / "sock"))
        with pytest.raises(UserError, match="not a regular file"):
            load_tokens(SPEC.replace(data=str(tmp_path / "sock")))


def test_a_directory_yields_only_its_own_regular_files(tmp_path: Path) -> None:
    outside = tmp_path / "private"
    outside.mkdir()
    (outside / "id_ed25519").write_bytes(b"SECRET" * 100)
    corpus = tmp_path / "corpus"
    (corpus / "sub").mkdir(parents=True)
    (corpus / "a.txt").write_bytes(b"a" * 40)
    (corpus / "sub" / "b.txt").write_bytes(b"b" * 40)
    (corpus / "key").symlink_to(outside / "id_ed25519")
    (corpus / "dir").symlink_to(outside, target_is_directory=True)
    os.mkfifo(corpus / "fifo")
    tokens = load_tokens(SPEC.replace(data=str(corpus)))
    assert tokens.tobytes() == b"a" * 40 + b"b" * 40


@pytest.mark.parametrize("source", ["/", "~", "~/", "~/."])
def test_the_root_and_the_home_directory_are_refused(
    source: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "notes.txt").write_bytes(b"private " * 100)
    with pytest.raises(UserError, match="root or the home directory"):
        load_tokens(SPEC.replace(data=source))


def test_dotdot_is_refused_in_the_data_and_the_tokenizer(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b.txt").write_bytes(b"x" * 100)
    with pytest.raises(UserError, match=r"'\.\.'"):
        load_tokens(SPEC.replace(data=str(tmp_path / "a" / ".." / "b.txt")))
    with pytest.raises(UserError, match=r"tokenizer path .*'\.\.'"):
        load_tokens(
            SPEC.replace(data=str(tmp_path / "b.txt"), tokenizer=str(tmp_path / "a/../t.json"))
        )


def test_a_tokenizer_that_is_not_a_regular_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "b.txt").write_bytes(b"x" * 100)
    os.mkfifo(tmp_path / "tokenizer.json")
    spec = SPEC.replace(data=str(tmp_path / "b.txt"), tokenizer=str(tmp_path / "tokenizer.json"))
    with pytest.raises(UserError, match="not a regular file"):
        load_tokens(spec)


def test_the_bytes_read_are_capped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a.txt").write_bytes(b"a" * 60)
    (tmp_path / "b.txt").write_bytes(b"b" * 60)
    monkeypatch.setattr(data, "MAX_DATA_BYTES", 100)
    with pytest.raises(UserError, match="larger than the 100 bytes"):
        load_tokens(SPEC.replace(data=str(tmp_path)))
    assert load_tokens(SPEC.replace(data=str(tmp_path / "a.txt"))).size == 60
    monkeypatch.setattr(data, "MAX_DATA_BYTES", 120)
    assert load_tokens(SPEC.replace(data=str(tmp_path))).size == 120  # exactly the cap: fine
    # a file longer than its stat said (growing) is still cut at the cap
    monkeypatch.setattr(data, "MAX_DATA_BYTES", 100)
    monkeypatch.setattr(data, "READ_CHUNK_BYTES", 7)
    monkeypatch.setattr(data.os, "fstat", lambda fd: os.stat_result((0o100644, *[0] * 9)))
    with pytest.raises(UserError, match="larger than the 100 bytes"):
        load_tokens(SPEC.replace(data=str(tmp_path)))


def test_an_unpinned_local_source_warns_and_a_pinned_one_does_not(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "a.txt"
    path.write_bytes(b"hello world " * 10)
    with caplog.at_level(logging.WARNING, logger="p2ptrain.train.data"):
        tokens = load_tokens(SPEC.replace(data=str(path)))
    assert "does not pin its data" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="p2ptrain.train.data"):
        load_tokens(SPEC.replace(data=str(path), data_sha256=corpus_sha256(tokens)))
        load_tokens(SPEC)  # the embedded corpus is the same bytes everywhere
    assert "does not pin" not in caplog.text


def test_an_empty_token_directory_and_unreadable_token_files_are_one_line_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "empty").mkdir()
    spec = SPEC.replace(data_format="tokens", vocab_size=512)
    with pytest.raises(UserError, match="holds no regular files"):
        load_tokens(spec.replace(data=str(tmp_path / "empty")))
    path = tmp_path / "train.bin"
    np.arange(300, dtype=np.uint16).tofile(path)

    def denied(*args: object) -> int:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(os, "open", denied)  # chmod 0 would not stop root
    with pytest.raises(UserError, match=r"cannot read data file.*Permission denied"):
        load_tokens(spec.replace(data=str(path)))


def test_a_token_file_with_an_odd_trailing_byte_reads_as_before(tmp_path: Path) -> None:
    path = tmp_path / "train.bin"
    path.write_bytes(np.arange(300, dtype=np.uint16).tobytes() + b"\x01")
    tokens = load_tokens(SPEC.replace(data=str(path), data_format="tokens", vocab_size=512))
    assert np.array_equal(tokens, np.fromfile(path, dtype=np.uint16))
