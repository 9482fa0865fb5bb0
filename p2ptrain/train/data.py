"""Training data: a token corpus and batches that are a pure function of (seed, step, replica).

The default corpus ships with p2ptrain (`data = "embedded"`): 2.4 MB of Python source read as
bytes (vocabulary 256), the same bytes on every peer whatever its Python (harness/make_corpus.py
says how it was made). A run may instead name the running interpreter's own standard library
(`"stdlib"`: its bytes differ between Python versions, so pin them with `data_sha256`), a local
text file (bytes), a directory of text files, or a nanoGPT-style token file
(`data_format = "tokens"`: uint16 ids).

A step's global batch is `batch_size` windows at offsets drawn from a generator seeded by
(seed, step); replica r of R takes a contiguous slice of those rows. So the first stage (inputs) and
the last stage (targets) of a pipeline read the same rows locally, and any number of replicas
together see exactly the batch a single process sees.
"""

from __future__ import annotations

import hashlib
import lzma
import os
import sysconfig
from importlib import resources
from pathlib import Path

import numpy as np
import torch

from p2ptrain.errors import UserError
from p2ptrain.records.run import RunSpec

STDLIB = "stdlib"
EMBEDDED = "embedded"
EMBEDDED_FILE = "corpus.txt.xz"  # in the package's data folder, beside its licence


def stdlib_root() -> Path:
    """The standard library directory of the running interpreter."""
    return Path(sysconfig.get_paths().get("stdlib") or os.path.dirname(os.__file__))


def stdlib_files(root: Path | None = None) -> list[Path]:
    """The stdlib's own `.py` files in a stable order (no site-packages, no test suite)."""
    root = root or stdlib_root()
    files = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root).parts
        if "site-packages" in rel or "dist-packages" in rel or rel[0] in ("test", "idlelib"):
            continue
        files.append(path)
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def load_corpus(spec: RunSpec) -> torch.Tensor:
    """The run's whole corpus as a 1-D int64-convertible tensor of token ids; UserError if the
    run pins a digest (data_sha256) that this machine's corpus does not have."""
    tokens = load_tokens(spec)
    check_digest(spec, tokens)
    return torch.from_numpy(tokens.astype(np.int64 if tokens.dtype == np.uint16 else np.uint8))


def corpus_sha256(tokens: np.ndarray) -> str:
    """The corpus's digest: sha256 of its tokens as loaded (text: the bytes of its files in
    order; tokens: the uint16 ids, little-endian)."""
    return hashlib.sha256(tokens.astype(tokens.dtype.newbyteorder("<")).tobytes()).hexdigest()


def check_digest(spec: RunSpec, tokens: np.ndarray) -> None:
    """Refuse, in one line naming both digests, a corpus that is not the one the run pins."""
    if not spec.data.data_sha256:
        return
    mine = corpus_sha256(tokens)
    if mine != spec.data.data_sha256:
        raise UserError(
            f"the data on this machine ({spec.data.source!r}, sha256 {mine}) is not the run's "
            f"(data_sha256 {spec.data.data_sha256}): this peer would train on other bytes than the "
            "others; get the run's data (docs/operations.md, 'Data')"
        )


def load_tokens(spec: RunSpec) -> np.ndarray:
    """The run's corpus as token ids, uint8 (text) or uint16 (tokens), not checked."""
    if spec.data.source == EMBEDDED:
        tokens = np.frombuffer(embedded_corpus(), dtype=np.uint8)
    elif spec.data.source == STDLIB:
        files = stdlib_files()
        if not files:
            raise UserError(f"no .py files found in the standard library at {stdlib_root()}")
        tokens = _read_bytes(files)
    else:
        path = Path(spec.data.source).expanduser()
        if not path.exists():
            raise UserError(f"data path {path} does not exist")
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        if spec.data.data_format == "tokens":
            tokens = np.concatenate([np.fromfile(f, dtype=np.uint16) for f in files])
            if tokens.size and int(tokens.max()) >= spec.model.vocab_size:
                raise UserError(
                    f"token id {int(tokens.max())} >= vocab_size {spec.model.vocab_size}"
                )
        elif spec.data.tokenizer:
            tokens = _tokenize(spec, files)
        else:
            tokens = _read_bytes(files)
    if tokens.size < spec.model.block_size + 2:
        raise UserError(f"corpus has {tokens.size} tokens, fewer than block_size + 2")
    return tokens


def embedded_corpus() -> bytes:
    """The corpus shipped with p2ptrain, decompressed (about 50 ms)."""
    blob = resources.files("p2ptrain").joinpath("data", EMBEDDED_FILE).read_bytes()
    return lzma.decompress(blob)


def replica_rows(batch_size: int, num_replicas: int, replica: int) -> range:
    """Rows of the global batch that `replica` trains on: near-equal contiguous slices."""
    if not 0 <= replica < num_replicas <= batch_size:
        raise ValueError(f"replica {replica} of {num_replicas} with batch size {batch_size}")
    base, extra = divmod(batch_size, num_replicas)
    start = replica * base + min(replica, extra)
    return range(start, start + base + (1 if replica < extra else 0))


def get_batch(
    corpus: torch.Tensor, spec: RunSpec, step: int, rows: range | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets, each (len(rows), block_size) int64, for `rows` of step `step`'s batch."""
    rows = rows if rows is not None else range(spec.optim.batch_size)
    generator = torch.Generator().manual_seed(spec.optim.seed * 1_000_003 + step)
    offsets = torch.randint(
        0, corpus.numel() - spec.model.block_size - 1, (spec.optim.batch_size,), generator=generator
    )
    window = offsets[rows.start : rows.stop, None] + torch.arange(spec.model.block_size + 1)
    tokens = corpus[window].long()
    return tokens[:, :-1], tokens[:, 1:]


def _tokenize(spec: RunSpec, files: list[Path]) -> np.ndarray:
    """Text files through the run's Hugging Face tokenizer (its tokenizer.json), as uint16 ids:
    each file decoded as UTF-8 (bad bytes replaced) and encoded without special tokens."""
    from tokenizers import Tokenizer  # the train extra; only a run that names one needs it

    path = Path(spec.data.tokenizer).expanduser()
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:  # a missing file, or bytes that are not a tokenizer.json
        raise UserError(f"cannot load the tokenizer {path}: {exc}") from None
    if tokenizer.get_vocab_size() > spec.model.vocab_size:
        raise UserError(
            f"the tokenizer {path} has {tokenizer.get_vocab_size()} tokens: vocab_size "
            f"({spec.model.vocab_size}) must be at least that"
        )
    texts = [raw.decode("utf-8", errors="replace") for raw in _read_each(files)]
    encoded = tokenizer.encode_batch(texts, add_special_tokens=False)
    ids = [np.asarray(e.ids, dtype=np.uint16) for e in encoded]
    return np.concatenate(ids) if ids else np.zeros(0, dtype=np.uint16)


def _read_each(files: list[Path]) -> list[bytes]:
    try:
        return [f.read_bytes() for f in files]
    except OSError as exc:
        raise UserError(f"cannot read data file: {exc}") from exc


def _read_bytes(files: list[Path]) -> np.ndarray:
    return np.frombuffer(b"".join(_read_each(files)), dtype=np.uint8)
