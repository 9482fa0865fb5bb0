"""A run's stage checkpoints merged into one Hugging Face model directory.

`config.json` (LlamaForCausalLM for llama runs, GPT2LMHeadModel for nanogpt ones) and
`model.safetensors`, which `transformers.AutoModelForCausalLM.from_pretrained(directory)` loads
and which computes our model's logits. The states merged are those of one step and one lineage: the
newest step (or the one asked for) whose saved stages hold every parameter of the model, whatever
cuts the plans used (a parameter is named model-wide, as in train/recut.py); where two lineages
saved that step (a restarted swarm, a partition's halves), the one saved last; where two epochs of
one lineage did (a plan restarted a stage below steps it saved), the later epoch's. Files of
another run in the directory are left out, each with a line saying why. Each output file is
written under a temporary name, through its own descriptor (never a name someone could swap
for a symlink), and synced; both are renamed into place only once both are written: an export
that fails (a full disk, a read-only directory: said in one line) leaves no torn
model.safetensors, nor a new one beside the old config.json (only a failed rename between the
two, in one folder, could). An `--out` folder of another user
that anyone may write to (no sticky bit) is refused: its files could be swapped under us.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import tempfile
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import safetensors.torch
import torch

from p2ptrain.durable import sync_directory
from p2ptrain.errors import UserError
from p2ptrain.records.model_config import ModelConfig
from p2ptrain.records.run import RunSpec
from p2ptrain.train.checkpoint import written
from p2ptrain.train.checkpoint_folder import list_states
from p2ptrain.train.checkpoint_read import other_run, read_file, read_state
from p2ptrain.train.model import Stage
from p2ptrain.train.recut import model_wide

_LATEST = re.compile(r"^stage-L([0-9]+)-([0-9]+)\.pt$")


def model_wide_names(spec: RunSpec) -> list[str]:
    """Every parameter of the run's model, named model-wide ('block3.mlp.up_proj.weight')."""
    with torch.device("meta"):  # names only
        whole = Stage(spec.model_config(), range(spec.model.n_layer), spec.optim.seed)
    return [model_wide(name, whole.layers) for name in whole.state_dict()]


@dataclass(frozen=True)
class Source:
    """A stage state file the export may read: its layers and lineage id ("root": untagged;
    None: a latest file, whose name does not say), and the epoch of its tag (-1: none)."""

    layers: range
    path: Path
    lineage: str | None
    epoch: int = -1


def _states_by_step(directory: Path) -> dict[int, list[Source]]:
    """The directory's stage states by step: stamped files (step in the name), else the latest
    files (`save_stage` writes only those), whose step is read from the file."""
    found: dict[int, list[Source]] = defaultdict(list)
    for state in list_states(directory):
        a, b = (int(n) for n in state.key[1:].split("-"))
        lineage = "root" if state.tag is None else state.tag.partition("-e")[0]
        found[state.step].append(Source(range(a, b), state.path, lineage, written(state)[0]))
    if found or not directory.is_dir():
        return found
    for name in sorted(os.listdir(directory)):
        match = _LATEST.fullmatch(name)
        if match and int(match[1]) < int(match[2]):
            step = read_file(directory / name).get("step")
            if isinstance(step, int):
                found[step].append(
                    Source(range(int(match[1]), int(match[2])), directory / name, None)
                )
    return found


@dataclass(frozen=True)
class Merged:
    """What an export merged: the step, the lineage its states were saved under (None: not
    known), the other lineages that saved that step too, and why files were left out."""

    step: int
    weights: dict[str, torch.Tensor]
    lineage: str | None
    other_lineages: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()


