"""The run's decoder, cut into pipeline stages: the nanoGPT family here, the Llama family's
pieces in train/llama.py, one `Stage` for both.

Reads top-down: attention -> MLP -> block -> embedding -> head (nanoGPT) -> the family dispatch ->
stage. The model's sizes are the run spec's `ModelConfig` (records/model_config.py). A stage holds
a contiguous range of blocks; the first stage also holds the embedding, the last the head and
loss. The whole model is simply the one stage that holds everything.

Every piece is initialized from its own seeded generator (keyed by the run seed and the piece's
name), so a peer that builds only layers 2..3 gets exactly the weights a single process would.
No weight tying between embedding and head, since they live on different peers, except in a
one-stage Llama run that asks for it (`tie_word_embeddings`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from p2ptrain.records.model_config import ModelConfig
from p2ptrain.records.run import RunSpec
from p2ptrain.train.llama import LlamaBlock, LlamaEmbedding, LlamaHead

# the output projections of the residual branches: their init is scaled down by depth
RESIDUAL_PROJECTIONS = ("c_proj", "o_proj", "down_proj")
# the weights with a row per token of the vocabulary (both families' token embedding and head)
TOKEN_ROW_WEIGHTS = ("wte.weight", "embed_tokens.weight", "lm_head.weight")


class CausalSelfAttention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        # (B, T, C) -> (B, nh, T, hs)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Embedding(nn.Module):
    """Token + position embedding: (B, T) token ids -> (B, T, C)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.wte(idx) + self.wpe(pos)


class Head(nn.Module):
    """Final layer norm and the language-model head: (B, T, C) -> (B, T, vocab) logits."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.ln_f(x))


def make_embedding(config: ModelConfig) -> nn.Module:
    """The family's embedding: token ids (B, T) -> hidden states (B, T, C)."""
    return Embedding(config) if config.family == "nanogpt" else LlamaEmbedding(config)


def make_block(config: ModelConfig) -> nn.Module:
    """One of the family's transformer blocks: (B, T, C) -> (B, T, C)."""
    return Block(config) if config.family == "nanogpt" else LlamaBlock(config)


def make_head(config: ModelConfig, embedding: nn.Module | None = None) -> nn.Module:
    """The family's final norm and head: (B, T, C) -> (B, T, vocab); `embedding`: the one whose
    weight a tied head reads (llama, tie_word_embeddings)."""
    if config.family == "nanogpt":
        return Head(config)
    if config.tie_word_embeddings and isinstance(embedding, LlamaEmbedding):
        return LlamaHead(config, tied_to=embedding.embed_tokens)
    return LlamaHead(config)


def stage_layer_ranges(n_layer: int, num_stages: int) -> list[range]:
    """Contiguous, near-equal block ranges, earlier stages taking the remainder."""
    if not 1 <= num_stages <= n_layer:
        raise ValueError(f"cannot cut {n_layer} layers into {num_stages} stages")
    return even_ranges(n_layer, num_stages)


def even_ranges(total: int, parts: int) -> list[range]:
    """Cut range(total) into `parts` contiguous near-equal ranges, earlier ones taking the rest."""
    base, extra = divmod(total, parts)
    ranges, start = [], 0
    for i in range(parts):
        size = base + (1 if i < extra else 0)
        ranges.append(range(start, start + size))
        start += size
    return ranges


class Stage(nn.Module):
    """Blocks `layers` of the model, plus the embedding (first stage) and the head (last stage).

    forward: token ids (B, T) on the first stage, hidden states (B, T, C) otherwise;
    returns logits (B, T, vocab) on the last stage, hidden states (B, T, C) otherwise.
    """

    def __init__(self, config: ModelConfig, layers: range, seed: int) -> None:
        super().__init__()
        self.config = config
        self.layers = layers
        self.is_first = layers.start == 0
        self.is_last = layers.stop == config.n_layer
        if config.tie_word_embeddings and not (self.is_first and self.is_last):
            raise ValueError("a tied head needs the embedding on its stage: one stage only")
        self.embed = make_embedding(config) if self.is_first else None
        self.blocks = nn.ModuleList(make_block(config) for _ in layers)
        self.head = make_head(config, self.embed) if self.is_last else None
        if self.embed is not None:
            _init_piece(self.embed, seed, "embed", config)
        for layer, block in zip(layers, self.blocks, strict=True):
            _init_piece(block, seed, f"block{layer}", config)
        if self.head is not None:
            _init_piece(self.head, seed, "head", config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        if self.head is not None:
            x = self.head(x)
        return x


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over every token of the batch."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def token_row_spans(model: nn.Module) -> list[tuple[int, int]]:
    """Where the weights with a row per token lie in the flat vector of `model.parameters()`
    (in that order): a batch's gradient there has rows only for the tokens it holds, and far
    larger ones for tokens it repeats (worker/averaging/robust.py bounds them apart)."""
    spans, offset = [], 0
    names = {id(param): name for name, param in model.named_parameters()}
    for param in model.parameters():
        if names[id(param)].endswith(TOKEN_ROW_WEIGHTS):
            spans.append((offset, offset + param.numel()))
        offset += param.numel()
    return spans


def build_stage(spec: RunSpec, stage: int, num_stages: int) -> Stage:
    """The `stage`-th of `num_stages` near-equal stages of the run's model, initialized from the
    run seed."""
    return build_layers(spec, stage_layer_ranges(spec.model.n_layer, num_stages)[stage])


def build_layers(spec: RunSpec, layers: range) -> Stage:
    """The stage of the run's model that holds blocks `layers` (a plan's cut: Plan.layer_ranges),
    initialized from the run seed."""
    return Stage(spec.model_config(), layers, spec.optim.seed)


def build_model(spec: RunSpec) -> Stage:
    """The whole model as a single stage (the reference for every pipeline)."""
    return build_stage(spec, 0, 1)


def _init_piece(module: nn.Module, seed: int, name: str, config: ModelConfig) -> None:
    # GPT-2 init (normal 0.02, residual projections scaled by depth; both families) from a
    # generator of our own: a piece's weights depend only on (seed, name), never on which other
    # pieces exist.
    generator = torch.Generator().manual_seed(_piece_seed(seed, name))
    for param_name, param in module.named_parameters():
        with torch.no_grad():
            if param_name.endswith("bias"):
                param.zero_()
            elif param.dim() == 1:  # layer-norm and RMSNorm gains
                param.fill_(1.0)
            else:
                residual = any(proj in param_name for proj in RESIDUAL_PROJECTIONS)
                std = 0.02 / math.sqrt(2 * config.n_layer) if residual else 0.02
                param.normal_(0.0, std, generator=generator)


def _piece_seed(seed: int, name: str) -> int:
    # a stable (not hash()-randomized) mix of the run seed and the piece name
    value = seed * 1_000_003 + 7
    for char in name.encode():
        value = (value * 131 + char) % (2**61 - 1)
    return value
