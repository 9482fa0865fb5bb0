"""`"²".isdigit()` is true, but `int("²")` raises ValueError: a reader that checked with
isdigit() alone let a peer's "²" past its check and into an exception nobody caught (a relay
endpoint's port ended the control process). Every such check also asks for ASCII."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from p2ptrain import addresses, procs
from p2ptrain.errors import WireError
from p2ptrain.records.relay import endpoint
from p2ptrain.traversal.dialback import tcp_port, tcp_target
from p2ptrain.web.server import split_host_header

PACKAGE = Path(__file__).resolve().parent.parent / "p2ptrain"
ODD_DIGITS = ["²", "٣", "1²", "١٢٣"]  # a superscript, Arabic-Indic digits


@pytest.mark.parametrize("digits", ODD_DIGITS)
def test_odd_digits_are_refused_where_a_port_is_read(digits: str) -> None:
    with pytest.raises(WireError):
        endpoint(f"1.2.3.4:{digits}", "relay offer", "endpoint")
    assert tcp_target(f"/ip4/1.2.3.4/tcp/{digits}") is None
    assert tcp_port(f"/dns4/a.b/tcp/{digits}") is None
    assert addresses.tcp_endpoint(f"/ip4/1.2.3.4/tcp/{digits}") is None
    assert split_host_header(f"localhost:{digits}") is None


def test_a_folder_named_with_odd_digits_is_left_by_the_sweep(tmp_path: Path) -> None:
    (tmp_path / "x-²").mkdir()
    assert procs.sweep_pid_dirs(tmp_path, "x-") == []


def test_every_isdigit_check_also_asks_for_ascii() -> None:
    """Or a regex of [0-9]: the rule that keeps these bugs out."""
    unchecked = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        lines = source.splitlines()
        for node in ast.walk(ast.parse(source)):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "isdigit"
                and ".isascii()" not in lines[node.lineno - 1]
            ):
                unchecked.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert not unchecked, f"isdigit() without isascii(): {unchecked}"