def merged_weights(spec: RunSpec, directory: Path, step: int | None = None) -> Merged:
    """The model-wide weights of the whole model from the stage states of one step and one
    lineage in `directory` (default: the newest step at which one lineage holds every
    parameter; of several lineages there, the one saved last). States of another run (run id,
    model shape, data digest) or unreadable ones are left out, each with the reason."""
    names = model_wide_names(spec)
    by_step = _states_by_step(directory)
    steps = [step] if step is not None else sorted(by_step, reverse=True)
    skipped: dict[Path, str] = {}
    for candidate in steps:
        sources = []
        for source in by_step.get(candidate, []):
            problem = other_run(source.path, spec)
            if problem is None:
                sources.append(source)
            else:
                skipped[source.path] = f"skipped {source.path.name}: {problem}"
        groups: dict[str | None, list[Source]] = defaultdict(list)
        for source in sources:
            groups[source.lineage].append(source)
        # two swarms that saved one step (a partition's halves, a restart): never mix them
        for lineage in sorted(groups, key=lambda g: _newest_mtime(groups[g]), reverse=True):
            weights: dict[str, torch.Tensor] = {}
            # of one lineage's epochs that saved one stage's step, the later one, as its writer
            for source in sorted(groups[lineage], key=lambda s: -s.epoch):
                state = read_state(source.path, spec, source.layers)
                for name, tensor in state["model_state"].items():
                    weights.setdefault(model_wide(name, source.layers), tensor)
            if all(name in weights for name in names):
                others = tuple(sorted(str(g) for g in groups if g != lineage))
                return Merged(
                    candidate,
                    {name: weights[name] for name in names},
                    lineage,
                    others,
                    tuple(skipped.values()),
                )
    which = f"step {step}" if step is not None else "any step"
    raise UserError(
        f"{directory} holds no stage states of {which} of one lineage that cover the whole model"
        + _what_is_held(by_step, steps, spec.model.n_layer)
        + "".join(f"; {line}" for line in skipped.values())
    )


def _what_is_held(by_step: dict[int, list[Source]], steps: list[int], n_layer: int) -> str:
    """Which layers the newest step asked for holds, and which it lacks: a node's directory
    holds its own stages only (an export named none of what was missing)."""
    if not steps or not by_step.get(steps[0]):
        return ""
    held = sorted({(s.layers.start, s.layers.stop) for s in by_step[steps[0]]})
    covered = {layer for start, stop in held for layer in range(start, stop)}
    missing = [layer for layer in range(n_layer) if layer not in covered]
    names = ", ".join(f"L{start}-{stop}" for start, stop in held)
    lacks = f"; it lacks layer(s) {', '.join(map(str, missing))}" if missing else ""
    return (
        f" (step {steps[0]} holds {names}{lacks}: copy every node's stamped stage files, "
        "stage-L*.step*.pt, not the stage-L*.pt links, into one directory)"
    )


def _newest_mtime(sources: list[Source]) -> int:
    times = []
    for source in sources:
        with contextlib.suppress(OSError):
            times.append(source.path.stat().st_mtime_ns)
    return max(times, default=0)


def hf_name(name: str, family: str) -> str:
    """A model-wide parameter name as Hugging Face's LlamaForCausalLM / GPT2LMHeadModel has it."""
    piece, _, rest = name.partition(".")
    if family == "llama":
        if piece == "embed":
            return f"model.{rest}"  # embed_tokens.weight
        if piece == "head":
            return rest if rest.startswith("lm_head") else f"model.{rest}"  # norm.weight
        return f"model.layers.{piece.removeprefix('block')}.{rest}"
    if piece == "embed":
        return f"transformer.{rest}"  # wte, wpe
    if piece == "head":
        return rest if rest.startswith("lm_head") else f"transformer.{rest}"  # ln_f
    return f"transformer.h.{piece.removeprefix('block')}.{rest}"


def hf_config(config: ModelConfig) -> dict[str, Any]:
    """config.json for the model (fp32, no dropout, no special tokens: the run has none)."""
    common = {
        "vocab_size": config.vocab_size,
        "torch_dtype": "float32",
        "bos_token_id": None,
        "eos_token_id": None,
        "tie_word_embeddings": config.tie_word_embeddings,
    }
    if config.family == "llama":
        return common | {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": config.n_embd,
            "intermediate_size": config.n_inner,
            "num_hidden_layers": config.n_layer,
            "num_attention_heads": config.n_head,
            "num_key_value_heads": config.n_kv_head,
            "head_dim": config.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": config.block_size,
            "rms_norm_eps": config.rms_norm_eps,
            "rope_theta": config.rope_theta,  # transformers 4; 5 reads rope_parameters
            "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
            "attention_bias": False,
            "mlp_bias": False,
        }
    return common | {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "n_layer": config.n_layer,
        "n_head": config.n_head,
        "n_embd": config.n_embd,
        "n_inner": config.n_inner,
        "n_positions": config.block_size,
        "activation_function": "gelu",  # nanoGPT's exact GELU, not GPT-2's tanh approximation
        "layer_norm_epsilon": 1e-5,  # torch's LayerNorm default
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
    }


