"""A run's tokenizer.json is a user's file: load_tokens gives ids below vocab_size or one
UserError. Its count of tokens says nothing of its ids (a WordLevel vocab may be sparse): an id
of 60000 under vocab_size 256 was an IndexError in the embedding, and 70000 an OverflowError
(uint16) at load."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from p2ptrain.errors import UserError
from p2ptrain.records.run import RunSpec
from p2ptrain.train.data import load_tokens
from tests.records.test_fuzz import _mutate, _mutate_bytes


def _word_level(vocab: dict[str, int]) -> dict[str, Any]:
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"},
    }


def _spec(tmp_path: Path, tokenizer: Path) -> RunSpec:
    corpus = tmp_path / "corpus"
    corpus.mkdir(exist_ok=True)
    (corpus / "a.txt").write_text("a b c a b a " * 100)
    return RunSpec().replace(
        run_id="r",
        data=str(corpus),
        tokenizer=str(tokenizer),
        data_format="text",
        vocab_size=256,
        data_sha256="",
    )


def test_a_dense_vocab_gives_its_ids(tmp_path: Path) -> None:
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(_word_level({"[UNK]": 0, "a": 1, "b": 2, "c": 3})))
    tokens = load_tokens(_spec(tmp_path, path))
    assert tokens.dtype == np.uint16 and set(tokens.tolist()) == {1, 2, 3}


@pytest.mark.parametrize("big_id", [256, 60000, 65535, 65536, 70000, 2**32 - 1])
def test_an_id_past_vocab_size_is_a_user_error(tmp_path: Path, big_id: int) -> None:
    """Three entries, within vocab_size's count, and one id past it."""
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(_word_level({"[UNK]": 0, "a": big_id, "b": 2})))
    with pytest.raises(UserError, match=f"token id {big_id}"):
        load_tokens(_spec(tmp_path, path))


def test_a_tokenizer_that_loads_and_cannot_encode_is_a_user_error(tmp_path: Path) -> None:
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(_word_level({"a": 1, "b": 2})))  # "c" is unknown, no [UNK]
    with pytest.raises(UserError, match="cannot encode"):
        load_tokens(_spec(tmp_path, path))


def test_a_mutated_tokenizer_gives_ids_below_vocab_size_or_a_user_error(tmp_path: Path) -> None:
    sample = _word_level({"[UNK]": 0, "a": 1, "b": 2, "c": 3})
    path = tmp_path / "tokenizer.json"
    spec = _spec(tmp_path, path)
    rng = random.Random(41)
    num_loaded = 0
    for index in range(400):
        if index % 2:
            path.write_bytes(_mutate_bytes(rng, json.dumps(sample).encode()))
        else:
            try:
                path.write_text(json.dumps(_mutate(rng, sample)))
            except (ValueError, RecursionError):
                continue
        try:
            tokens = load_tokens(spec)
        except UserError as exc:
            assert str(exc) and "\n" not in str(exc)
            continue
        num_loaded += 1
        assert tokens.dtype == np.uint16 and int(tokens.max()) < spec.model.vocab_size
    assert 0 < num_loaded < 400
