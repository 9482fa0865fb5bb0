"""The run spec: what a swarm trains, published by its bootstrap node.

Pure stdlib. Read from the organiser's TOML file (`load_run_spec`), gossiped in a signed envelope,
handed to every worker with its plan. A run id and six sections (records/run_sections.py): the
swarm's settings, and the model, data, optimizer, wire formats and checkpoints of the data plane
(`RunSpec.model_config` resolves the model's sizes). Every field is defaulted, JSON-friendly and
validated in `from_dict`, so old peers and new ones can read each other's specs.

The sectioned form (`to_dict`, a TOML file's `[run]` with `[run.model]` etc.) is what we write;
the flat form of older files and peers (every field at one level) still reads, each field routed
to its section, since every field name is unique across the sections.
"""

from __future__ import annotations

import dataclasses
import json
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from p2ptrain.errors import UserError, WireError
from p2ptrain.records.model_config import ModelConfig
from p2ptrain.records.run_sections import (
    MAX_TEXT_CHARS,
    CheckpointSpec,
    DataSpec,
    ModelSpec,
    OptimSpec,
    SwarmSpec,
    WireSpec,
    frame_problem,
    model_config,
)

MAX_RUN_ID_CHARS = 64
MAX_INT = 2**53
SECTIONS: dict[str, type] = {
    "swarm": SwarmSpec,
    "model": ModelSpec,
    "data": DataSpec,
    "optim": OptimSpec,
    "wire": WireSpec,
    "checkpoint": CheckpointSpec,
}
# a field's flat name (a flat run file's key, `replace`'s keyword) -> its section and name:
# every field name is unique across the sections; `model` and `data` name sections now, so
# their flat names are the model's family and the data's source
_RENAMED = {("model", "family"): "model", ("data", "source"): "data"}
_FIELDS = {section: {f.name for f in dataclasses.fields(cls)} for section, cls in SECTIONS.items()}
FLAT_NAMES = {
    _RENAMED.get((section, f.name), f.name): (section, f.name)
    for section, cls in SECTIONS.items()
    for f in dataclasses.fields(cls)
}
# Hugging Face's names of the model's sizes, once fields of their own: now one name per size
HF_SIZE_NAMES = {
    "num_hidden_layers": "n_layer",
    "num_attention_heads": "n_head",
    "hidden_size": "n_embd",
}


@dataclass(frozen=True)
class RunSpec:
    """One training run: its id and its sections (`spec.swarm.stages`, `spec.model.n_layer`,
    `spec.optim.batch_size`, ...). Change fields with `replace(name=value)`."""

    run_id: str = "p2ptrain-default"
    swarm: SwarmSpec = dataclasses.field(default_factory=SwarmSpec)
    model: ModelSpec = dataclasses.field(default_factory=ModelSpec)
    data: DataSpec = dataclasses.field(default_factory=DataSpec)
    optim: OptimSpec = dataclasses.field(default_factory=OptimSpec)
    wire: WireSpec = dataclasses.field(default_factory=WireSpec)
    checkpoint: CheckpointSpec = dataclasses.field(default_factory=CheckpointSpec)

    def __post_init__(self) -> None:
        if not self.run_id or len(self.run_id) > MAX_RUN_ID_CHARS or not self.run_id.isprintable():
            raise UserError(f"run_id must be 1..{MAX_RUN_ID_CHARS} printable characters")
        # a folder's name on every volunteer's disk (runs/<run_id>/checkpoints) and a field of
        # round keys split on "/": "../../x" or "/dev/shm" left the working directory
        if any(c in self.run_id for c in "/\\") or self.run_id.startswith("."):
            raise UserError(f"run_id must not hold / or \\ nor start with '.', got {self.run_id!r}")
        # what ties two sections together; each section checked its own fields
        stages, model = self.swarm.stages, self.model
        if stages > model.n_layer:
            raise UserError(f"stages ({stages}) cannot exceed n_layer ({model.n_layer})")
        if model.tie_word_embeddings and stages > 1:
            raise UserError(
                "tie_word_embeddings needs stages = 1: the embedding and the head it shares its "
                "weight with would sit on different peers"
            )
        if self.data.data_format == "text" and not self.data.tokenizer and model.vocab_size < 256:
            raise UserError("text data is byte-level: vocab_size must be >= 256")
        problem = frame_problem(model, self.optim, self.wire, self.swarm.stages)
        if problem:
            raise UserError(problem)

    def model_config(self) -> ModelConfig:
        """Every size of the run's model (the one place they are derived)."""
        return model_config(self.model)

    def tokens_per_step(self, replicas: int) -> int:
        """Tokens the swarm trains a step with `replicas` pipelines (what shapes are compared
        by, per second): under diloco each replica trains its own batch."""
        rows = self.optim.batch_size * (replicas if self.optim.sync == "diloco" else 1)
        return rows * self.model.block_size

    def replace(self, **changes: Any) -> RunSpec:
        """A copy with some fields changed, each by its flat name (`replace(stages=4, n_layer=8,
        model="llama")`); validated like any spec."""
        run_id = changes.pop("run_id", self.run_id)
        per_section: dict[str, dict[str, Any]] = {}
        for flat_name, value in changes.items():
            if flat_name not in FLAT_NAMES:
                raise TypeError(f"RunSpec has no field {flat_name!r}")
            section, name = FLAT_NAMES[flat_name]
            per_section.setdefault(section, {})[name] = value
        sections = {
            name: dataclasses.replace(getattr(self, name), **per_section.get(name, {}))
            for name in SECTIONS
        }
        return RunSpec(run_id, **sections)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: the run id and one object per section."""
        doc: dict[str, Any] = {"run_id": self.run_id}
        for name in SECTIONS:
            doc[name] = dataclasses.asdict(getattr(self, name))
        return doc

    def to_flat_dict(self) -> dict[str, Any]:
        """Every field at one level, by its flat name (`model`, `data` for family and source):
        the keys of JSON documents that embed a run's settings, and of older run files."""
        flat: dict[str, Any] = {"run_id": self.run_id}
        for name in SECTIONS:
            for key, value in dataclasses.asdict(getattr(self, name)).items():
                flat[_RENAMED.get((name, key), key)] = value
        return flat

    def to_toml(self) -> str:
        """The spec as a run file: `[run]` with its id, then one `[run.<section>]` table each."""
        lines = ["[run]", f"run_id = {json.dumps(self.run_id)}"]
        for name in SECTIONS:
            lines += ["", f"[run.{name}]"]
            for key, value in dataclasses.asdict(getattr(self, name)).items():
                lines.append(f"{key} = {json.dumps(value)}")  # JSON scalars are TOML scalars
        return "\n".join(lines) + "\n"

    @classmethod
    def from_dict(cls, data: object) -> RunSpec:
        """Build a spec from its sectioned dict or an older flat one; unknown keys, wrong types or
        values out of range raise WireError (a UserError: from a file, the CLI prints one line)."""
        try:
            return _from_dict(data)
        except WireError:
            raise
        except UserError as exc:
            raise WireError(f"malformed run: {exc}") from None


