"""The model a run trains, resolved from its run spec: family, presets and every size (stdlib).

Two families: "nanogpt" (GPT-2 style: learned positions, layer norm, GELU MLP, biases) and
"llama" (rotary positions, RMSNorm, SwiGLU MLP, grouped-query attention, no biases). A preset
names a whole shape. `ModelConfig` is what the
model code (train/), the memory estimate and the traffic model (schedule/) read: one value that
says everything about the model's shape, so no two places derive a size differently.
"""

from __future__ import annotations

from dataclasses import dataclass

from p2ptrain.errors import UserError

FAMILIES = ("nanogpt", "llama")
LLAMA_MLP_MULTIPLE = 256  # Llama rounds its SwiGLU width up to a multiple of this
DEFAULT_RMS_NORM_EPS = 1e-5
DEFAULT_ROPE_THETA = 10_000.0


@dataclass(frozen=True)
class Preset:
    """A named shape: depth, heads, width and (llama only) key/value heads (0 = n_head)."""

    n_layer: int
    n_head: int
    n_embd: int
    n_kv_head: int = 0


# GPT-2 small/medium, the paper's GPT-3 XL shape (24 x 2048), Llama-1/2 7B; vocabulary and
# context length stay the run's (vocab_size, block_size). "tiny" is for tests: llama's has GQA.
PRESETS = {
    "tiny": Preset(n_layer=2, n_head=4, n_embd=64, n_kv_head=2),
    "125m": Preset(n_layer=12, n_head=12, n_embd=768),
    "350m": Preset(n_layer=24, n_head=16, n_embd=1024),
    "1.3b": Preset(n_layer=24, n_head=16, n_embd=2048),
    "7b": Preset(n_layer=32, n_head=32, n_embd=4096),
}


@dataclass(frozen=True)
class ModelConfig:
    """Every size of the run's model. For nanogpt, n_kv_head = n_head, n_inner = 4 n_embd, and
    rms_norm_eps and rope_theta are 0 (it has layer norms and learned positions)."""

    family: str
    n_layer: int
    n_head: int
    n_embd: int
    block_size: int
    vocab_size: int
    n_kv_head: int  # key/value heads (Hugging Face: num_key_value_heads)
    n_inner: int  # the MLP's hidden width (Hugging Face: intermediate_size / n_inner)
    rms_norm_eps: float
    rope_theta: float
    tie_word_embeddings: bool  # the head's weight is the token embedding's

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def problem(self) -> str | None:
        """Why this shape cannot be built (None: it can)."""
        if min(self.n_layer, self.n_head, self.n_embd, self.n_kv_head, self.n_inner) < 1:
            return "every size must be >= 1"
        if self.n_embd % self.n_head:
            return f"n_embd ({self.n_embd}) must be a multiple of n_head ({self.n_head})"
        if self.n_head % self.n_kv_head:
            return f"num_key_value_heads ({self.n_kv_head}) must divide n_head ({self.n_head})"
        if self.family == "llama" and self.head_dim % 2:
            return f"the head size ({self.head_dim}) must be even: rotary embeddings turn pairs"
        return None


def llama_intermediate_size(n_embd: int) -> int:
    """Llama's SwiGLU width: 2/3 of GPT's 4 x n_embd (the same parameters with three matrices
    instead of two), rounded up to a multiple of 256: 768 -> 2048, 4096 -> 11008."""
    width = 8 * n_embd // 3
    return -(-width // LLAMA_MLP_MULTIPLE) * LLAMA_MLP_MULTIPLE


def effective_size(name: str, given: int, default: int, preset_value: int) -> int:
    """One of n_layer, n_head, n_embd as the run trains it: the preset's (0 = none), else the
    field itself. A field that was set (not its default) and disagrees with the preset is
    refused, never silently dropped."""
    chosen = preset_value or given
    if given != default and given != chosen:
        raise UserError(
            f"{name} = {given} conflicts with {chosen} from the preset: set one of them"
        )
    return chosen
