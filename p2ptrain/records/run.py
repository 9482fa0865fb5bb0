"""The run spec: what a swarm trains, published by its bootstrap node.

Pure stdlib. Read from the organiser's TOML file (`load_run_spec`), gossiped in a signed envelope,
handed to every worker with its plan: the swarm's settings, and the model, data and optimizer of
the data plane (`RunSpec.model_config` resolves the model's sizes). Keep every field defaulted,
JSON-friendly and validated in `from_dict`, so old peers and new ones can read each other's specs.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from p2ptrain.errors import UserError, WireError
from p2ptrain.records.model_config import (
    DEFAULT_RMS_NORM_EPS,
    DEFAULT_ROPE_THETA,
    FAMILIES,
    PRESETS,
    ModelConfig,
    effective_size,
    llama_intermediate_size,
)

MAX_RUN_ID_CHARS = 64
MAX_INT = 2**53
MAX_TEXT_CHARS = 4096
RESUME_MODES = ("latest", "never")
COMPRESSIONS = ("fp16", "bf16", "int8", "none")
SYNC_MODES = ("step", "diloco")
OUTER_COMPRESSIONS = ("fp16", "int8", "topk")


@dataclass(frozen=True)
class RunSpec:
    """One training run. `stages` is the pipeline depth; replicas follow from the swarm size."""

    run_id: str = "p2ptrain-default"
    stages: int = 2
    # the scheduler's traffic model: GB of one stage's gradients per data-parallel sync,
    # GB of one replica's activations crossing one pipeline boundary per step; 0 = from the
    # model and wire format (schedule/workload.py), > 0 = an explicit override
    c_dp_gb: float = 0.0
    c_pp_gb: float = 0.0
    # how the planner places peers: "scheduled" (the scheduler) or "random" (a seeded random
    # placement, the benchmarks' baseline); compute_aware prices each peer's measured stage time
    placement: str = "scheduled"
    placement_seed: int = 0
    compute_aware: bool = True
    # the planner publishes no first plan before this many peers are alive (a run that starts
    # with everyone it expects, instead of re-planning as each one arrives); later plans may use
    # fewer, because training on with the survivors beats waiting
    min_peers: int = 1
    # who may train: "open" (anyone) or "token" (holders of a token the organiser signed,
    # `p2ptrain token issue`); planning always needs a planner token
    admission: str = "open"
    # worker health (control/health.py): the floor of the bound after which a node whose worker
    # is silent, or stuck while the plan places it, is unhealthy and planned around; it covers a
    # worker's start (torch, hivemind, p2pd). 0 turns the check off (control-only test swarms)
    worker_stall_s: float = 60.0

    # --- training (the data plane); the defaults learn visibly on 2 CPU cores in minutes ---
    steps: int = 40
    seed: int = 0
    # model: "nanogpt" (GPT-2 style) or "llama" (records/model_config.py); a preset ("tiny",
    # "125m", "350m", "1.3b", "7b") sets n_layer, n_head and n_embd (and llama's kv heads);
    # the spec holds the sizes it trains, so n_layer etc. are what every reader uses
    model: str = "nanogpt"
    preset: str = ""
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    block_size: int = 64  # context length in tokens
    vocab_size: int = 256  # 256 = bytes
    # llama only, Hugging Face LlamaConfig names; 0 = from the preset / n_layer, n_head, n_embd
    # (hidden_size, num_hidden_layers, num_attention_heads override those), intermediate_size
    # 0 = llama_intermediate_size(n_embd), rms_norm_eps 0 = 1e-5, rope_theta 0 = 10000;
    # tied embeddings put the embedding and the head on one peer: stages = 1 only
    hidden_size: int = 0
    intermediate_size: int = 0
    num_hidden_layers: int = 0
    num_attention_heads: int = 0
    num_key_value_heads: int = 0
    rms_norm_eps: float = 0.0
    rope_theta: float = 0.0
    tie_word_embeddings: bool = False
    # data: "embedded" (the corpus shipped with p2ptrain: the same bytes on every peer),
    # "stdlib" (this interpreter's own .py files as bytes) or a file/directory path
    data: str = "embedded"
    data_format: str = "text"  # "text" (bytes) or "tokens" (uint16 .bin, nanoGPT style)
    # text data through a Hugging Face tokenizer: the path of its tokenizer.json ("" = bytes);
    # vocab_size must then cover the tokenizer's vocabulary
    tokenizer: str = ""
    # the corpus every peer must hold: sha256 of its tokens as loaded (train/data.py,
    # corpus_sha256); "" = not pinned. `p2ptrain digest --run RUN.toml` prints it
    data_sha256: str = ""
    batch_size: int = 16  # global batch in sequences, summed over replicas
    micro_batches: int = 2  # per pipeline, GPipe
    # optimizer: AdamW, linear warmup then cosine decay to min_lr
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup_steps: int = 2
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 0.0  # per-stage gradient norm clip; 0 = off
    # checkpoints: "" = runs/<run_id>/checkpoints; interval 0 = only on graceful exit
    checkpoint_dir: str = ""
    checkpoint_interval: int = 20
    # a swarm's first plan (no live lineage: a restart after every peer stopped): "latest"
    # adopts the newest state of this run (run id, model, data digest) that its members hold,
    # whatever swarm saved it; "never" starts from initial weights, and says so
    resume: str = "latest"
    # wire formats of activations and averaged gradients: "fp16", "bf16", "int8" (activations
    # and their gradients per row scaled; averaging stays fp16) or "none" (exact)
    compression: str = "fp16"
    # data parallelism: "step" averages every stage's gradients every step; "diloco" lets each
    # pipeline (a replica, with `batch_size` sequences of its own) take `inner_steps` AdamW
    # steps, then each stage's group averages the pseudo-gradient (parameters at the last outer
    # step minus now) and takes an outer Nesterov step (`outer_lr`, `outer_momentum`)
    sync: str = "step"
    inner_steps: int = 20
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    # the pseudo-gradient's wire format: "fp16", "int8" (block-wise scaled) or "topk" (the
    # largest `topk_fraction` of entries at 2 bits, the rest kept as error feedback)
    outer_compression: str = "fp16"
    topk_fraction: float = 0.03
    # the loss is multiplied by this before backward and every stage's gradients divided by it
    # after: a run-wide constant, so fp16 passes (GPUs without bf16) do not underflow; a power
    # of two keeps fp32 runs exact. 1 = off
    loss_scale: float = 1.0
    averaging_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if not self.run_id or len(self.run_id) > MAX_RUN_ID_CHARS or not self.run_id.isprintable():
            raise UserError(f"run_id must be 1..{MAX_RUN_ID_CHARS} printable characters")
        if not 1 <= self.stages <= 1024:
            raise UserError(f"stages must be between 1 and 1024, got {self.stages}")
        if self.c_dp_gb < 0 or self.c_pp_gb < 0:
            raise UserError("c_dp_gb and c_pp_gb must be >= 0")
        if self.placement not in ("scheduled", "random"):
            raise UserError(f"placement must be 'scheduled' or 'random', got {self.placement!r}")
        if not 1 <= self.min_peers <= 100_000:
            raise UserError(f"min_peers must be between 1 and 100000, got {self.min_peers}")
        if self.admission not in ("open", "token"):
            raise UserError(f"admission must be 'open' or 'token', got {self.admission!r}")
        if not 0 <= self.worker_stall_s <= 86_400:
            raise UserError(f"worker_stall_s must be in [0, 86400], got {self.worker_stall_s}")
        self._resolve_model_sizes()
        self._check_training_fields()

    def _resolve_model_sizes(self) -> None:
        # a preset or a llama size field fills n_layer, n_head, n_embd (effective_size), so
        # every reader of those fields (planner, pipeline, traffic model) sees the real model
        if self.model not in FAMILIES:
            raise UserError(f"model must be one of {', '.join(FAMILIES)}, got {self.model!r}")
        if self.preset and self.preset not in PRESETS:
            raise UserError(
                f"preset must be '' or one of {', '.join(PRESETS)}, got {self.preset!r}"
            )
        given = [name for name in _LLAMA_FIELDS if getattr(self, name)]
        if self.model != "llama" and given:
            raise UserError(
                f"{', '.join(given)}: llama field(s), but model = {self.model!r} "
                "(size a nanogpt model with n_layer, n_head, n_embd or a preset)"
            )
        if any(getattr(self, name) < 0 for name in _LLAMA_FIELDS):
            raise UserError(f"{', '.join(_LLAMA_FIELDS[:-1])} must be >= 0 (0 = derived)")
        preset = PRESETS.get(self.preset)
        for name, llama_name in _SIZE_NAMES:
            size = effective_size(
                name,
                given=getattr(self, name),
                default=getattr(RunSpec, name),
                preset_value=getattr(preset, name) if preset else 0,
                explicit=getattr(self, llama_name),
            )
            object.__setattr__(self, name, size)  # frozen: filled once, before anyone reads it

    def model_config(self) -> ModelConfig:
        """Every size of the run's model (the one place they are derived)."""
        if self.model == "nanogpt":
            return ModelConfig(
                "nanogpt",
                self.n_layer,
                self.n_head,
                self.n_embd,
                self.block_size,
                self.vocab_size,
                n_kv_head=self.n_head,
                n_inner=4 * self.n_embd,
                rms_norm_eps=0.0,
                rope_theta=0.0,
                tie_word_embeddings=False,
            )
        preset = PRESETS.get(self.preset)
        preset_kv_heads = preset.n_kv_head if preset else 0
        return ModelConfig(
            "llama",
            self.n_layer,
            self.n_head,
            self.n_embd,
            self.block_size,
            self.vocab_size,
            n_kv_head=self.num_key_value_heads or preset_kv_heads or self.n_head,
            n_inner=self.intermediate_size or llama_intermediate_size(self.n_embd),
            rms_norm_eps=self.rms_norm_eps or DEFAULT_RMS_NORM_EPS,
            rope_theta=self.rope_theta or DEFAULT_ROPE_THETA,
            tie_word_embeddings=self.tie_word_embeddings,
        )

    def _check_training_fields(self) -> None:
        positive = ("steps", "n_layer", "n_head", "n_embd", "block_size", "vocab_size")
        for name in (*positive, "batch_size", "micro_batches"):
            if getattr(self, name) < 1:
                raise UserError(f"{name} must be >= 1, got {getattr(self, name)}")
        problem = self.model_config().problem()
        if problem:
            raise UserError(f"model: {problem}")
        if self.stages > self.n_layer:
            raise UserError(f"stages ({self.stages}) cannot exceed n_layer ({self.n_layer})")
        if self.tie_word_embeddings and self.stages > 1:
            raise UserError(
                "tie_word_embeddings needs stages = 1: the embedding and the head it shares its "
                "weight with would sit on different peers"
            )
        if self.data_format not in ("text", "tokens"):
            raise UserError(f"data_format must be 'text' or 'tokens', got {self.data_format!r}")
        if self.tokenizer and (self.data_format != "text" or len(self.tokenizer) > MAX_TEXT_CHARS):
            raise UserError("tokenizer: a tokenizer.json path, with data_format = 'text'")
        if not 1.0 <= self.loss_scale <= 2.0**24:
            raise UserError(f"loss_scale must be in [1, 2**24], got {self.loss_scale}")
        if self.data_format == "text" and not self.tokenizer and self.vocab_size < 256:
            raise UserError("text data is byte-level: vocab_size must be >= 256")
        if self.data_sha256 and not (
            len(self.data_sha256) == 64 and set(self.data_sha256) <= set("0123456789abcdef")
        ):
            raise UserError("data_sha256 must be 64 lowercase hex digits (or empty: not pinned)")
        if self.vocab_size > 65536:
            raise UserError("vocab_size must be <= 65536 (tokens are stored as uint16)")
        if not 0 < self.min_lr <= self.lr:
            raise UserError(f"need 0 < min_lr <= lr, got min_lr={self.min_lr} lr={self.lr}")
        if self.warmup_steps < 0 or self.weight_decay < 0 or self.grad_clip < 0:
            raise UserError("warmup_steps, weight_decay and grad_clip must be >= 0")
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1):
            raise UserError("beta1 and beta2 must be in [0, 1)")
        if self.checkpoint_interval < 0:
            raise UserError("checkpoint_interval must be >= 0 (0 = only on exit)")
        if self.resume not in RESUME_MODES:
            raise UserError(f"resume must be 'latest' or 'never', got {self.resume!r}")
        if self.compression not in COMPRESSIONS:
            raise UserError(
                f"compression must be one of {', '.join(COMPRESSIONS)}, got {self.compression!r}"
            )
        self._check_sync_fields()
        if self.averaging_timeout_s <= 0:
            raise UserError("averaging_timeout_s must be > 0")

    def _check_sync_fields(self) -> None:
        if self.sync not in SYNC_MODES:
            raise UserError(f"sync must be 'step' or 'diloco', got {self.sync!r}")
        if not 1 <= self.inner_steps <= 100_000:
            raise UserError(f"inner_steps must be in [1, 100000], got {self.inner_steps}")
        if not 0 < self.outer_lr <= 10:
            raise UserError(f"outer_lr must be in (0, 10], got {self.outer_lr}")
        if not 0 <= self.outer_momentum < 1:
            raise UserError(f"outer_momentum must be in [0, 1), got {self.outer_momentum}")
        if self.outer_compression not in OUTER_COMPRESSIONS:
            raise UserError(
                f"outer_compression must be one of {', '.join(OUTER_COMPRESSIONS)}, "
                f"got {self.outer_compression!r}"
            )
        if not 0 < self.topk_fraction <= 1:
            raise UserError(f"topk_fraction must be in (0, 1], got {self.topk_fraction}")

    def replace(self, **changes: Any) -> RunSpec:
        """A copy with some fields changed (validated like any spec)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: object) -> RunSpec:
        """Build a spec from a dict; unknown keys, wrong types or values out of range raise
        WireError (a UserError: from a file, the CLI prints one line)."""
        try:
            return cls._from_dict(data)
        except WireError:
            raise
        except UserError as exc:
            raise WireError(f"malformed run: {exc}") from None

    @classmethod
    def _from_dict(cls, data: object) -> RunSpec:
        if not isinstance(data, dict):
            raise UserError("a run spec must be a table/object")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - set(fields))
        if unknown:
            raise UserError(f"unknown run spec field(s): {', '.join(unknown)}")
        values: dict[str, Any] = {}
        for name, value in data.items():
            default = getattr(cls, name)
            expected: tuple[type, ...] = (
                (int, float) if isinstance(default, float) else (type(default),)
            )
            if isinstance(value, bool) != isinstance(default, bool) or not isinstance(
                value, expected
            ):
                raise UserError(f"run spec field {name!r} must be {type(default).__name__}")
            if isinstance(value, int) and abs(value) > MAX_INT:
                raise UserError(f"run spec field {name!r} is out of range")
            if isinstance(value, float) and not math.isfinite(value):
                raise UserError(f"run spec field {name!r} must be finite")
            if isinstance(value, str) and len(value) > MAX_TEXT_CHARS:
                raise UserError(f"run spec field {name!r} is longer than {MAX_TEXT_CHARS}")
            values[name] = (
                float(value)
                if isinstance(value, int | float) and isinstance(default, float)
                else value
            )
        return cls(**values)


# llama's size fields (Hugging Face names): 0 / false = derived
_LLAMA_FIELDS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "rms_norm_eps",
    "rope_theta",
    "tie_word_embeddings",
)
# the run's sizes and the llama fields that override them
_SIZE_NAMES = (
    ("n_layer", "num_hidden_layers"),
    ("n_head", "num_attention_heads"),
    ("n_embd", "hidden_size"),
)


def load_run_spec(path: str | Path | None) -> RunSpec:
    """Read a run spec from a TOML file (the `[run]` table or the top level); None -> the default."""
    if path is None:
        return RunSpec()
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise UserError(f"cannot read run spec {path}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"run spec {path} is not valid TOML: {exc}") from exc
    table = data.get("run", data)
    return RunSpec._from_dict(table)  # the user's own file: its errors without a wire category
