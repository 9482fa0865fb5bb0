"""The stage-state file, format /3: one safetensors file, no pickle anywhere (docs/security.md,
26.7: torch's `weights_only` unpickler was bypassed below torch 2.6, CVE-2025-32434, and a state
file comes from other peers).

    tensors   "model/<name>"            the stage's weights, by state_dict name
              "optim/<index>/<field>"   AdamW's per-parameter tensors (exp_avg, exp_avg_sq, step),
                                        `index` as in Optimizer.state_dict()["state"]
              "outer/anchor/<name>",    sync = "diloco" only: the stage's outer state
              "outer/momentum/<name>",  (train/outer.py: the anchor and outer momentum per
              "outer/steps"             parameter, the count of outer steps as an int64 scalar)
    metadata  {"p2ptrain": JSON}        records/stage_state.py: run, model, layers, step, the
                                        param groups' hyperparameters, non-tensor values

Reading parses the safetensors header (safetensors' own parser, no code from the file) and
decodes the metadata with a total decoder: anything malformed is a WireError. A header longer
than the receiver's expected tensors need (`max_header_bytes`) is refused unread. Files of the
formats before (/1, /2: torch.save pickles) are told apart by their zip magic; only
train/checkpoint.py reads those, from our own disk. A name that holds no regular file (a FIFO,
a device, a symlink: never followed) is a WireError, found without blocking (`open_state`).
"""

from __future__ import annotations

import json
import os
import re
import struct
from pathlib import Path
from typing import Any, BinaryIO

import safetensors
import safetensors.torch
import torch

from p2ptrain.durable import NotRegularFile, fd_path, open_regular
from p2ptrain.errors import WireError
from p2ptrain.records.stage_state import FORMAT, MAX_METADATA_BYTES, StateMeta

METADATA_KEY = "p2ptrain"
ZIP_MAGIC = b"PK\x03\x04"  # torch.save's files (formats /1 and /2)
_HEADER_SIZE = struct.Struct("<Q")
_OPTIM = re.compile(r"^optim/([0-9]{1,7})/([A-Za-z_][A-Za-z0-9_]{0,63})$")
# a parameter's name is checked against the stage's when the outer state is loaded
_OUTER = re.compile(r"^outer/(?:(?:anchor|momentum)/[A-Za-z0-9_.]{1,256}|steps)$")
_MAX_HEADER_BYTES = 100 * 1024**2 + MAX_METADATA_BYTES  # safetensors' own limit, and ours
# a tensor's entry in the header, `"name":{"dtype":"F32","shape":[..],"data_offsets":[a,b]},`, is
# ~100 bytes for ours; a 256-character outer name, 8 dimensions and 20-digit offsets stay below
HEADER_BYTES_PER_TENSOR = 512
# per weight: itself, AdamW's exp_avg, exp_avg_sq and step (max_exp_avg_sq under amsgrad), and
# DiLoCo's anchor and outer momentum
TENSORS_PER_WEIGHT = 7


def open_state(path: Path) -> BinaryIO:
    """The state file at `path` opened for reading; WireError if the name holds no regular file
    (a FIFO blocked the worker and the CLI forever, a symlink is not followed), OSError if it
    cannot be opened (gone, unreadable). Every read of a state file opens it here."""
    try:
        return open_regular(path)
    except NotRegularFile as exc:
        raise WireError(f"malformed stage state: {exc.strerror}") from None


def is_pickled(path: Path) -> bool:
    """Whether the file is a torch.save zip (an old format): never to be read from a peer."""
    with open_state(path) as f:
        return f.read(len(ZIP_MAGIC)) == ZIP_MAGIC


def write(
    path: Path,
    meta: StateMeta,
    model_state: dict[str, torch.Tensor],
    optimizer_state: dict[int, dict[str, Any]],
    outer_state: dict[str, torch.Tensor] | None = None,
) -> None:
    """Write a state file at `path` (the caller renames it into place). `optimizer_state` is
    Optimizer.state_dict()["state"]: its tensors go into the file, the rest must be in `meta`.
    `outer_state`: DiLoCo's tensors, named "outer/..." (worker/averaging/outer_rounds.py)."""
    tensors = {f"model/{name}": t.detach().contiguous() for name, t in model_state.items()}
    for name, value in (outer_state or {}).items():
        assert _OUTER.fullmatch(name), name
        tensors[name] = value.detach().contiguous()
    for index, values in optimizer_state.items():
        for name, value in values.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optim/{index}/{name}"] = value.detach().contiguous()
    safetensors.torch.save_file(tensors, str(path), metadata={METADATA_KEY: meta.to_json()})


def describe(
    run_id: str,
    data_sha256: str,
    model: dict[str, Any],
    layers: range,
    step: int,
    optimizer_state: dict[str, Any],
) -> StateMeta:
    """The metadata of a state: `optimizer_state` is Optimizer.state_dict(); its non-tensor
    parts go into the metadata, read back through the decoder (what we write, we can read)."""
    scalars = {
        str(index): {k: v for k, v in values.items() if not isinstance(v, torch.Tensor)}
        for index, values in optimizer_state.get("state", {}).items()
    }
    groups = [
        {k: list(v) if isinstance(v, tuple) else v for k, v in group.items()}
        for group in optimizer_state.get("param_groups", [])
    ]
    return StateMeta.from_dict(
        {
            "format": FORMAT,
            "run_id": run_id,
            "data_sha256": data_sha256,
            "model": model,
            "layers": [layers.start, layers.stop],
            "step": step,
            "param_groups": groups,
            "scalars": {i: s for i, s in scalars.items() if s},
        }
    )


