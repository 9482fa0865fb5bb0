import pytest
import torch

from p2ptrain.records.run import RunSpec
from p2ptrain.train.model import (
    build_model,
    build_stage,
    loss_fn,
    stage_layer_ranges,
    token_row_spans,
)

TINY = RunSpec().replace(n_layer=3, n_head=2, n_embd=16, block_size=8, batch_size=4)


def test_layer_ranges_are_contiguous_and_cover_every_layer() -> None:
    assert stage_layer_ranges(5, 2) == [range(0, 3), range(3, 5)]
    assert stage_layer_ranges(4, 4) == [range(i, i + 1) for i in range(4)]
    with pytest.raises(ValueError):
        stage_layer_ranges(2, 3)


def test_stages_chained_equal_the_whole_model() -> None:
    whole = build_model(TINY)
    stages = [build_stage(TINY, s, 3) for s in range(3)]
    idx = torch.randint(0, 256, (2, TINY.model.block_size))
    x = idx
    for stage in stages:
        x = stage(x)
    assert torch.equal(x, whole(idx))  # same init per piece, same math
    assert stages[0].embed is not None and stages[0].head is None
    assert stages[2].head is not None and stages[2].embed is None
    assert sum(p.numel() for s in stages for p in s.parameters()) == sum(
        p.numel() for p in whole.parameters()
    )


def test_initial_loss_is_near_uniform() -> None:
    idx = torch.randint(0, 256, (4, TINY.model.block_size))
    loss = loss_fn(build_model(TINY)(idx), idx)
    assert abs(loss.item() - torch.log(torch.tensor(256.0)).item()) < 0.1


def test_seed_changes_weights() -> None:
    a, b = build_model(TINY), build_model(TINY.replace(seed=1))
    assert not torch.equal(a.blocks[0].attn.c_attn.weight, b.blocks[0].attn.c_attn.weight)


@pytest.mark.parametrize("family", ["nanogpt", "llama"])
def test_token_row_spans_mark_the_embedding_and_head_of_the_flat_vector(family: str) -> None:
    """The spans the averaging reducers bound apart (worker/averaging/robust.py): exactly the
    token embedding's and the head's weights, where they lie in model.parameters()' order."""
    spec = TINY.replace(model=family)
    for stage in [build_stage(spec, s, 3) for s in range(3)] + [build_model(spec)]:
        embed, head = stage.embed, stage.head
        table = getattr(embed, "wte", None) or getattr(embed, "embed_tokens", None)
        weights = [table.weight if table else None, head.lm_head.weight if head else None]
        wanted = {id(w) for w in weights if w is not None}
        spans, offset = [], 0
        for param in stage.parameters():
            if id(param) in wanted:
                spans.append((offset, offset + param.numel()))
            offset += param.numel()
        assert token_row_spans(stage) == spans
        assert len(spans) == (embed is not None) + (head is not None)
