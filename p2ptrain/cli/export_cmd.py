"""`p2ptrain export`: a run's stage checkpoints merged into a Hugging Face model directory
(config.json and model.safetensors) that `transformers` loads with
`AutoModelForCausalLM.from_pretrained(OUT)`. It prints the step and lineage it exported, and a
line for each file of another run it left out."""

from __future__ import annotations

import argparse
from pathlib import Path

from p2ptrain.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run", metavar="RUN.toml", help="run spec (default: the built-in run)")
    parser.add_argument(
        "--checkpoint-dir",
        metavar="DIR",
        help="the stage checkpoints (default: the run spec's checkpoint_dir)",
    )
    parser.add_argument("--out", metavar="OUT", required=True, help="directory to write")
    parser.add_argument(
        "--step", type=int, help="export this step (default: the newest one every stage holds)"
    )


def run(args: argparse.Namespace) -> int:
    from p2ptrain.cli.checkpoints_cmd import states_directory
    from p2ptrain.records.run import load_run_spec
    from p2ptrain.train.export import export_hf

    spec = load_run_spec(args.run)
    directory = states_directory(args.checkpoint_dir, spec)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out}: a file is there; give a directory (made if missing)")
    merged = export_hf(spec, directory, out, args.step)
    for line in merged.skipped:  # another run's files in the same directory
        print(line)
    lineage = "" if merged.lineage is None else f" (lineage {merged.lineage})"
    print(
        f"{args.out}: {spec.model.family} model of run {spec.run_id!r} at step {merged.step}{lineage}"
    )
    if merged.other_lineages:
        print(
            f"step {merged.step} was also saved under lineage "
            f"{', '.join(merged.other_lineages)}: exported the one saved last"
        )
    return 0
