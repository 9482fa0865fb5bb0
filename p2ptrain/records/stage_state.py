"""The metadata of a stage-state file (format /3, train/state_file.py): everything in a saved
stage state that is not a tensor, as one JSON object in the safetensors header.

A state file moves between peers (worker/resume/state_transfer.py), so its metadata is read like any
wire value: `StateMeta.from_dict` (and `from_json`) return a valid record or raise WireError.
Nothing in the file is ever unpickled (docs/security.md, 26.7): AdamW's moments and step
counts are tensors beside the weights, and its param groups' hyperparameters are plain values
here.

    {"format": "p2ptrain.stage-checkpoint/3", "run_id": str, "data_sha256": "" or hex,
     "model": {ModelConfig field: value}, "layers": [start, stop], "step": N,
     "param_groups": [{"params": [index, ...], hyperparameter: value, ...}, ...],
     "scalars": {"<index>": {field: number}}}

A hyperparameter value is null, a bool, a finite number, a short string or a short list of
finite numbers (AdamW's betas: a tuple again once read). `scalars` holds the per-parameter
optimizer values that are not tensors (none for torch's AdamW, whose step count is a tensor).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from p2ptrain.records import fields as f
from p2ptrain.records.run import MAX_RUN_ID_CHARS

FORMAT = "p2ptrain.stage-checkpoint/3"
MAX_LAYERS = 1_000_000
MAX_PARAMS = 1_000_000  # parameters of one stage's optimizer
MAX_GROUPS = 64
MAX_GROUP_ENTRIES = 64
MAX_LIST_ITEMS = 8
MAX_METADATA_BYTES = 16 * 1024**2  # the JSON text: one index per parameter dominates
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_RECORD = "stage state"

Scalar = bool | int | float | str | None
Hyper = Scalar | tuple[float, ...]


@dataclass(frozen=True)
class StateMeta:
    run_id: str
    model: Mapping[str, Scalar]  # dataclasses.asdict(ModelConfig), or nanoGPT's sizes
    layers: tuple[int, int]
    step: int
    # one per param group: the parameters' indices and the hyperparameters (no "params" key)
    param_groups: tuple[tuple[tuple[int, ...], Mapping[str, Hyper]], ...]
    scalars: Mapping[int, Mapping[str, float]] = field(default_factory=dict)
    data_sha256: str = ""  # the run's data digest ("": not pinned)

    @property
    def param_indices(self) -> set[int]:
        return {index for params, _ in self.param_groups for index in params}

    def optimizer_groups(self) -> list[dict[str, Any]]:
        """The param groups as torch's Optimizer.state_dict() has them."""
        return [{**hyper, "params": list(params)} for params, hyper in self.param_groups]

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "run_id": self.run_id,
            "data_sha256": self.data_sha256,
            "model": dict(self.model),
            "layers": list(self.layers),
            "step": self.step,
            "param_groups": [
                {**_plain_values(hyper), "params": list(params)}
                for params, hyper in self.param_groups
            ],
            "scalars": {str(i): dict(values) for i, values in self.scalars.items()},
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"), allow_nan=False)

    @classmethod
    def from_json(cls, text: object) -> StateMeta:
        if not isinstance(text, str) or len(text) > MAX_METADATA_BYTES:
            raise f.malformed(_RECORD, "metadata is not a JSON text of bounded size")
        try:
            data = json.loads(text, parse_constant=_refuse_constant)
        except (ValueError, RecursionError) as exc:  # bad JSON, NaN, huge integers, nesting
            raise f.malformed(_RECORD, f"metadata is not JSON: {str(exc)[:80]}") from None
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: object) -> StateMeta:
        raw = f.mapping(data, _RECORD)
        f.require_keys(raw, _RECORD, ("format", "run_id", "model", "layers", "step"))
        if raw["format"] != FORMAT:
            raise f.malformed(_RECORD, f"format must be {FORMAT}")
        layers = raw["layers"]
        if not isinstance(layers, list) or len(layers) != 2:
            raise f.malformed(_RECORD, "layers must be [start, stop]")
        start = f.integer(layers[0], _RECORD, "layers start", 0, MAX_LAYERS - 1)
        stop = f.integer(layers[1], _RECORD, "layers stop", start + 1, MAX_LAYERS)
        groups = raw.get("param_groups", [])
        if not isinstance(groups, list) or len(groups) > MAX_GROUPS:
            raise f.malformed(_RECORD, f"param_groups must be a list of <= {MAX_GROUPS}")
        param_groups = tuple(_group(g) for g in groups)
        indices = [i for params, _ in param_groups for i in params]
        if len(set(indices)) != len(indices):
            raise f.malformed(_RECORD, "a parameter is in two param groups")
        return cls(
            run_id=f.text(raw["run_id"], _RECORD, "run_id", MAX_RUN_ID_CHARS),
            model=_model(raw["model"]),
            layers=(start, stop),
            step=f.integer(raw["step"], _RECORD, "step"),
            param_groups=param_groups,
            scalars=_scalars(raw.get("scalars", {}), set(indices)),
            data_sha256=_digest(raw.get("data_sha256", "")),
        )


