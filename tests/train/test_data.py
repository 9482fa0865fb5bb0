from pathlib import Path

import numpy as np
import pytest
import torch

from p2ptrain.errors import UserError
from p2ptrain.records.run import RunSpec
from p2ptrain.train.data import (
    check_digest,
    corpus_sha256,
    get_batch,
    load_corpus,
    load_tokens,
    replica_rows,
    stdlib_files,
)

SPEC = RunSpec().replace(block_size=16, batch_size=10)


@pytest.fixture(scope="module")
def corpus() -> torch.Tensor:
    return load_corpus(SPEC)


# the shipped corpus's digest: the same on every peer, whatever its Python (a new corpus is a
# new file under a new name, harness/make_corpus.py)
EMBEDDED_SHA256 = "8d3088c05d7fb1251b127cfaf85214da47b0e5e660861e0dc50da008d9d75260"


def test_the_default_corpus_ships_with_p2ptrain_and_is_the_same_bytes_everywhere(
    corpus: torch.Tensor,
) -> None:
    assert SPEC.data.source == "embedded"
    assert corpus_sha256(load_tokens(SPEC)) == EMBEDDED_SHA256
    assert corpus.numel() > 2_000_000
    assert b"def " in bytes(corpus[:200_000].tolist())
    check_digest(SPEC.replace(data_sha256=EMBEDDED_SHA256), load_tokens(SPEC))


def test_the_interpreters_stdlib_is_still_a_corpus() -> None:
    names = {p.name for p in stdlib_files()}
    assert {"os.py", "functools.py"} <= names
    stdlib = load_corpus(SPEC.replace(data="stdlib"))
    assert stdlib.numel() > 1_000_000


def test_batch_is_a_pure_function_of_seed_and_step(corpus: torch.Tensor) -> None:
    x1, y1 = get_batch(corpus, SPEC, step=3)
    x2, y2 = get_batch(corpus, SPEC, step=3)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert torch.equal(x1[:, 1:], y1[:, :-1])  # targets are inputs shifted by one
    assert not torch.equal(x1, get_batch(corpus, SPEC, step=4)[0])
    assert not torch.equal(x1, get_batch(corpus, SPEC.replace(seed=9), step=3)[0])


@pytest.mark.parametrize("num_replicas", [1, 2, 3, 4])
def test_replica_slices_concatenate_to_the_global_batch(
    corpus: torch.Tensor, num_replicas: int
) -> None:
    full, _ = get_batch(corpus, SPEC, step=0)
    rows = [replica_rows(SPEC.optim.batch_size, num_replicas, r) for r in range(num_replicas)]
    parts = [get_batch(corpus, SPEC, 0, r)[0] for r in rows]
    assert torch.equal(torch.cat(parts), full)
    assert max(len(r) for r in rows) - min(len(r) for r in rows) <= 1


def test_local_text_and_token_files(tmp_path: Path) -> None:
    text = tmp_path / "a.txt"
    text.write_bytes(b"hello world " * 10)
    assert load_corpus(SPEC.replace(data=str(text))).numel() == 120
    tokens = tmp_path / "t.bin"
    np.arange(300, dtype=np.uint16).tofile(tokens)
    corpus = load_corpus(SPEC.replace(data=str(tokens), data_format="tokens", vocab_size=300))
    assert corpus[-1].item() == 299
    with pytest.raises(UserError, match="vocab_size"):
        load_corpus(SPEC.replace(data=str(tokens), data_format="tokens", vocab_size=256))
    with pytest.raises(UserError, match="does not exist"):
        load_corpus(SPEC.replace(data=str(text) + ".missing"))