def _from_dict(data: object) -> RunSpec:
    if not isinstance(data, dict):
        raise UserError("a run spec must be a table/object")
    run_id = RunSpec.run_id
    tables: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
    hf_sizes: dict[str, int] = {}
    unknown: list[str] = []
    for key, value in data.items():
        if key == "run_id":
            run_id = _checked("run_id", value, RunSpec.run_id)
        elif key in SECTIONS and isinstance(value, dict):
            for name, sub in value.items():
                _place(tables, hf_sizes, unknown, name, sub, section=key)
        else:  # the flat form: a field by its flat name
            _place(tables, hf_sizes, unknown, key, value)
    if unknown:
        raise UserError(f"unknown run spec field(s): {', '.join(sorted(unknown))}")
    sections = {name: SECTIONS[name](**values) for name, values in tables.items()}
    for hf_name, size in hf_sizes.items():
        name = HF_SIZE_NAMES[hf_name]
        if size and size != getattr(sections["model"], name):  # 0: an older peer's "derived"
            raise UserError(
                f"run spec: `{hf_name}` is now `{name}` (one name per size): "
                f"write {name} = {size} and drop {hf_name}"
            )
    return RunSpec(run_id, **sections)


def _place(
    tables: dict[str, dict[str, Any]],
    hf_sizes: dict[str, int],
    unknown: list[str],
    key: str,
    value: object,
    section: str | None = None,
) -> None:
    """Put one field's checked value into its section's table: `key` is a field's name in
    `section`'s table, or its flat name (section None)."""
    shown = f"{section}.{key}" if section else str(key)
    if key in HF_SIZE_NAMES and section in (None, "model"):
        hf_sizes[key] = _checked(shown, value, 0)
        return
    if section is None:
        home, name = FLAT_NAMES.get(key, ("", key))
    else:
        home, name = section, key
    cls = SECTIONS.get(home)
    if cls is None or name not in _FIELDS[home]:
        elsewhere = [other for other in SECTIONS if key in _FIELDS[other]] if section else []
        hint = f" (a field of [run.{elsewhere[0]}])" if elsewhere else ""
        unknown.append(shown + hint)
        return
    if name in tables[home]:
        raise UserError(f"run spec field {shown!r} is given twice (flat and in [{home}])")
    tables[home][name] = _checked(shown, value, getattr(cls, name))


def _checked(name: str, value: object, default: Any) -> Any:
    """`value` if it has the default's type (an int where a float goes) and is in range."""
    expected: tuple[type, ...] = (int, float) if isinstance(default, float) else (type(default),)
    if isinstance(value, bool) != isinstance(default, bool) or not isinstance(value, expected):
        raise UserError(f"run spec field {name!r} must be {type(default).__name__}")
    if isinstance(value, int) and abs(value) > MAX_INT:
        raise UserError(f"run spec field {name!r} is out of range")
    if isinstance(value, float) and not math.isfinite(value):
        raise UserError(f"run spec field {name!r} must be finite")
    if isinstance(value, str) and len(value) > MAX_TEXT_CHARS:
        raise UserError(f"run spec field {name!r} is longer than {MAX_TEXT_CHARS}")
    return float(value) if isinstance(value, int | float) and isinstance(default, float) else value


def load_run_spec(path: str | Path | None) -> RunSpec:
    """Read a run spec from a TOML file (the `[run]` table with its `[run.<section>]` tables, or
    the top level; a flat table still reads); None -> the default."""
    if path is None:
        return RunSpec()
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise UserError(f"cannot read run spec {path}: {exc.strerror}") from exc
    except ValueError as exc:  # TOMLDecodeError, UnicodeDecodeError, an int past 4300 digits
        raise UserError(f"run spec {path} is not valid TOML: {exc}") from exc
    except RecursionError:  # arrays nested past Python's stack: no run spec nests at all
        raise UserError(f"run spec {path} is not valid TOML: nested too deep") from None
    table = data.get("run", data)
    return _from_dict(table)  # the user's own file: its errors without a wire category
