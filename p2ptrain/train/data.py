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

A local source comes from the organiser's signed run spec, so a volunteer reads it with care: only
regular files (no devices, FIFOs or sockets; a directory is walked without following symlinks), at
most MAX_DATA_BYTES in all, never the filesystem root, the home directory itself or a path with "..".
"""

from __future__ import annotations

import hashlib
import logging
import lzma
import os
import stat
import sysconfig
from importlib import resources
from pathlib import Path

import numpy as np
import torch

from p2ptrain.durable import NotRegularFile, open_regular
from p2ptrain.errors import UserError
from p2ptrain.records.run import RunSpec

STDLIB = "stdlib"
EMBEDDED = "embedded"
EMBEDDED_FILE = "corpus.txt.xz"  # in the package's data folder, beside its licence
# a local corpus past this is refused, not read: far above any corpus a volunteer trains on
MAX_DATA_BYTES = 64 * 1024**3
MAX_TOKENIZER_BYTES = 1024**3  # a tokenizer.json is megabytes
READ_CHUNK_BYTES = 64 * 1024**2

log = logging.getLogger(__name__)


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
        path = _local_source(spec.data.source)
        if not spec.data.data_sha256:
            log.warning(
                "the run does not pin its data (data_sha256 is empty): this peer trains on "
                "whatever %s holds here; `p2ptrain digest --run RUN.toml` prints the line to pin it",
                path,
            )
        files = _data_files(path)
        if spec.data.data_format == "tokens":
            tokens = np.concatenate([_token_ids(raw) for raw in _read_each(files)])
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
    each file decoded as UTF-8 (bad bytes replaced) and encoded without special tokens;
    UserError if an id is not below vocab_size (a sparse vocab's count says nothing of its ids)."""
    from tokenizers import Tokenizer  # the train extra; only a run that names one needs it

    path = _local_source(spec.data.tokenizer, what="tokenizer")
    _read_regular(path, MAX_TOKENIZER_BYTES)  # a regular file of sane size, before the library
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
    try:
        encoded = tokenizer.encode_batch(texts, add_special_tokens=False)
    except Exception as exc:  # a tokenizer that loads and cannot encode (no [UNK] in its vocab)
        raise UserError(f"the tokenizer {path} cannot encode the data: {exc}") from None
    ids = np.concatenate([np.zeros(0, np.int64)] + [np.asarray(e.ids, np.int64) for e in encoded])
    if ids.size and int(ids.max()) >= spec.model.vocab_size:  # a sparse vocab's id past its count
        raise UserError(
            f"the tokenizer {path} gave token id {int(ids.max())}: vocab_size "
            f"({spec.model.vocab_size}) must be above every id it gives"
        )
    return ids.astype(np.uint16)  # ids are >= 0 and vocab_size <= 65536: each one fits


def _local_source(source: str, what: str = "data") -> Path:
    """The run's local path, expanded: UserError for "..", a missing path, "/" or the home
    directory itself (a spec must name its data, not everything this volunteer holds)."""
    if ".." in Path(source).parts:
        raise UserError(f"{what} path {source!r} has a '..' component: name the path itself")
    path = Path(source).expanduser()
    if not path.exists():
        raise UserError(f"{what} path {path} does not exist")
    real = path.resolve()
    if real == Path(real.anchor) or real == Path(os.path.expanduser("~")).resolve():
        raise UserError(f"{what} path {source!r} is the filesystem root or the home directory")
    return path


def _data_files(path: Path) -> list[Path]:
    """`path` itself, or a directory's regular files in a stable order (symlinks not followed)."""
    if not path.is_dir():
        return [path]

    def refuse(exc: OSError) -> None:
        raise UserError(f"cannot read data directory: {exc}")

    files = []
    for folder, _, names in os.walk(path, onerror=refuse, followlinks=False):
        for name in names:
            file = Path(folder, name)
            try:
                regular = stat.S_ISREG(file.lstat().st_mode)
            except OSError as exc:
                raise UserError(f"cannot read data file: {exc}") from None
            if regular:
                files.append(file)
    if not files:
        raise UserError(f"data directory {path} holds no regular files")
    return sorted(files)


def _read_regular(path: Path, max_bytes: int, cap_bytes: int = 0) -> bytes:
    """A regular file's bytes, at most `max_bytes` of them (of a cap of `cap_bytes`, for the
    message); UserError for anything else (a device, FIFO or socket would never end or start)."""
    try:
        if not stat.S_ISREG(path.stat().st_mode):  # a socket cannot even be opened
            raise NotRegularFile(0, "not a regular file", str(path))
        with open_regular(path, follow_symlinks=True) as file:  # never blocks on a FIFO
            info = os.fstat(file.fileno())
            # chunks, and the size first: read(max_bytes + 1) alone would allocate the whole cap
            chunks, size_bytes = [], 0
            while info.st_size <= max_bytes and size_bytes <= max_bytes:
                if not (chunk := file.read(READ_CHUNK_BYTES)):
                    break
                chunks.append(chunk)
                size_bytes += len(chunk)
    except NotRegularFile:
        raise UserError(f"{path} is not a regular file") from None
    except OSError as exc:
        raise UserError(f"cannot read data file: {exc}") from None
    if max(size_bytes, info.st_size) > max_bytes:
        raise UserError(f"{path}: larger than the {cap_bytes or max_bytes} bytes a peer will read")
    return b"".join(chunks)


def _read_each(files: list[Path]) -> list[bytes]:
    """Each file's bytes, all of them together at most MAX_DATA_BYTES."""
    chunks: list[bytes] = []
    left_bytes = MAX_DATA_BYTES
    for path in files:
        chunks.append(_read_regular(path, left_bytes, MAX_DATA_BYTES))
        left_bytes -= len(chunks[-1])
    return chunks


def _read_bytes(files: list[Path]) -> np.ndarray:
    return np.frombuffer(b"".join(_read_each(files)), dtype=np.uint8)


def _token_ids(raw: bytes) -> np.ndarray:
    """A token file's uint16 ids (a trailing odd byte dropped, as np.fromfile does)."""
    return np.frombuffer(raw[: len(raw) - len(raw) % 2], dtype=np.uint16)
