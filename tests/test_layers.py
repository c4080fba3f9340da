"""The layering holds: core <- storage <- jobs <- tasks <- flows <- cli; nothing lower imports anything higher.

The simulator stands beside the core: it uses only the core's public names, and only the CLI loads it.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
LAYERS = ["llm_dispatch", "storage", "jobs", "tasks", "flows", "cli"]
# The core stays free of Prefect so it is quick to import and reusable outside flows.
FORBIDDEN_EXTRA = {"llm_dispatch": {"prefect"}, "storage": {"prefect"}, "jobs": {"prefect"}}
SIMULATOR = "simulator"
# What a flow run imports; none of it may bring the simulator along.
FLOW_RUN_PACKAGES = ["llm_dispatch", "storage", "jobs", "tasks", "flows"]


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


PACKAGES = [*LAYERS, SIMULATOR]


@pytest.mark.parametrize("package", PACKAGES)
def test_a_package_uses_only_the_public_names_of_the_others(package: str) -> None:
    """The face is the contract: ``from storage import x`` with ``x`` in ``storage.__all__`` (or a
    module meant to be named, as a deployment's entrypoint is: ``flows.batch``), never ``storage._module``."""
    private_uses: list[str] = []
    for path in (ROOT / package).rglob("*.py"):
        if "migrations" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                top, _, rest = node.module.partition(".")
                if top not in PACKAGES or top == package:
                    continue
                if rest:
                    if any(part.startswith("_") for part in rest.split(".")):
                        private_uses.append(f"{where} from {node.module}")
                else:
                    public = set(importlib.import_module(top).__all__)
                    private_uses += [f"{where} {top}.{a.name}" for a in node.names if a.name not in public]
            elif isinstance(node, ast.Import):
                private_uses += [f"{where} import {a.name}" for a in node.names
                                 if a.name.partition(".")[0] in PACKAGES and a.name.partition(".")[0] != package
                                 and any(part.startswith("_") for part in a.name.split(".")[1:])]
    assert private_uses == []


def test_every_package_has_a_public_face() -> None:
    for package in PACKAGES:
        module = importlib.import_module(package)
        assert module.__doc__, f"{package} says what it is for"
        missing = [name for name in module.__all__ if not hasattr(module, name)]
        assert missing == [], f"{package}.__all__ names what it does not have"


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
