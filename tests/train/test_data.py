from pathlib import Path

import numpy as np
import pytest
import torch

from p2ptrain.errors import UserError
from p2ptrain.records.run import RunSpec
from p2ptrain.train.data import get_batch, load_corpus, replica_rows, stdlib_files

SPEC = RunSpec(block_size=16, batch_size=10)


@pytest.fixture(scope="module")
def corpus() -> torch.Tensor:
    return load_corpus(SPEC)


def test_default_corpus_is_this_interpreters_stdlib(corpus: torch.Tensor) -> None:
    names = {p.name for p in stdlib_files()}
    assert {"os.py", "functools.py"} <= names
    assert corpus.numel() > 1_000_000
    assert b"def " in bytes(corpus[:200_000].tolist())


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
    rows = [replica_rows(SPEC.batch_size, num_replicas, r) for r in range(num_replicas)]
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
