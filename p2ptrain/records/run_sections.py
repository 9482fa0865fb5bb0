"""The run spec's sections (records/run.py holds them): swarm, model, data, optim, wire, checkpoint.

Pure stdlib. Each section is a frozen dataclass whose fields are all defaulted and checked on
construction; what ties two sections together (stages <= n_layer, ...) is checked by `RunSpec`.
Every field name is unique across the sections, so a flat run file or `RunSpec.replace` can name a
field without its section.
"""

from __future__ import annotations

from dataclasses import dataclass

from p2ptrain.errors import UserError
from p2ptrain.records.model_config import (
    DEFAULT_RMS_NORM_EPS,
    DEFAULT_ROPE_THETA,
    FAMILIES,
    PRESETS,
    ModelConfig,
    effective_size,
    llama_intermediate_size,
)

MAX_TEXT_CHARS = 4096
RESUME_MODES = ("latest", "never")
COMPRESSIONS = ("fp16", "bf16", "int8", "none")
SYNC_MODES = ("step", "diloco")
OUTER_COMPRESSIONS = ("fp16", "int8", "topk")
MAX_OUTER_FRAGMENTS = 64
# the largest pipeline frame payload a receiver reads (worker/pipeline/frames.py imports it):
# the run spec refuses a run whose honest frames would be larger (frame_problem)
MAX_PAYLOAD_BYTES = 512 * 1024 * 1024


@dataclass(frozen=True)
class SwarmSpec:
    """How the swarm is planned: pipeline depth, placement, admission, worker health."""

    stages: int = 2  # the pipeline depth; replicas follow from the swarm size
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
    # the scheduler's traffic model: GB of one stage's gradients per data-parallel sync,
    # GB of one replica's activations crossing one pipeline boundary per step; 0 = from the
    # model and wire format (schedule/workload.py), > 0 = an explicit override
    c_dp_gb: float = 0.0
    c_pp_gb: float = 0.0

    def __post_init__(self) -> None:
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

    @property
    def prices_compute(self) -> bool:
        """Does the planner price the peers' measured compute (and so wait for, and read, each
        worker's timing of the run's model)? A random placement places without it."""
        return self.compute_aware and self.placement == "scheduled"


@dataclass(frozen=True)
class ModelSpec:
    """The model: its family, a preset or its sizes (one name each, nanoGPT's), and llama's
    extras. `RunSpec.model_config()` derives every size the model code reads."""

    # "nanogpt" (GPT-2 style) or "llama" (records/model_config.py)
    family: str = "nanogpt"
    # "tiny", "125m", "350m", "1.3b", "7b": sets n_layer, n_head and n_embd (and llama's kv
    # heads); the spec then holds the sizes it trains, so n_layer etc. are what every reader uses
    preset: str = ""
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    block_size: int = 64  # context length in tokens
    vocab_size: int = 256  # 256 = bytes
    # llama only; 0 = derived: intermediate_size = llama_intermediate_size(n_embd), kv heads
    # from the preset or n_head, rms_norm_eps 1e-5, rope_theta 10000; tied embeddings put the
    # embedding and the head on one peer: stages = 1 only
    intermediate_size: int = 0
    num_key_value_heads: int = 0
    rms_norm_eps: float = 0.0
    rope_theta: float = 0.0
    tie_word_embeddings: bool = False

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise UserError(f"model must be one of {', '.join(FAMILIES)}, got {self.family!r}")
        if self.preset and self.preset not in PRESETS:
            raise UserError(
                f"preset must be '' or one of {', '.join(PRESETS)}, got {self.preset!r}"
            )
        given = [name for name in LLAMA_FIELDS if getattr(self, name)]
        if self.family != "llama" and given:
            raise UserError(
                f"{', '.join(given)}: llama field(s), but model = {self.family!r} "
                "(size a nanogpt model with n_layer, n_head, n_embd or a preset)"
            )
        if any(getattr(self, name) < 0 for name in LLAMA_FIELDS):
            raise UserError(f"{', '.join(LLAMA_FIELDS[:-1])} must be >= 0 (0 = derived)")
        preset = PRESETS.get(self.preset)
        for name in ("n_layer", "n_head", "n_embd"):
            size = effective_size(
                name,
                given=getattr(self, name),
                default=getattr(ModelSpec, name),
                preset_value=getattr(preset, name) if preset else 0,
            )
            object.__setattr__(self, name, size)  # frozen: filled once, before anyone reads it
        for name in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size"):
            if getattr(self, name) < 1:
                raise UserError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.vocab_size > 65536:
            raise UserError("vocab_size must be <= 65536 (tokens are stored as uint16)")
        problem = model_config(self).problem()
        if problem:
            raise UserError(f"model: {problem}")


# llama's extra fields: 0 / false = derived
LLAMA_FIELDS = (
    "intermediate_size",
    "num_key_value_heads",
    "rms_norm_eps",
    "rope_theta",
    "tie_word_embeddings",
)


