"""`"²".isdigit()` is true, but `int("²")` raises ValueError: a reader that checked with
isdigit() alone let a peer's "²" past its check and into an exception nobody caught (a relay
endpoint's port ended the control process). Every such check also asks for ASCII."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from p2ptrain import addresses, procs
from p2ptrain.errors import WireError
from p2ptrain.records.lineage import parse_tag
from p2ptrain.records.relay import endpoint
from p2ptrain.train.checkpoint_folder import list_states
from p2ptrain.traversal.dialback import tcp_port, tcp_target
from p2ptrain.web.server import split_host_header
from p2ptrain.worker.resume.covers import key_range

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


@pytest.mark.parametrize("digits", ODD_DIGITS)
def test_odd_digits_are_no_number_in_a_name_or_tag(tmp_path: Path, digits: str) -> None:
    """\\d takes "٣" and int() reads it as 3: one value spelled two ways ("L٠-٣" was
    range(0, 3), a tag "...-e٣" epoch 3, a file "stage-L٠-٣.step٣.pt" a state of L0-3)."""
    assert parse_tag(f"0123456789abcdef-e{digits}") is None
    assert key_range(f"L{digits}-{digits}9") is None
    assert key_range(f"L0-{digits}") is None
    (tmp_path / f"stage-L0-{digits}.step{digits}.pt").write_bytes(b"")
    (tmp_path / f"stage-L0-2.step1.0123456789abcdef-e{digits}.pt").write_bytes(b"")
    assert list_states(tmp_path) == []


def test_no_regex_uses_backslash_d() -> None:
    """A regex's \\d matches every Unicode digit: [0-9] (or re.ASCII) says what a reader means."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and "\\d" in str(node.value):
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert not found, f"\\d in a regex (use [0-9]): {found}"


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
