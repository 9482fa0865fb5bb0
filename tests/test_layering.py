"""Import rules: the folder tree is the architecture (see p2ptrain/__init__.py)."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "p2ptrain"

# heavy library -> packages allowed to import it
ALLOWED = {
    "hivemind": {"worker", "harness"},
    "libp2p": {"control", "net"},
    "trio": {"control", "net"},
    "torch": {"worker", "train", "harness"},
}


def imported_roots(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize(
    "path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE))
)
def test_heavy_libraries_stay_in_their_layer(path: Path) -> None:
    layer = path.relative_to(PACKAGE).parts[0]
    for lib in imported_roots(path) & set(ALLOWED):
        if layer == "cli":
            continue  # CLI modules import lazily inside run(); checked below
        assert layer in ALLOWED[lib], f"{path.name} in {layer}/ imports {lib}"


def test_schedule_is_pure() -> None:
    for path in (PACKAGE / "schedule").rglob("*.py"):
        assert not imported_roots(path) & {"torch", "hivemind", "libp2p", "trio"}, path


def test_cli_modules_import_heavy_libraries_lazily() -> None:
    for path in [*(PACKAGE / "cli").glob("*.py"), *(PACKAGE / "harness" / "cli").glob("*.py")]:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        top = set()
        for node in tree.body:
            if isinstance(node, ast.Import):
                top |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                top.add(node.module.split(".")[0])
        assert not top & set(ALLOWED), f"{path.name} imports {top & set(ALLOWED)} at module level"