def model_config(model: ModelSpec) -> ModelConfig:
    """Every size of the model (the one place they are derived; read it as
    `RunSpec.model_config()`)."""
    if model.family == "nanogpt":
        return ModelConfig(
            "nanogpt",
            model.n_layer,
            model.n_head,
            model.n_embd,
            model.block_size,
            model.vocab_size,
            n_kv_head=model.n_head,
            n_inner=4 * model.n_embd,
            rms_norm_eps=0.0,
            rope_theta=0.0,
            tie_word_embeddings=False,
        )
    preset = PRESETS.get(model.preset)
    preset_kv_heads = preset.n_kv_head if preset else 0
    return ModelConfig(
        "llama",
        model.n_layer,
        model.n_head,
        model.n_embd,
        model.block_size,
        model.vocab_size,
        n_kv_head=model.num_key_value_heads or preset_kv_heads or model.n_head,
        n_inner=model.intermediate_size or llama_intermediate_size(model.n_embd),
        rms_norm_eps=model.rms_norm_eps or DEFAULT_RMS_NORM_EPS,
        rope_theta=model.rope_theta or DEFAULT_ROPE_THETA,
        tie_word_embeddings=model.tie_word_embeddings,
    )


@dataclass(frozen=True)
class DataSpec:
    """What the swarm trains on."""

    # "embedded" (the corpus shipped with p2ptrain: the same bytes on every peer), "stdlib"
    # (this interpreter's own .py files as bytes) or a file/directory path
    source: str = "embedded"
    data_format: str = "text"  # "text" (bytes) or "tokens" (uint16 .bin, nanoGPT style)
    # text data through a Hugging Face tokenizer: the path of its tokenizer.json ("" = bytes);
    # vocab_size must then cover the tokenizer's vocabulary
    tokenizer: str = ""
    # the corpus every peer must hold: sha256 of its tokens as loaded (train/data.py,
    # corpus_sha256); "" = not pinned. `p2ptrain digest --run RUN.toml` prints it
    data_sha256: str = ""

    def __post_init__(self) -> None:
        if self.data_format not in ("text", "tokens"):
            raise UserError(f"data_format must be 'text' or 'tokens', got {self.data_format!r}")
        if self.tokenizer and (self.data_format != "text" or len(self.tokenizer) > MAX_TEXT_CHARS):
            raise UserError("tokenizer: a tokenizer.json path, with data_format = 'text'")
        if self.data_sha256 and not (
            len(self.data_sha256) == 64 and set(self.data_sha256) <= set("0123456789abcdef")
        ):
            raise UserError("data_sha256 must be 64 lowercase hex digits (or empty: not pinned)")


@dataclass(frozen=True)
class OptimSpec:
    """The training loop: steps, batches, AdamW (linear warmup, cosine decay to min_lr), and how
    replicas sync. The defaults learn visibly on 2 CPU cores in minutes."""

    steps: int = 40
    seed: int = 0
    batch_size: int = 16  # global batch in sequences, summed over replicas
    micro_batches: int = 2  # per pipeline, GPipe
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup_steps: int = 2
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 0.0  # per-stage gradient norm clip; 0 = off
    # each replica clips its stage's gradient, before the round, to this x the median of its
    # own last 16 norms (train/spike_clip.py: honest pairs' spikes fail their rounds); 0 = off
    spike_clip: float = 0.0
    # the loss is multiplied by this before backward and every stage's gradients divided by it
    # after: a run-wide constant, so fp16 passes (GPUs without bf16) do not underflow; a power
    # of two keeps fp32 runs exact. 1 = off
    loss_scale: float = 1.0
    # data parallelism: "step" averages every stage's gradients every step; "diloco" lets each
    # pipeline (a replica, with `batch_size` sequences of its own) take `inner_steps` AdamW
    # steps, then each stage's group averages the pseudo-gradient (parameters at the last outer
    # step minus now) and takes an outer Nesterov step (`outer_lr`, `outer_momentum`)
    sync: str = "step"
    inner_steps: int = 20
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    # Streaming DiLoCo: the stage's parameters sync in this many fragments, each at its own
    # offset within H, so a replica's round traffic and CPU are spread over H, not one burst
    outer_fragments: int = 1

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "micro_batches"):
            if getattr(self, name) < 1:
                raise UserError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 1.0 <= self.loss_scale <= 2.0**24:
            raise UserError(f"loss_scale must be in [1, 2**24], got {self.loss_scale}")
        if not 0 < self.min_lr <= self.lr:
            raise UserError(f"need 0 < min_lr <= lr, got min_lr={self.min_lr} lr={self.lr}")
        if self.warmup_steps < 0 or self.weight_decay < 0 or self.grad_clip < 0:
            raise UserError("warmup_steps, weight_decay and grad_clip must be >= 0")
        if self.spike_clip != 0 and not 1 <= self.spike_clip <= 100:
            raise UserError(f"spike_clip must be 0 (off) or in [1, 100], got {self.spike_clip}")
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1):
            raise UserError("beta1 and beta2 must be in [0, 1)")
        if self.sync not in SYNC_MODES:
            raise UserError(f"sync must be 'step' or 'diloco', got {self.sync!r}")
        if not 1 <= self.inner_steps <= 100_000:
            raise UserError(f"inner_steps must be in [1, 100000], got {self.inner_steps}")
        if not 0 < self.outer_lr <= 10:
            raise UserError(f"outer_lr must be in (0, 10], got {self.outer_lr}")
        if not 0 <= self.outer_momentum < 1:
            raise UserError(f"outer_momentum must be in [0, 1), got {self.outer_momentum}")
        if not 1 <= self.outer_fragments <= min(self.inner_steps, MAX_OUTER_FRAGMENTS):
            raise UserError(
                f"outer_fragments must be in [1, min(inner_steps, {MAX_OUTER_FRAGMENTS})], "
                f"got {self.outer_fragments}"
            )


