"""Import rules: the folder tree is the architecture (docs/architecture.md).

Every import is read from the source (lazy ones inside functions too): packages import only
packages below them, the product never imports the harness, heavy libraries stay in their layer,
and no module imports itself through others.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "p2ptrain"

# Layers, top to bottom: a module may import its own package and packages of lower layers, never
# a package of its own layer or above. One-file modules at the top of p2ptrain/ count as packages.
LAYERS: list[set[str]] = [
    {"__main__"},
    {"app"},  # composes the `p2ptrain` command from the product's and the harness's
    {"harness"},  # drives the product from outside: local swarms, benchmarks, baselines
    {"cli"},
    {"node"},
    {"control", "worker"},  # two processes: neither imports the other
    {"traversal"},  # relay, punch, dial-back, UDP observer: driven by control, built on net
    {"net", "train", "web"},
    {"schedule", "testbed"},
    {"ipc_lines", "addresses"},  # the worker socket's framing; listen and announce addresses
    {"records"},
    {"identity"},
    {"key_file"},  # the node's key file, stdlib only: what the supervisor needs of the identity
    {"procs"},  # processes: spawn, stop, sweep what a dead one left
    {
        "errors",
        "flags",
        "sampled_log",
        "durable",
        "__init__",
    },  # stdlib only: flags, log lines, fsync
]
PRODUCT = {
    "cli",
    "node",
    "control",
    "traversal",
    "net",
    "worker",
    "train",
    "schedule",
    "records",
    "web",
}
# Sub-packages ("wings") of a layer: a module of one may import its layer's other modules, and
# the layer's other modules may import it; the layer rules above hold for them as for the rest.
WINGS = {
    "worker": {"averaging", "pipeline", "resume"},
    "control": {"planning", "estimate"},
}
LEVEL = {name: level for level, names in enumerate(LAYERS) for name in names}

# heavy library -> packages allowed to import it
ALLOWED = {
    "hivemind": {"worker", "harness"},
    "libp2p": {"control", "traversal", "net"},
    "trio": {"control", "traversal", "net"},
    "torch": {"worker", "train", "harness"},
    "prometheus_client": {"web"},
    "tokenizers": {"train"},
}
MODULES = sorted(PACKAGE.rglob("*.py"))


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULE_NAMES = {_module_name(p) for p in MODULES}


@cache
def imports_of(path: Path) -> frozenset[str]:
    """The modules a file imports anywhere (lazy imports too): `from X import Y` names X.Y when
    that is a module of ours, else X."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                anchor = parts[: len(parts) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in MODULE_NAMES else base)
    return frozenset(found)


def _layer(path: Path) -> str:
    first = path.relative_to(PACKAGE).parts[0]
    return first.removesuffix(".py")


def _p2ptrain_packages(path: Path) -> set[str]:
    return {name.split(".")[1] for name in imports_of(path) if name.startswith("p2ptrain.")} - {""}


def test_every_package_has_a_layer() -> None:
    assert {_layer(p) for p in MODULES} <= set(LEVEL), "add the new package to LAYERS"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_go_down_the_layers(path: Path) -> None:
    own = _layer(path)
    for target in _p2ptrain_packages(path) - {own}:
        assert target in LEVEL, f"{target} has no layer"
        assert LEVEL[target] > LEVEL[own], f"{own}/ must not import {target}/ ({path.name})"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_product_never_imports_a_harness(path: Path) -> None:
    if _layer(path) in PRODUCT:
        assert "harness" not in _p2ptrain_packages(path), path
        assert not any("harness" in name for name in imports_of(path)), path


def _imports_the_testbed(layer: str, packages: set[str]) -> bool:
    """The testbed emulates a network for the harness; it sits below the product in LAYERS, so
    the layer rule alone would let the product import it."""
    return layer in PRODUCT and "testbed" in packages


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_product_never_imports_the_testbed(path: Path) -> None:
    assert not _imports_the_testbed(_layer(path), _p2ptrain_packages(path)), path


def test_the_testbed_rule_refuses_what_the_layers_allow() -> None:
    assert LEVEL["testbed"] > LEVEL["worker"]  # the layer rule would let this one pass
    assert _imports_the_testbed("worker", {"testbed", "records"})
    assert _imports_the_testbed("traversal", {"testbed"})
    assert not _imports_the_testbed("harness", {"testbed"})


def test_the_wings_are_packages_of_their_layer() -> None:
    for layer, wings in WINGS.items():
        for wing in wings:
            assert (PACKAGE / layer / wing / "__init__.py").is_file(), f"{layer}/{wing}/"
    found = {
        (p.parent.parent.name, p.parent.name)
        for p in PACKAGE.glob("*/*/__init__.py")
        if p.parent.parent.name in WINGS
    }
    known = {(layer, wing) for layer, wings in WINGS.items() for wing in wings}
    assert found <= known, f"add the new wing to WINGS: {found - known}"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_heavy_libraries_stay_in_their_layer(path: Path) -> None:
    roots = {name.split(".")[0] for name in imports_of(path)}
    for lib in roots & set(ALLOWED):
        if _layer(path) == "cli":
            continue  # checked below: only inside the chosen subcommand's run()
        assert _layer(path) in ALLOWED[lib], f"{path.name} in {_layer(path)}/ imports {lib}"


def test_cli_modules_import_heavy_libraries_lazily() -> None:
    for path in (PACKAGE / "cli").glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        top = set()
        for node in tree.body:
            if isinstance(node, ast.Import):
                top |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                top.add(node.module.split(".")[0])
        assert not top & set(ALLOWED), f"{path.name} imports {top & set(ALLOWED)} at module level"


def test_no_import_circles() -> None:
    """Tarjan's strongly connected components over the module graph: all of size one."""
    names = {_module_name(p): p for p in MODULES}
    graph = {
        name: sorted(target for target in imports_of(path) if target in names and target != name)
        for name, path in names.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    assert not circles, f"import circles: {circles}"


def test_no_module_is_over_400_lines() -> None:
    lengths = {str(p.relative_to(PACKAGE)): len(p.read_text().splitlines()) for p in MODULES}
    assert not {p: n for p, n in lengths.items() if n > 400}, "split these by concept"


def test_the_node_supervisor_loads_no_heavy_library() -> None:
    """A volunteer's machine runs a supervisor per node for as long as the node runs: it holds
    only what it needs (stdlib, flags, addresses' bounds), ~16 MiB, not the records' 18 MiB
    (cryptography's bindings) nor a library of the control process."""
    script = (
        "import sys, p2ptrain.node.supervisor; "
        "print(sorted({m.split('.')[0] for m in sys.modules}"
        " & {'cryptography', 'numpy', 'libp2p', 'trio', 'torch', 'hivemind'}))"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
