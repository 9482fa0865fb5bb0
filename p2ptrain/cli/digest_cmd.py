"""`p2ptrain digest`: the sha256 of a run's data as this machine holds it, the line an organiser
puts in the run spec (`data_sha256`) so that every peer trains on the same bytes."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run", metavar="RUN.toml", help="run spec (default: the built-in run)")


def run(args: argparse.Namespace) -> int:
    from p2ptrain.records.run import load_run_spec
    from p2ptrain.train.data import corpus_sha256, load_tokens  # numpy and torch: the train extra

    spec = load_run_spec(args.run)
    tokens = load_tokens(spec)
    digest = corpus_sha256(tokens)
    print(
        f'data_sha256 = "{digest}"  # {spec.data.source!r}: {tokens.size} tokens ({spec.data.data_format})'
    )
    if spec.data.data_sha256 and spec.data.data_sha256 != digest:
        print(f"p2ptrain digest: the run pins another digest ({spec.data.data_sha256})")
        return 1
    return 0