def _plain_values(hyper: Mapping[str, Hyper]) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in hyper.items()}


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not a finite number")


def _digest(value: object) -> str:
    if not isinstance(value, str) or (value and not _SHA256.fullmatch(value)):
        raise f.malformed(_RECORD, "data_sha256 must be empty or 64 lowercase hex digits")
    return value


def _name(value: object, what: str) -> str:
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise f.malformed(_RECORD, f"{what} must be an identifier of <= 64 characters")
    return value


def _scalar(value: object, what: str) -> Scalar:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        if len(value) > 64:
            raise f.malformed(_RECORD, f"{what} is a string over 64 characters")
        return value
    if isinstance(value, int) and abs(value) <= f.MAX_INT:
        return value
    if isinstance(value, float) and math.isfinite(value):
        return value
    raise f.malformed(_RECORD, f"{what} must be null, a bool, a finite number or a string")


def _model(value: object) -> dict[str, Scalar]:
    model = f.mapping(value, _RECORD)
    if len(model) > MAX_GROUP_ENTRIES:
        raise f.malformed(_RECORD, "model has too many fields")
    return {_name(k, "a model field"): _scalar(v, f"model {k}") for k, v in model.items()}


def _group(value: object) -> tuple[tuple[int, ...], dict[str, Hyper]]:
    group = f.mapping(value, _RECORD)
    if len(group) > MAX_GROUP_ENTRIES:
        raise f.malformed(_RECORD, "a param group has too many entries")
    params = group.get("params")
    if not isinstance(params, list) or len(params) > MAX_PARAMS:
        raise f.malformed(_RECORD, "a param group's params must be a list of indices")
    indices = tuple(f.integer(i, _RECORD, "a parameter index", 0, MAX_PARAMS) for i in params)
    hyper: dict[str, Hyper] = {}
    for key, item in group.items():
        if key == "params":
            continue
        name = _name(key, "a hyperparameter")
        if isinstance(item, list):
            if len(item) > MAX_LIST_ITEMS:
                raise f.malformed(_RECORD, f"hyperparameter {name} is a long list")
            hyper[name] = tuple(f.number(x, _RECORD, name, -math.inf, math.inf) for x in item)
        else:
            hyper[name] = _scalar(item, f"hyperparameter {name}")
    return indices, hyper


def _scalars(value: object, indices: set[int]) -> dict[int, dict[str, float]]:
    raw = f.mapping(value, _RECORD)
    if len(raw) > len(indices):
        raise f.malformed(_RECORD, "scalars name more parameters than the param groups")
    found: dict[int, dict[str, float]] = {}
    for key, values in raw.items():
        if not key.isascii() or not key.isdigit() or len(key) > 7 or int(key) not in indices:
            raise f.malformed(_RECORD, "scalars are keyed by the param groups' indices")
        entries = f.mapping(values, _RECORD)
        if len(entries) > MAX_GROUP_ENTRIES:
            raise f.malformed(_RECORD, "too many scalars for one parameter")
        found[int(key)] = {
            _name(k, "a scalar's name"): f.number(v, _RECORD, k, -math.inf, math.inf)
            for k, v in entries.items()
        }
    return found
