"""`join --help` and `bootstrap --help` show what --http takes: [HOST:]PORT[,NAME...] (the names
the dashboard answers to in the Host header, issue 26), and such a value parses."""

from __future__ import annotations

import argparse

import pytest

from p2ptrain.app import SUBCOMMANDS
from p2ptrain.cli.main import build_parser
from p2ptrain.web.server import parse_http_option


@pytest.mark.parametrize("command", ["join", "bootstrap"])
def test_the_help_shows_the_names_http_takes(command: str) -> None:
    parser = build_parser(SUBCOMMANDS, [command])
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    help_text = sub.choices[command].format_help()
    assert "--http [HOST:]PORT[,NAME...]" in help_text
    assert "Host header" in help_text
    option = parse_http_option("0.0.0.0:8080,swarm.example.org")
    assert (option.port, option.names) == (8080, ("swarm.example.org",))
