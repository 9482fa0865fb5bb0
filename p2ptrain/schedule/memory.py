"""What a pipeline stage holds in memory while it trains, from the model config alone (no torch).

Per stage: its weights, their gradients, AdamW's two moments (and its step counter per tensor),
and the activations of the micro-batches it has run forward but not yet backward (GPipe keeps a
step's every micro-batch until its backward; `stage_memory` counts `micro_batches` of them).
Everything is fp32, as the data plane trains. Activations are the tensors autograd saves for the
backward pass, counted op by op for the model code of train/model.py and train/llama.py with a
fused attention kernel (torch's default on CPU and CUDA: no T x T matrix is kept); buffers that
live only inside one op (the logits before the loss, kernel workspaces) are not counted. A test
checks these numbers against what torch allocates (tests/train/test_memory.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from p2ptrain.records.model_config import ModelConfig

VALUE_BYTES = 4  # fp32: weights, gradients, moments and activations
TOKEN_ID_BYTES = 8  # int64 ids (the embedding's input, the loss's targets)
ADAM_MOMENTS = 2  # exp_avg and exp_avg_sq, one value each per weight
OUTER_VECTORS = 4  # DiLoCo: anchor, outer momentum, a round's parameters and pseudo-gradient
ADAM_STEP_BYTES = 4  # AdamW's step counter: one fp32 scalar per parameter tensor


@dataclass(frozen=True)
class StageMemory:
    """Bytes a stage holds while it trains."""

    weight_bytes: int
    gradient_bytes: int
    optimizer_bytes: int
    activation_bytes: int
    # sync = "diloco": the anchor, the outer momentum and a round's two buffers (the parameters
    # it started from, their pseudo-gradient), fp32 on the stage's device (train/outer.py)
    outer_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return (
            self.weight_bytes
            + self.gradient_bytes
            + self.optimizer_bytes
            + self.activation_bytes
            + self.outer_bytes
        )


def block_parameters(config: ModelConfig) -> int:
    """Parameters of one transformer block."""
    d, inner = config.n_embd, config.n_inner
    if config.family == "nanogpt":
        # attention 4d^2 + 4d, MLP 2 d inner + inner + d, two layer norms 4d
        return 4 * d * d + 4 * d + 2 * d * inner + inner + d + 4 * d
    kv = config.n_kv_head * config.head_dim
    # q and o d^2 each, k and v d kv each, SwiGLU 3 d inner, two RMSNorm gains
    return 2 * d * d + 2 * d * kv + 3 * d * inner + 2 * d


def embedding_parameters(config: ModelConfig) -> int:
    """Parameters of the first stage's embedding (nanoGPT adds learned positions)."""
    positions = config.block_size * config.n_embd if config.family == "nanogpt" else 0
    return config.vocab_size * config.n_embd + positions


def head_parameters(config: ModelConfig) -> int:
    """Parameters of the last stage's final norm and head (a tied head has no weight)."""
    norm = 2 * config.n_embd if config.family == "nanogpt" else config.n_embd
    return norm + (0 if config.tie_word_embeddings else config.vocab_size * config.n_embd)


def stage_parameters(config: ModelConfig, layers: range) -> int:
    """Parameters of the stage holding blocks `layers` (and the embedding / head at the ends)."""
    count = len(layers) * block_parameters(config)
    if layers.start == 0:
        count += embedding_parameters(config)
    if layers.stop == config.n_layer:
        count += head_parameters(config)
    return count


def _stage_tensors(config: ModelConfig, layers: range) -> int:
    # parameter tensors (AdamW keeps a step counter for each)
    nanogpt = config.family == "nanogpt"
    count = len(layers) * (12 if nanogpt else 9)
    if layers.start == 0:
        count += 2 if nanogpt else 1
    if layers.stop == config.n_layer:
        count += 3 if nanogpt else (1 if config.tie_word_embeddings else 2)
    return count


def block_activation_bytes(config: ModelConfig, rows: int) -> int:
    """What one block saves for backward on a micro-batch of `rows` sequences of block_size."""
    d, inner, heads = config.n_embd, config.n_inner, config.n_head
    tokens = rows * config.block_size
    if config.family == "nanogpt":
        # per token: two layer norms (input, output, mean and rstd: 2d + 2 each), q k v (3d),
        # attention output (d) and log-sum-exp (one per head), MLP input and GELU output
        per_token = 2 * (2 * d + 2) + 3 * d + d + heads + 2 * inner
        return tokens * per_token * VALUE_BYTES
    # per token: two RMSNorms (input, normalized, scaled: 3d, and 1/rms), rotated q and k,
    # v (k and v repeated to every query head: d each), attention output (d) and log-sum-exp,
    # SwiGLU's gate, up, silu(gate) and product (4 inner); per micro-batch the cos/sin tables
    per_token = 2 * (3 * d + 1) + 4 * d + heads + 4 * inner
    tables = 2 * config.block_size * config.head_dim
    return (tokens * per_token + tables) * VALUE_BYTES


def embedding_activation_bytes(config: ModelConfig, rows: int) -> int:
    """What the embedding saves: the token ids (and nanoGPT's position ids)."""
    positions = config.block_size if config.family == "nanogpt" else 0
    return (rows * config.block_size + positions) * TOKEN_ID_BYTES


def head_activation_bytes(config: ModelConfig, rows: int) -> int:
    """What the final norm, the head and the loss save: the norm's tensors, the head's input,
    the log-softmax over the vocabulary, and the targets."""
    d, tokens = config.n_embd, rows * config.block_size
    norm = 2 * d + 2 if config.family == "nanogpt" else 3 * d + 1  # input, output (and stats)
    values = tokens * (norm + config.vocab_size) + 1  # + the loss's total weight
    return values * VALUE_BYTES + tokens * TOKEN_ID_BYTES


def stage_activation_bytes(config: ModelConfig, layers: range, rows: int) -> int:
    """Activations of one micro-batch of `rows` sequences, saved by the stage for backward."""
    total = len(layers) * block_activation_bytes(config, rows)
    if layers.start == 0:
        total += embedding_activation_bytes(config, rows)
    if layers.stop == config.n_layer:
        total += head_activation_bytes(config, rows)
    return total


def stage_memory(
    config: ModelConfig, layers: range, rows: int, micro_batches: int = 1, diloco: bool = False
) -> StageMemory:
    """Bytes the stage holding blocks `layers` needs to train: weights, gradients, AdamW state,
    the activations of `micro_batches` in-flight micro-batches of `rows` sequences each, and
    under `diloco` the outer step's state and buffers."""
    params = stage_parameters(config, layers)
    return StageMemory(
        weight_bytes=params * VALUE_BYTES,
        gradient_bytes=params * VALUE_BYTES,
        optimizer_bytes=params * ADAM_MOMENTS * VALUE_BYTES
        + _stage_tensors(config, layers) * ADAM_STEP_BYTES,
        activation_bytes=micro_batches * stage_activation_bytes(config, layers, rows),
        outer_bytes=OUTER_VECTORS * params * VALUE_BYTES if diloco else 0,
    )