def max_state_tensors(num_weights: int) -> int:
    """The most tensors a state of a stage with `num_weights` state_dict entries holds."""
    return num_weights * TENSORS_PER_WEIGHT + 1  # + DiLoCo's "outer/steps"


def max_header_bytes(max_tensors: int | None) -> int:
    """The longest safetensors header of a state of at most `max_tensors` tensors (None: of any
    state): its metadata and an entry per tensor. A longer one is never parsed: json.loads of
    100 MiB of `{},` builds GBs of Python objects."""
    if max_tensors is None:
        return _MAX_HEADER_BYTES
    return min(_MAX_HEADER_BYTES, MAX_METADATA_BYTES + HEADER_BYTES_PER_TENSOR * max_tensors)


def check(path: Path, max_tensors: int | None = None) -> StateMeta:
    """The file's metadata if it is a state file of format /3 (tensors not read); WireError
    otherwise. What a fetched file must pass before it is kept (worker/resume/state_transfer.py).
    `max_tensors`: the most the receiver expects (`max_state_tensors` of its stage); a header
    longer than such a state's is refused unread."""
    with open_state(path) as f:
        return _metadata(_header(f, max_header_bytes(max_tensors))[1])


def _header(f: BinaryIO, limit: int) -> tuple[int, Any]:
    """The length and the parsed JSON of the safetensors header `f` starts with."""
    head = f.read(_HEADER_SIZE.size)
    if len(head) < _HEADER_SIZE.size:
        raise WireError("malformed stage state: shorter than a safetensors header")
    (size,) = _HEADER_SIZE.unpack(head)
    if size > limit:
        raise WireError(f"oversized stage state: a header of {size} bytes, over {limit}")
    header = f.read(size)
    try:
        return size, json.loads(header)
    except (ValueError, RecursionError):
        raise WireError("malformed stage state: the safetensors header is not JSON") from None


def _metadata(parsed: Any) -> StateMeta:
    metadata = parsed.get("__metadata__") if isinstance(parsed, dict) else None
    if not isinstance(metadata, dict):
        raise WireError("malformed stage state: no metadata")
    return StateMeta.from_json(metadata.get(METADATA_KEY))


def check_whole(path: Path) -> StateMeta:
    """`check`, and the file's size is what its header's tensors need: the metadata of a state
    that is whole as far as its length tells (a power cut's file is empty, zeroed or short),
    without reading its tensors (a stage's state can be gigabytes); WireError otherwise."""
    with open_state(path) as f:
        length, header = _header(f, _MAX_HEADER_BYTES)
        size = os.fstat(f.fileno()).st_size
    meta = _metadata(header)
    try:
        ends = [t["data_offsets"][1] for n, t in header.items() if n != "__metadata__"]
    except (TypeError, KeyError, IndexError):
        raise WireError("malformed stage state: a tensor without its offsets") from None
    if not all(type(end) is int for end in ends) or size != 8 + length + max(ends, default=0):
        raise WireError(f"torn stage state: {size} bytes, not what its header's tensors need")
    return meta


def read(path: Path) -> dict[str, Any]:
    """A state file as train/checkpoint.py's dict: format, run_id, model, layers, step,
    model_state, optimizer_state (torch's Optimizer.state_dict() layout), outer_state (DiLoCo's
    "outer/..." tensors, empty under sync = "step"). WireError if it is
    not a well-formed file of format /3 (its tensors' shapes are checked by the caller)."""
    with open_state(path) as f:
        meta = _metadata(_header(f, _MAX_HEADER_BYTES)[1])
        # safetensors opens by name: the descriptor's own (Linux), so the file it maps is the
        # regular file checked here; elsewhere `path` again, a check-then-open
        name = fd_path(f.fileno()) or str(path)
        try:
            tensors = safetensors.torch.load_file(name, device="cpu")
        except Exception as exc:  # safetensors' own errors: a torn or crafted body
            raise WireError(f"malformed stage state: {str(exc)[:120]}") from None
    model_state: dict[str, torch.Tensor] = {}
    outer_state: dict[str, torch.Tensor] = {}
    moments: dict[int, dict[str, torch.Tensor]] = {}
    indices = meta.param_indices
    for name, tensor in tensors.items():
        if name.startswith("model/") and len(name) > len("model/"):
            model_state[name.removeprefix("model/")] = tensor
            continue
        if _OUTER.fullmatch(name):
            outer_state[name] = tensor
            continue
        match = _OPTIM.fullmatch(name)
        if match is None or int(match[1]) not in indices:
            raise WireError(f"malformed stage state: unexpected tensor {name[:80]!r}")
        moments.setdefault(int(match[1]), {})[match[2]] = tensor
    per_param: dict[int, dict[str, Any]] = {}
    for index in sorted(set(moments) | set(meta.scalars)):
        per_param[index] = {**meta.scalars.get(index, {}), **moments.get(index, {})}
    return {
        "format": FORMAT,
        "run_id": meta.run_id,
        "data_sha256": meta.data_sha256,
        "model": dict(meta.model),
        "layers": list(meta.layers),
        "step": meta.step,
        "model_state": model_state,
        "optimizer_state": {"state": per_param, "param_groups": meta.optimizer_groups()},
        "outer_state": outer_state,
    }
