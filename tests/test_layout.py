"""The source folders are layers (docs/reference/layout.md): each imports only from the layers below it, so a
folder's name says what it may use. Read from the code's own imports, function-level and TYPE_CHECKING ones
included."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "rlcli"
SHARED = {"contracts", "registry", "batches", "schedules"}  # src/rlcli/*.py: what every layer agrees on
# Lower numbers are lower layers; folders of one number may not import each other either way.
LAYERS = {"services": 1, "envs": 2, "buffers": 2, "actors": 3, "offline": 3, "algos": 4, "collectors": 5,
          "run": 6, "sweeps": 7, "entry": 8}


def layer_of(module: str) -> tuple[str, int] | None:
    """(folder, rank) of an rlcli module; None for the package itself (its lazy re-exports are the API's face)."""
    parts = module.split(".")
    if parts[0] != "rlcli" or len(parts) == 1 or parts[1] in ("__init__", "__main__"):
        return None
    if parts[1] in SHARED:
        return "shared", 0
    assert parts[1] in LAYERS, f"{module}: src/rlcli/{parts[1]} is in no layer of LAYERS (or SHARED)"
    return parts[1], LAYERS[parts[1]]


def imports_of(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "rlcli":
                found |= {f"rlcli.{alias.name}" for alias in node.names if not alias.name.startswith("__")}
            else:
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return {name for name in found if name.startswith("rlcli.")}


MODULES = sorted(p for p in PACKAGE.rglob("*.py"))


def test_every_top_level_entry_is_a_layer_or_shared():
    names = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir() if p.suffix == ".py" or p.is_dir()}
    unknown = names - SHARED - set(LAYERS) - {"__init__", "__main__", "__pycache__", "conf"}
    assert not unknown, f"place {sorted(unknown)} in a layer (LAYERS here and docs/reference/layout.md)"


@pytest.mark.parametrize("path", MODULES, ids=[str(p.relative_to(PACKAGE)) for p in MODULES])
def test_a_module_imports_only_its_own_layer_and_those_below(path):
    module = ".".join(("rlcli", *path.relative_to(PACKAGE).with_suffix("").parts))
    here = layer_of(module)
    if here is None:
        return
    upward = []
    for target in imports_of(path):
        there = layer_of(target)
        if there is None or there[0] == here[0]:
            continue
        if there[1] >= here[1]:
            upward.append(f"{target} ({there[0]}, layer {there[1]})")
    assert not upward, f"{module} ({here[0]}, layer {here[1]}) imports from its own level or above: {upward}"
