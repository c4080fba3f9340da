"""The layering holds: core <- storage <- tasks <- flows <- cli; nothing lower imports anything higher.

The simulator stands beside the core: it uses only the core's public names, and only the CLI loads it.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
LAYERS = ["llm_dispatch", "storage", "tasks", "flows", "cli"]
# The core stays free of Prefect so it is quick to import and reusable outside flows.
FORBIDDEN_EXTRA = {"llm_dispatch": {"prefect"}, "storage": {"prefect"}}
SIMULATOR = "simulator"
# What a flow run imports; none of it may bring the simulator along.
FLOW_RUN_PACKAGES = ["llm_dispatch", "storage", "tasks", "flows"]


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


@pytest.mark.parametrize("package", FLOW_RUN_PACKAGES)
def test_only_the_cli_imports_the_simulator(package: str) -> None:
    offenders = [
        str(path.relative_to(ROOT)) for path in (ROOT / package).rglob("*.py") if SIMULATOR in imported_top_levels(path)
    ]
    assert offenders == []


def test_the_simulator_imports_nothing_above_the_core() -> None:
    above = set(LAYERS[1:]) | {"prefect"}
    offenders = {
        str(path.relative_to(ROOT)): sorted(imported_top_levels(path) & above)
        for path in (ROOT / SIMULATOR).rglob("*.py")
        if imported_top_levels(path) & above
    }
    assert offenders == {}


def test_the_simulator_uses_only_the_core_s_public_names() -> None:
    import llm_dispatch

    public = set(llm_dispatch.__all__)
    private_uses: list[str] = []
    for path in (ROOT / SIMULATOR).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                if node.module.startswith("llm_dispatch."):
                    private_uses.append(f"{where} from {node.module}")
                elif node.module == "llm_dispatch":
                    private_uses += [f"{where} {a.name}" for a in node.names if a.name not in public]
            elif isinstance(node, ast.Import):
                private_uses += [f"{where} import {a.name}" for a in node.names if a.name.startswith("llm_dispatch.")]
    assert private_uses == []


def test_a_flow_run_never_loads_the_simulator() -> None:
    # A fresh interpreter: this test process has long since imported the simulator for other tests.
    script = (
        "import importlib, pkgutil, sys\n"
        f"for name in {FLOW_RUN_PACKAGES!r}:\n"
        "    package = importlib.import_module(name)\n"
        "    for module in pkgutil.walk_packages(package.__path__, prefix=name + '.'):\n"
        "        if '.migrations' not in module.name:\n"
        "            importlib.import_module(module.name)\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] == {SIMULATOR!r}))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
