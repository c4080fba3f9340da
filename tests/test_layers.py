"""The layering holds: core <- storage <- jobs <- tasks <- flows <- cli; nothing lower imports anything higher."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
LAYERS = ["llm_dispatch", "storage", "jobs", "tasks", "flows", "cli"]
# The core stays free of Prefect so it is quick to import and reusable outside flows.
FORBIDDEN_EXTRA = {"llm_dispatch": {"prefect"}, "storage": {"prefect"}, "jobs": {"prefect"}}


def imported_top_levels(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("layer", LAYERS)
def test_no_layer_imports_a_higher_one(layer: str) -> None:
    higher = set(LAYERS[LAYERS.index(layer) + 1 :]) | FORBIDDEN_EXTRA.get(layer, set())
    offenders = {
        str(path.relative_to(ROOT)): sorted(imported_top_levels(path) & higher)
        for path in (ROOT / layer).rglob("*.py")
        if imported_top_levels(path) & higher
    }
    assert offenders == {}
