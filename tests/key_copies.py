"""Where copies of nodes' private keys lie: a run must leave none outside its identity dirs."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from p2ptrain import identity

KEY_FILE_SIZES = (36, 68)  # py-libp2p's form and the 64-byte form p2pd reads


def key_copies_outside(identity_dir: Path, key_files: list[Path]) -> list[Path]:
    """Files in the system temp directory (its whole tree, but `identity_dir`) that hold the
    seed of any of `key_files`: what a worker start used to leave (finding 14 of issue 26)."""
    seeds = [identity.load_identity(k) for k in key_files]
    inside = identity_dir.resolve()
    found = []
    for root, dirs, files in os.walk(tempfile.gettempdir()):
        if Path(root).resolve() == inside:
            dirs.clear()
            continue
        for name in files:
            path = Path(root, name)
            try:
                if path.is_symlink() or path.stat().st_size not in KEY_FILE_SIZES:
                    continue
                data = path.read_bytes()
            except OSError:
                continue
            if any(seed in data for seed in seeds):
                found.append(path)
    return found


def copies_beside(key_file: Path) -> list[Path]:
    """The p2pd key copies beside an identity file (none once its worker has started)."""
    return sorted(key_file.parent.glob(f".{key_file.name}.p2pd-*"))
