"""How `p2ptrain/data/corpus.txt.xz` (the run spec's `data = "embedded"`) was made; run again
only to make a new corpus under a new name (a run pins its bytes with `data_sha256`).

    python -m p2ptrain.harness.make_corpus p2ptrain/data/corpus.txt.xz

It takes the running interpreter's public top-level standard-library modules of at most 60 kB
(`Lib/*.py` without a leading underscore: 131 files, 2.37 MB on CPython 3.11.7, the one the
shipped file was made with), in name order, as raw bytes, and writes them xz-compressed, beside
CPython's licence (PSF), which their redistribution requires.
"""

from __future__ import annotations

import lzma
import shutil
import sys
import sysconfig
from pathlib import Path

MAX_FILE_BYTES = 60_000


def corpus_files(root: Path) -> list[Path]:
    return sorted(
        p
        for p in root.glob("*.py")
        if not p.name.startswith("_") and p.stat().st_size <= MAX_FILE_BYTES
    )


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(argv[0])
    root = Path(sysconfig.get_paths()["stdlib"])
    data = b"".join(p.read_bytes() for p in corpus_files(root))
    out.write_bytes(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME))
    shutil.copyfile(root / "LICENSE.txt", out.with_name("corpus-LICENSE.txt"))
    print(f"{out}: {len(data)} bytes from {root}, python {sys.version.split()[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
