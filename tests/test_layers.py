"""The layering holds: core <- storage <- jobs <- tasks <- flows <- cli; nothing lower imports anything higher.

Each layer is a subpackage of the one import root, ``llm_dispatch``, kept in a directory of its own name at the
repository's root. The simulator stands beside the core: it uses only the core's public names, and only the CLI
loads it.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
ROOT_PACKAGE = "llm_dispatch"
LAYERS = ["core", "storage", "jobs", "tasks", "flows", "cli"]
# The core stays free of Prefect so it is quick to import and reusable outside flows.
FORBIDDEN_EXTRA = {"core": {"prefect"}, "storage": {"prefect"}, "jobs": {"prefect"}}
SIMULATOR = "simulator"
# What a flow run imports; none of it may bring the simulator along.
FLOW_RUN_PACKAGES = ["core", "storage", "jobs", "tasks", "flows"]


def imported_top_levels(path: Path) -> set[str]:
    """The layers a module imports (``llm_dispatch.storage`` counts as ``storage``) and the other top-level
    packages it imports (``prefect``)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(layer_of(alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == ROOT_PACKAGE:
                names.update(alias.name for alias in node.names)
            else:
                names.add(layer_of(node.module))
    return names


def layer_of(module: str) -> str:
    top, _, rest = module.partition(".")
    return rest.split(".")[0] if top == ROOT_PACKAGE and rest else top


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
    """The face is the contract: ``from llm_dispatch.storage import x`` with ``x`` in ``storage.__all__`` (or a
    module meant to be named, as a deployment's entrypoint is: ``llm_dispatch.flows.batch``), never
    ``llm_dispatch.storage._module``."""
    private_uses: list[str] = []
    for path in (ROOT / package).rglob("*.py"):
        if "migrations" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                root, _, inside = node.module.partition(".")
                if root != ROOT_PACKAGE or not inside:
                    continue
                top, _, rest = inside.partition(".")
                if top not in PACKAGES or top == package:
                    continue
                if rest:
                    if any(part.startswith("_") for part in rest.split(".")):
                        private_uses.append(f"{where} from {node.module}")
                else:
                    public = set(importlib.import_module(f"{ROOT_PACKAGE}.{top}").__all__)
                    private_uses += [f"{where} {top}.{a.name}" for a in node.names if a.name not in public]
            elif isinstance(node, ast.Import):
                private_uses += [f"{where} import {a.name}" for a in node.names
                                 if layer_of(a.name) in PACKAGES and layer_of(a.name) != package
                                 and any(part.startswith("_") for part in a.name.split("."))]
    assert private_uses == []


def test_every_package_has_a_public_face() -> None:
    for package in [ROOT_PACKAGE, *(f"{ROOT_PACKAGE}.{name}" for name in PACKAGES)]:
        module = importlib.import_module(package)
        assert module.__doc__, f"{package} says what it is for"
        missing = [name for name in module.__all__ if not hasattr(module, name)]
        assert missing == [], f"{package}.__all__ names what it does not have"


def test_a_flow_run_never_loads_the_simulator() -> None:
    # A fresh interpreter: this test process has long since imported the simulator for other tests.
    script = (
        "import importlib, pkgutil, sys\n"
        f"for name in {[f'{ROOT_PACKAGE}.{name}' for name in FLOW_RUN_PACKAGES]!r}:\n"
        "    package = importlib.import_module(name)\n"
        "    for module in pkgutil.walk_packages(package.__path__, prefix=name + '.'):\n"
        "        if '.migrations' not in module.name:\n"
        "            importlib.import_module(module.name)\n"
        f"print(sorted(m for m in sys.modules if m.startswith({f'{ROOT_PACKAGE}.{SIMULATOR}'!r})))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def module_imports(path: Path, *, package: str) -> set[str]:
    """The modules of ``llm_dispatch`` that ``path`` (in package ``package``) imports, at its load or in a function
    when that runs: every relative and absolute import but those under ``if TYPE_CHECKING:``."""
    found: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.If):
                if not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
                    visit(node.body)
                    visit(node.orelse)
            elif isinstance(node, (ast.Try, ast.With, ast.AsyncWith, ast.For, ast.AsyncFor, ast.While,
                                   ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(node.body)
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)
                visit(getattr(node, "orelse", []))
                visit(getattr(node, "finalbody", []))
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names if alias.name.startswith(ROOT_PACKAGE + "."))
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    module = ".".join([*base, *(node.module.split(".") if node.module else [])])
                else:
                    module = node.module or ""
                if module.startswith(ROOT_PACKAGE):
                    found.add(module)
                    found.update(f"{module}.{alias.name}" for alias in node.names)

    visit(ast.parse(path.read_text(encoding="utf-8")).body)
    return found


def product_modules() -> dict[str, Path]:
    """Every product module by its import name (``llm_dispatch.core.wire._wire``), packages by their ``__init__``."""
    modules: dict[str, Path] = {}
    for top in PACKAGES:
        for path in (ROOT / top).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join([ROOT_PACKAGE, *parts])
            modules[name.removesuffix(".__init__")] = path
    return modules


def test_no_module_imports_itself_in_a_circle() -> None:
    """No module needs itself, even late: the import graph of modules (every import but those for type checkers;
    an import through a package's face is the layer tests' concern) has no cycle."""
    modules = product_modules()
    graph = {
        name: {target for target in module_imports(path, package=name if path.name == "__init__.py"
                                                    else name.rpartition(".")[0])
               if target in modules and target != name and modules[target].name != "__init__.py"}
        for name, path in modules.items()
    }
    cycles: list[list[str]] = []
    state: dict[str, int] = {}

    def walk(node: str, trail: list[str]) -> None:
        state[node] = 1
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                cycles.append(trail[trail.index(target):] + [target])
            elif target not in state:
                walk(target, [*trail, target])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            walk(name, [name])
    assert cycles == []


# core's parts, lowest first: a module in one imports only its own part's modules, the lower parts' and the
# vocabulary at core's top (statuses, errors, settings), never a higher part's.
CORE_PARTS = ["rules", "pricing", "wire", "caching", "http", "batches", "sending", "inputs"]


def test_cores_parts_import_only_lower_parts() -> None:
    modules = product_modules()
    core = f"{ROOT_PACKAGE}.core"

    def part(module: str) -> str | None:
        rest = module.removeprefix(core + ".").split(".")
        return rest[0] if module.startswith(core + ".") and rest[0] in CORE_PARTS else None

    offenders: dict[str, list[str]] = {}
    for name, path in modules.items():
        if not name.startswith(core + ".") or path.name == "__init__.py":
            continue
        own = part(name)
        rank = CORE_PARTS.index(own) if own else -1
        higher = sorted(target for target in module_imports(path, package=name.rpartition(".")[0])
                        if (theirs := part(target)) is not None and CORE_PARTS.index(theirs) > rank)
        if higher:
            offenders[name] = higher
    assert offenders == {}


@pytest.mark.parametrize("package", PACKAGES)
def test_a_packages_face_names_each_public_name_where_type_checkers_and_its_module_see_it(package: str) -> None:
    """A public name is written up to three times, each read by someone: the face's ``TYPE_CHECKING`` import (what
    loads it, ``core/_lazy.py``), the face's ``__all__`` (a literal: mypy and pyright take re-exports from it, not
    from a list built at run time) and its module's ``__all__`` where the module keeps one. They cannot drift apart."""
    from llm_dispatch.core._lazy import _names_by_module

    face = importlib.import_module(f"{ROOT_PACKAGE}.{package}")
    imported = _names_by_module(Path(face.__file__ or ""))
    assert sorted(set(imported) - set(face.__all__)) == []
    for source, original in imported.values():
        module = importlib.import_module(f"{face.__name__}{source}")
        if hasattr(module, "__all__"):
            assert original in module.__all__, f"{module.__name__}.__all__ lacks {original}"
