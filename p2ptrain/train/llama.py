"""The Llama family's pieces: RMSNorm, rotary positions, grouped-query attention, SwiGLU MLP.

Same layout as model.py's nanoGPT pieces (embedding, block, head), which model.py's `Stage`
assembles. Parameter names are Hugging Face LlamaForCausalLM's below the piece: a block's
`self_attn.q_proj.weight` is HF's `model.layers.N.self_attn.q_proj.weight`, the embedding's
`embed_tokens` and the head's `norm` and `lm_head` are `model.embed_tokens`, `model.norm` and
`lm_head` (train/export.py renames, nothing else). No biases, as in Llama.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from p2ptrain.records.model_config import ModelConfig


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in fp32 (as Hugging Face does, so exports match)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotary_tables(
    config: ModelConfig, seq_len: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, each (T, head_dim): position t turns the pair (i, i + head_dim/2) by
    t * theta^(-2i/head_dim) (the half-split layout of Hugging Face's Llama)."""
    dim = config.head_dim
    inv_freq = 1.0 / config.rope_theta ** (torch.arange(0, dim, 2, device=device).float() / dim)
    angles = torch.outer(torch.arange(seq_len, device=device).float(), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (B, nh, T, hs) queries or keys by their positions."""
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-second, first), dim=-1) * sin


class LlamaAttention(nn.Module):
    """Causal self-attention with rotary positions; n_kv_head key/value heads, each shared by
    n_head / n_kv_head query heads (grouped-query attention; = n_head: multi-head)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        hs = config.head_dim
        self.q_proj = nn.Linear(config.n_embd, config.n_head * hs, bias=False)
        self.k_proj = nn.Linear(config.n_embd, config.n_kv_head * hs, bias=False)
        self.v_proj = nn.Linear(config.n_embd, config.n_kv_head * hs, bias=False)
        self.o_proj = nn.Linear(config.n_head * hs, config.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        nh, nkv, hs = self.config.n_head, self.config.n_kv_head, self.config.head_dim
        # (B, T, heads * hs) -> (B, heads, T, hs)
        q = self.q_proj(x).view(B, T, nh, hs).transpose(1, 2)
        k = self.k_proj(x).view(B, T, nkv, hs).transpose(1, 2)
        v = self.v_proj(x).view(B, T, nkv, hs).transpose(1, 2)
        cos, sin = rotary_tables(self.config, T, x.device)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if nkv != nh:  # query head h reads key/value head h // (nh / nkv)
            k = k.repeat_interleave(nh // nkv, dim=1)
            v = v.repeat_interleave(nh // nkv, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, nh * hs))


class LlamaMLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.n_embd, config.n_inner, bias=False)
        self.up_proj = nn.Linear(config.n_embd, config.n_inner, bias=False)
        self.down_proj = nn.Linear(config.n_inner, config.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaBlock(nn.Module):
    """Hugging Face's LlamaDecoderLayer: pre-norm attention and MLP, each added to the stream."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.n_embd, config.rms_norm_eps)
        self.self_attn = LlamaAttention(config)
        self.post_attention_layernorm = RMSNorm(config.n_embd, config.rms_norm_eps)
        self.mlp = LlamaMLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaEmbedding(nn.Module):
    """Token embedding only (positions are rotary, inside attention): (B, T) -> (B, T, C)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.n_embd)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(idx)


class LlamaHead(nn.Module):
    """Final RMSNorm and the language-model head: (B, T, C) -> (B, T, vocab) logits. With tied
    embeddings the head has no weight of its own: it reads `tied_to`'s (one stage holds both)."""

    def __init__(self, config: ModelConfig, tied_to: nn.Embedding | None = None) -> None:
        super().__init__()
        self.norm = RMSNorm(config.n_embd, config.rms_norm_eps)
        self.lm_head = (
            None if tied_to is not None else nn.Linear(config.n_embd, config.vocab_size, bias=False)
        )
        # a tuple, not an attribute: a module attribute would register the embedding twice
        self._tied_to: tuple[nn.Embedding, ...] = (tied_to,) if tied_to is not None else ()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.lm_head.weight if self.lm_head is not None else self._tied_to[0].weight
        return F.linear(self.norm(x), weight)
