"""The Llama family: stage cuts, rotary positions, grouped-query attention, tied embeddings, and
pipelines that reproduce the one-process reference trainer."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from p2ptrain.errors import UserError
from p2ptrain.records.run import RunSpec
from p2ptrain.schedule.workload import stage_parameter_counts
from p2ptrain.train.checkpoint import record_step
from p2ptrain.train.checkpoint_folder import stamped_path
from p2ptrain.train.checkpoint_read import read_state
from p2ptrain.train.data import get_batch, load_corpus
from p2ptrain.train.llama import LlamaAttention, apply_rotary, rotary_tables
from p2ptrain.train.model import Stage, build_layers, build_model, build_stage, loss_fn
from p2ptrain.train.optim import clip_grads, lr_at, make_optimizer, set_lr
from p2ptrain.train.recut import assemble
from p2ptrain.train.reference import micro_batch_rows, train_reference
from p2ptrain.train.snapshot import StageSnapshot
from p2ptrain.worker.compute_probe import measure_stage_compute

TINY = RunSpec().replace(
    model="llama", preset="tiny", block_size=16, batch_size=4
)  # 2 x 64, GQA 4:2
DEEP = RunSpec().replace(
    model="llama", n_layer=3, n_head=4, n_embd=32, num_key_value_heads=1, block_size=8
)


@pytest.mark.parametrize("spec", [TINY, DEEP], ids=["tiny", "3-layers-mqa"])
def test_stages_chained_equal_the_whole_model(spec: RunSpec) -> None:
    idx = torch.randint(0, spec.model.vocab_size, (2, spec.model.block_size))
    whole = build_model(spec)
    for num_stages in range(2, spec.model.n_layer + 1):
        stages = [build_stage(spec, s, num_stages) for s in range(num_stages)]
        x = idx
        for stage in stages:
            x = stage(x)
        assert torch.equal(x, whole(idx))  # same init per piece, same math
        assert sum(p.numel() for s in stages for p in s.parameters()) == sum(
            p.numel() for p in whole.parameters()
        )


def test_parameters_have_hugging_face_s_names_below_the_piece() -> None:
    names = set(build_model(TINY).state_dict())
    block = {
        f"blocks.1.{n}.weight"
        for n in (
            "input_layernorm",
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.o_proj",
            "post_attention_layernorm",
            "mlp.gate_proj",
            "mlp.up_proj",
            "mlp.down_proj",
        )
    }
    assert block <= names
    assert {"embed.embed_tokens.weight", "head.norm.weight", "head.lm_head.weight"} <= names
    assert not any(n.endswith("bias") for n in names)  # Llama has none


def test_a_1_3b_preset_has_the_paper_s_shape() -> None:
    config = RunSpec().replace(model="llama", preset="1.3b").model_config()
    assert (config.n_layer, config.n_embd, config.n_head, config.n_inner) == (24, 2048, 16, 5632)
    with torch.device("meta"):
        whole = build_model(RunSpec().replace(model="llama", preset="1.3b"))
    assert 1.2e9 < sum(p.numel() for p in whole.parameters()) < 1.3e9


def test_initial_loss_is_near_uniform() -> None:
    idx = torch.randint(0, 256, (4, TINY.model.block_size))
    loss = loss_fn(build_model(TINY)(idx), idx)
    assert abs(loss.item() - math.log(256)) < 0.1


def test_the_model_is_causal() -> None:
    model = build_model(TINY)
    idx = torch.randint(0, 256, (1, TINY.model.block_size))
    changed = idx.clone()
    changed[0, 10:] = (changed[0, 10:] + 1) % 256
    torch.testing.assert_close(model(idx)[:, :10], model(changed)[:, :10])
    assert not torch.allclose(model(idx)[:, 10:], model(changed)[:, 10:])


def test_rotary_scores_depend_only_on_relative_position() -> None:
    config = TINY.model_config()
    cos, sin = rotary_tables(config, 12, torch.device("cpu"))
    q, k = torch.randn(config.head_dim), torch.randn(config.head_dim)
    # the same vector at every position: (1, 1, T, hs)
    rq = apply_rotary(q.expand(1, 1, 12, -1), cos, sin)[0, 0]
    rk = apply_rotary(k.expand(1, 1, 12, -1), cos, sin)[0, 0]
    torch.testing.assert_close(rq.norm(dim=-1), q.norm().expand(12))  # a rotation
    for shift in (1, 5):
        torch.testing.assert_close(rq[2] @ rk[0], rq[2 + shift] @ rk[shift])
    torch.testing.assert_close(rq[0], q)  # position 0 is not turned


def test_grouped_query_attention_shares_each_kv_head_among_its_query_group() -> None:
    """n_kv_head 2 of 4 heads equals multi-head attention whose key/value heads are copies:
    query heads 0 and 1 read kv head 0, heads 2 and 3 kv head 1 (Hugging Face's repeat_kv)."""
    gqa_config = TINY.model_config()
    mha_config = TINY.replace(num_key_value_heads=4).model_config()
    gqa, mha = LlamaAttention(gqa_config), LlamaAttention(mha_config)
    hs, group = gqa_config.head_dim, gqa_config.n_head // gqa_config.n_kv_head
    assert gqa.k_proj.weight.shape == (gqa_config.n_kv_head * hs, gqa_config.n_embd)
    with torch.no_grad():
        mha.q_proj.weight.copy_(gqa.q_proj.weight)
        mha.o_proj.weight.copy_(gqa.o_proj.weight)
        for name in ("k_proj", "v_proj"):
            heads = getattr(gqa, name).weight.view(gqa_config.n_kv_head, hs, -1)
            getattr(mha, name).weight.copy_(heads.repeat_interleave(group, dim=0).flatten(0, 1))
    x = torch.randn(2, 16, gqa_config.n_embd)
    torch.testing.assert_close(gqa(x), mha(x))


def test_tied_embeddings_share_one_weight_on_a_one_stage_run() -> None:
    spec = TINY.replace(stages=1, tie_word_embeddings=True)
    model = build_model(spec)
    assert "head.lm_head.weight" not in model.state_dict()
    assert model.head is not None and model.embed is not None
    idx = torch.randint(0, 256, (2, spec.model.block_size))
    loss_fn(model(idx), idx).backward()
    untied = {n for n, _ in build_model(spec.replace(tie_word_embeddings=False)).named_parameters()}
    assert {n for n, _ in model.named_parameters()} == untied - {"head.lm_head.weight"}
    with pytest.raises(UserError, match="stages = 1"):
        TINY.replace(tie_word_embeddings=True)  # stages = 2: the head would be on another peer
    with pytest.raises(ValueError, match="one stage"):
        Stage(spec.model_config(), range(0, 1), 0)


def train_pipeline(spec: RunSpec, stages: list[Stage], steps: int) -> list[float]:
    """GPipe in one process: a stage per module and optimizer, activations handed on detached
    and their gradients handed back, as the workers do over the network; per-step losses."""
    optimizers = [make_optimizer(stage, spec) for stage in stages]
    corpus = load_corpus(spec)
    losses = []
    for step in range(steps):
        for optimizer in optimizers:
            set_lr(optimizer, lr_at(step, spec))
        x, y = get_batch(corpus, spec, step)
        total = 0.0
        for rows in micro_batch_rows(x.shape[0], spec.optim.micro_batches):
            inputs, outputs = [], []
            h = x[rows.start : rows.stop]
            for stage in stages:
                h = h.detach().requires_grad_(h.is_floating_point())
                inputs.append(h)
                h = stage(h)
                outputs.append(h)
            loss = loss_fn(h, y[rows.start : rows.stop]) * (len(rows) / x.shape[0])
            loss.backward()
            total += loss.item()
            for s in reversed(range(len(stages) - 1)):
                outputs[s].backward(inputs[s + 1].grad)
        for stage, optimizer in zip(stages, optimizers, strict=True):
            clip_grads(stage, spec.optim.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        losses.append(total)
    return losses


def pipeline_loss(spec: RunSpec, stages: list[Stage], step: int) -> float:
    """The pipeline's loss on step `step`'s batch, without training."""
    x, y = get_batch(load_corpus(spec), spec, step)
    with torch.no_grad():
        for stage in stages:
            x = stage(x)
        return float(loss_fn(x, y))


def test_a_pipeline_of_llama_stages_trains_like_the_reference() -> None:
    spec = DEEP.replace(stages=3, batch_size=6, micro_batches=3, steps=4)
    expected = train_reference(spec)
    stages = [build_stage(spec, s, 3) for s in range(3)]
    torch.testing.assert_close(train_pipeline(spec, stages, 4), expected, rtol=1e-5, atol=0)


@pytest.mark.slow
def test_the_125m_preset_trains_three_steps_as_a_two_stage_pipeline() -> None:
    """85M parameters (vocabulary 256): the pipeline's losses are the reference's, and after
    three steps the loss on the first batch is lower (each step draws another batch, so the
    per-step losses of three steps need not fall)."""
    spec = RunSpec().replace(
        model="llama",
        preset="125m",
        block_size=32,
        batch_size=2,
        micro_batches=2,
        steps=3,
        lr=1e-4,
        min_lr=1e-5,
    )
    stages = [build_stage(spec, s, 2) for s in range(2)]
    losses = train_pipeline(spec, stages, 3)
    torch.testing.assert_close(losses, train_reference(spec), rtol=1e-4, atol=0)
    assert all(math.isfinite(loss) for loss in losses)
    assert pipeline_loss(spec, stages, 0) < losses[0] - 0.1


def test_a_llama_stage_is_recut_from_the_states_of_another_cut(tmp_path: Path) -> None:
    spec = DEEP.replace(stages=3, steps=10)
    old = [build_stage(spec, s, 3) for s in range(3)]
    sources = []
    for stage in old:
        optimizer = make_optimizer(stage, spec)
        x = (
            torch.randint(0, 256, (2, 8))
            if stage.is_first
            else torch.randn(2, 8, spec.model.n_embd)
        )
        stage(x).pow(2).mean().backward()
        optimizer.step()
        record_step(tmp_path, spec, stage, StageSnapshot.take(stage, optimizer, 1))
        sources.append(
            (stage.layers, read_state(stamped_path(tmp_path, stage.layers, 1), spec, stage.layers))
        )
    new = build_layers(spec, range(1, 3))  # L1-3 from L1-2 and L2-3
    optimizer = make_optimizer(new, spec)
    assemble(spec, new, optimizer, sources)
    expected = {
        **old[1].state_dict(),
        **{n.replace("blocks.0.", "blocks.1.", 1): t for n, t in old[2].state_dict().items()},
    }
    assert new.state_dict().keys() == expected.keys()
    assert all(torch.equal(t, expected[n]) for n, t in new.state_dict().items())
    assert len(optimizer.state_dict()["state"]) == len(list(new.parameters()))


def test_the_traffic_model_and_the_compute_probe_know_the_llama_family() -> None:
    spec = DEEP.replace(stages=2)
    stages = [build_stage(spec, s, 2) for s in range(2)]
    counts = [sum(p.numel() for p in stage.parameters()) for stage in stages]
    assert stage_parameter_counts(spec, 2) == counts
    compute = measure_stage_compute(spec)
    assert min(compute.block_row_s, compute.embed_row_s, compute.head_row_s) > 0
