"""`p2ptrain export` writes each file through the descriptor of its own temporary file
(p2ptrain/train/export.py): it closed mkstemp's descriptor and reopened the name, and a symlink
swapped in for it had its target (a victim's 0600 file) overwritten and made 0644. Both files
are renamed into place only once both are written, and an `--out` folder of another user that
anyone may write to (no sticky bit) is refused."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from p2ptrain.errors import UserError
from p2ptrain.train import export
from p2ptrain.train.export import export_hf
from tests.train.test_export_writes import SPEC, save_whole

needs_proc = pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="reads /proc/self/fd")
as_root = pytest.mark.skipif(os.getuid() != 0, reason="makes a folder of another user")


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_an_export_s_files_get_a_plain_new_file_s_mode_and_no_temporary_stays(
    tmp_path: Path,
) -> None:
    save_whole(tmp_path, SPEC)
    out = tmp_path / "hf"
    export_hf(SPEC, tmp_path, out)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    for path in out.iterdir():
        assert (path.stat().st_mode & 0o777) == 0o666 & ~_umask()


@needs_proc
def test_a_temporary_name_swapped_for_a_symlink_is_never_written_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    save_whole(tmp_path, SPEC)
    victim = tmp_path / "victim.txt"
    victim.write_text("private\n")
    victim.chmod(0o600)
    out = tmp_path / "hf"
    write_bytes = export._write_bytes

    def swapped(fd: int, data: bytes) -> None:
        tmp = os.readlink(f"/proc/self/fd/{fd}")  # what the folder's owner could do
        os.unlink(tmp)
        os.symlink(victim, tmp)
        write_bytes(fd, data)

    monkeypatch.setattr(export, "_write_bytes", swapped)
    with pytest.raises(UserError, match="replaced meanwhile"):
        export_hf(SPEC, tmp_path, out)
    assert victim.read_text() == "private\n" and (victim.stat().st_mode & 0o777) == 0o600
    assert list(out.iterdir()) == []  # neither file renamed, the planted links removed


def test_a_config_that_cannot_be_written_leaves_the_earlier_model_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    save_whole(tmp_path, SPEC)
    out = tmp_path / "hf"
    export_hf(SPEC, tmp_path, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    save_whole(tmp_path, SPEC.replace(seed=SPEC.optim.seed + 1))  # other weights, same step
    write_bytes = export._write_bytes

    def config_fails(fd: int, data: bytes) -> None:
        if data.startswith(b"{"):  # config.json, written after the model
            raise OSError(errno.ENOSPC, "No space left on device")
        write_bytes(fd, data)

    monkeypatch.setattr(export, "_write_bytes", config_fails)
    with pytest.raises(UserError, match="No space left on device"):
        export_hf(SPEC, tmp_path, out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


@as_root
def test_another_users_world_writable_folder_is_refused_unless_sticky(tmp_path: Path) -> None:
    save_whole(tmp_path, SPEC)
    out = tmp_path / "shared"
    out.mkdir()
    os.chown(out, 65534, 65534)
    out.chmod(0o777)
    with pytest.raises(UserError, match="another user's folder that anyone may write to"):
        export_hf(SPEC, tmp_path, out)
    assert list(out.iterdir()) == []
    out.chmod(0o1777)  # sticky, as /tmp: nobody else can rename our files in it
    export_hf(SPEC, tmp_path, out)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