def test_a_pinned_digest_is_checked_and_a_mismatch_names_both(tmp_path: Path) -> None:
    import hashlib

    from p2ptrain.train.data import corpus_sha256, load_tokens

    path = tmp_path / "corpus.txt"
    path.write_bytes(b"some bytes of text to train on, " * 10)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    spec = RunSpec().replace(data=str(path), block_size=16, data_sha256=digest)
    assert corpus_sha256(load_tokens(spec)) == digest  # a one-file text corpus: its sha256sum
    assert load_corpus(spec).numel() == 320
    path.write_bytes(b"other bytes under the same name, " * 10)
    mine = hashlib.sha256(path.read_bytes()).hexdigest()
    with pytest.raises(UserError) as refused:
        load_corpus(spec)
    assert digest in str(refused.value) and mine in str(refused.value)


def test_token_corpora_digest_their_little_endian_ids(tmp_path: Path) -> None:
    from p2ptrain.train.data import corpus_sha256, load_tokens

    ids = np.arange(300, dtype="<u2")
    (tmp_path / "train.bin").write_bytes(ids.tobytes())
    spec = RunSpec().replace(
        data=str(tmp_path / "train.bin"), data_format="tokens", vocab_size=512, block_size=16
    )
    tokens = load_tokens(spec)
    assert corpus_sha256(tokens) == corpus_sha256(tokens.astype(">u2"))  # byte order never counts
    import hashlib

    assert corpus_sha256(tokens) == hashlib.sha256(ids.tobytes()).hexdigest()


@pytest.mark.parametrize("bad", ["abc", "A" * 64, "g" * 64, "0" * 63])
def test_data_sha256_must_be_64_lowercase_hex(bad: str) -> None:
    with pytest.raises(UserError, match="data_sha256"):
        RunSpec().replace(data_sha256=bad)
    assert RunSpec().replace(data_sha256="0" * 64).data.data_sha256 == "0" * 64


def _train_tokenizer(path: Path, texts: list[str]) -> int:
    """A small byte-level BPE tokenizer.json, trained here (no download); its vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(texts, trainer)
    tokenizer.save(str(path))
    return int(tokenizer.get_vocab_size())


def test_text_through_a_hugging_face_tokenizer(tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    text = "def add(a, b):\n    return a + b\n" * 200 + "class Point:\n    x: int = 0\n" * 200
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.txt").write_text(text[:6000])
    (tmp_path / "data" / "b.txt").write_text(text[6000:])
    vocab = _train_tokenizer(tmp_path / "tokenizer.json", [text])
    spec = RunSpec().replace(
        data=str(tmp_path / "data"),
        tokenizer=str(tmp_path / "tokenizer.json"),
        vocab_size=vocab,
        block_size=16,
    )
    tokens = load_tokens(spec)
    assert tokens.dtype == np.uint16 and int(tokens.max()) < vocab
    assert tokens.size < 0.9 * len(text)  # merges: fewer tokens than bytes
    decoded = Tokenizer.from_file(spec.data.tokenizer).decode(tokens.tolist())
    assert decoded == text  # the files in order, nothing lost
    assert load_corpus(spec).dtype == torch.int64
    # the digest covers the ids, so a different tokenizer is a different corpus
    assert corpus_sha256(tokens) != corpus_sha256(load_tokens(spec.replace(tokenizer="")))


def test_a_tokenizer_larger_than_the_vocabulary_or_unreadable_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("x = 1\n" * 500)
    vocab = _train_tokenizer(tmp_path / "tokenizer.json", ["x = 1\n" * 500])
    spec = RunSpec().replace(
        data=str(tmp_path / "a.txt"),
        tokenizer=str(tmp_path / "tokenizer.json"),
        vocab_size=vocab - 1,
        block_size=16,
    )
    with pytest.raises(UserError, match="vocab_size"):
        load_tokens(spec)
    (tmp_path / "bad.json").write_text("{not a tokenizer")
    with pytest.raises(UserError, match="cannot load the tokenizer"):
        load_tokens(spec.replace(tokenizer=str(tmp_path / "bad.json"), vocab_size=vocab))
    with pytest.raises(UserError, match="tokenizer"):
        RunSpec().replace(tokenizer="t.json", data_format="tokens")