def hf_weights(weights: dict[str, torch.Tensor], family: str) -> dict[str, torch.Tensor]:
    """Model-wide weights renamed for Hugging Face; GPT-2 keeps its linear layers as Conv1D,
    whose weight is our nn.Linear's transposed."""
    renamed = {}
    for name, tensor in weights.items():
        conv1d = family == "nanogpt" and name.endswith(
            ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
        )
        renamed[hf_name(name, family)] = (tensor.t() if conv1d else tensor).contiguous()
    return renamed


def export_hf(spec: RunSpec, directory: Path, out: Path, step: int | None = None) -> Merged:
    """Write the run's model, merged from its stage states in `directory`, to `out` as a
    Hugging Face model directory; what was merged (its step and lineage)."""
    merged = merged_weights(spec, directory, step)
    config = spec.model_config()
    tensors = hf_weights(merged.weights, config.family)
    text = json.dumps(hf_config(config), indent=2) + "\n"
    try:
        out.mkdir(parents=True, exist_ok=True)
        _check_out(out)
        _write_new(
            out,
            {
                "model.safetensors": lambda fd: _save_tensors(tensors, fd),
                "config.json": lambda fd: _write_bytes(fd, text.encode()),
            },
        )
    except (OSError, safetensors.SafetensorError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise UserError(f"cannot write the export to {out}: {reason}") from None
    return merged


def _umask() -> int:
    """This process's umask (read by setting it back: the export is a CLI's one thread)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _check_out(out: Path) -> None:
    """Refuse a folder of another user that anyone may write to without the sticky bit: anyone
    could rename our files in it, or swap our temporary ones for symlinks."""
    info = out.stat()
    mode = info.st_mode
    if info.st_uid != os.getuid() and mode & stat.S_IWOTH and not mode & stat.S_ISVTX:
        raise UserError(
            f"cannot write the export to {out}: another user's folder that anyone may write to "
            "(no sticky bit); give a folder of your own"
        )


def _save_tensors(tensors: dict[str, torch.Tensor], fd: int) -> None:
    # bytes, not save_file(name): that reopens by name (safetensors 0.8 renames its own temporary
    # file over it, older ones follow a symlink there); the model's bytes are in memory once more
    _write_bytes(fd, safetensors.torch.save(tensors, metadata={"format": "pt"}))


def _write_bytes(fd: int, data: bytes) -> None:
    with open(fd, "wb", closefd=False) as f:
        f.write(data)


def _write_new(out: Path, files: dict[str, Callable[[int], object]]) -> None:
    """Write each file of `files` (name -> a writer given the descriptor) under a temporary name
    in `out` (mkstemp's: ours alone), give it a plain new file's mode and sync it; then rename
    them all into place, and sync the folder."""
    made: list[tuple[int, str, Path]] = []
    try:
        for name, write in files.items():
            fd, tmp = tempfile.mkstemp(dir=out, prefix=f".{name}.", suffix=".tmp")
            made.append((fd, tmp, out / name))
            write(fd)
            os.fchmod(fd, 0o666 & ~_umask())  # as a plain new file's: mkstemp makes it 0600
            os.fsync(fd)
        for fd, tmp, _ in made:
            if not os.path.samestat(os.lstat(tmp), os.fstat(fd)):  # swapped meanwhile
                raise UserError(f"cannot write the export to {out}: {tmp} was replaced meanwhile")
        for _, tmp, path in made:
            os.replace(tmp, path)
        sync_directory(out)
    except BaseException:
        for _, tmp, _ in made:
            Path(tmp).unlink(missing_ok=True)
        raise
    finally:
        for fd, _, _ in made:
            os.close(fd)