@dataclass(frozen=True)
class WireSpec:
    """What crosses the network: the wire formats and the averaging's patience."""

    # activations and averaged gradients: "fp16", "bf16", "int8" (activations and their
    # gradients per row scaled; averaging stays fp16) or "none" (exact)
    compression: str = "fp16"
    # the pseudo-gradient (sync = "diloco"): "fp16", "int8" (block-wise scaled) or "topk" (the
    # largest `topk_fraction` of entries at 2 bits, the rest kept as error feedback)
    outer_compression: str = "fp16"
    topk_fraction: float = 0.03
    averaging_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if self.compression not in COMPRESSIONS:
            raise UserError(
                f"compression must be one of {', '.join(COMPRESSIONS)}, got {self.compression!r}"
            )
        if self.outer_compression not in OUTER_COMPRESSIONS:
            raise UserError(
                f"outer_compression must be one of {', '.join(OUTER_COMPRESSIONS)}, "
                f"got {self.outer_compression!r}"
            )
        if not 0 < self.topk_fraction <= 1:
            raise UserError(f"topk_fraction must be in (0, 1], got {self.topk_fraction}")
        if self.averaging_timeout_s <= 0:
            raise UserError("averaging_timeout_s must be > 0")


@dataclass(frozen=True)
class CheckpointSpec:
    """Where and how often the swarm saves, and what a swarm's first plan resumes."""

    checkpoint_dir: str = ""  # "" = runs/<run_id>/checkpoints
    checkpoint_interval: int = 20  # 0 = only on graceful exit
    # a swarm's first plan (no live lineage: a restart after every peer stopped): "latest"
    # adopts the newest state of this run (run id, model, data digest) that its members hold,
    # whatever swarm saved it; "never" starts from initial weights, and says so
    resume: str = "latest"
    # seconds between a spare's copies of a lone holder's newest saved state (a plan of one
    # pipeline): its crash then costs the steps since, not the stage (worker/resume/copies.py);
    # each copy takes at most a tenth of the link; 0 = no copies (nor without interval saves)
    spare_copy_interval_s: float = 60.0
    # how long a restarted swarm's first plan waits for the holders of saved states that no
    # node present holds (control/planning/readiness.py): volunteers come back at their pace
    resume_wait_s: float = 90.0

    def __post_init__(self) -> None:
        if self.checkpoint_interval < 0:
            raise UserError("checkpoint_interval must be >= 0 (0 = only on exit)")
        interval = self.spare_copy_interval_s
        if not (interval == 0 or 1 <= interval <= 86_400):
            raise UserError(
                f"spare_copy_interval_s must be 0 (off) or in [1, 86400], got {interval}"
            )
        if not 0 <= self.resume_wait_s <= 86_400:
            raise UserError(f"resume_wait_s must be in [0, 86400], got {self.resume_wait_s}")
        if self.resume not in RESUME_MODES:
            raise UserError(f"resume must be 'latest' or 'never', got {self.resume!r}")


def frame_problem(
    model: ModelSpec, optim: OptimSpec, wire: WireSpec, stages: int = 2
) -> str | None:
    """Why the run's largest pipeline frame (a micro-batch's activations or their gradient)
    exceeds MAX_PAYLOAD_BYTES, or None. Checked at load: a receiver refuses such a frame, so
    every step of the run would fail; a run of one stage sends none. The largest micro-batch is
    that of a lone replica (under diloco every replica's): ceil(batch_size / micro_batches)
    rows."""
    if stages < 2:
        return None
    rows = -(-optim.batch_size // optim.micro_batches)
    # a row of n_embd values as frames.py lays it out: int8_rows an fp32 scale and the int8
    # values; the others the raw floats
    width = {"int8": 4 + model.n_embd, "none": 4 * model.n_embd}.get(
        wire.compression, 2 * model.n_embd
    )
    frame_bytes = rows * model.block_size * width
    if frame_bytes <= MAX_PAYLOAD_BYTES:
        return None
    return (
        f"a pipeline frame would hold {frame_bytes} bytes (batch_size / micro_batches = {rows} "
        f"rows x block_size {model.block_size} x n_embd {model.n_embd} as {wire.compression}), "
        f"over the {MAX_PAYLOAD_BYTES} a receiver reads: raise micro_batches or lower batch_size"
    )
