"""A package's public names loaded when first used: a command that reads a report never imports the HTTP stack,
and one that sends never imports what only reports need.

A package lists its names once, as the imports of an ``if TYPE_CHECKING:`` block in its ``__init__`` (what readers
and type checkers see), and hands its module's ``__getattr__`` and ``__dir__`` to ``lazy_names``; the first use of a
name (``from llm_dispatch.storage import open_database`` included) imports its own module only.

A public name that is also the name of one of the package's modules (``llm_dispatch.flows.dispatch``, the module,
and ``dispatch``, the flow it defines) stays the public name's: importing the module never binds the module over it.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(package: str) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``, whose ``__init__`` imports its names from its own modules in
    an ``if TYPE_CHECKING:`` block (``from ._module import name``, or ``from .part._module import name`` for a module in one of its parts; no star)."""
    module = sys.modules[package]
    where = _names_by_module(Path(module.__file__ or ""))

    def __getattr__(name: str) -> Any:
        found = where.get(name)
        if found is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        source, original = found
        # Through ``__import__``, the import statement's own path: ``python -X importtime`` reports what it loads
        # (it does not see ``importlib.import_module``).
        absolute = package + source
        __import__(absolute)
        value = getattr(sys.modules[absolute], original)
        setattr(module, name, value)  # the next use is a plain attribute
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(module), *where})

    if any(source == "." + name for name, (source, _) in where.items()):
        module.__class__ = _public_names_first(package, names=frozenset(where))
    return __getattr__, __dir__


def _public_names_first(package: str, *, names: frozenset[str]) -> type[ModuleType]:
    """A module class for ``package`` on which the import system's binding of a submodule to its name (done once the
    submodule is loaded) is skipped when that name is one of ``names``: ``__getattr__`` then resolves it."""

    class PublicNamesFirst(ModuleType):
        def __setattr__(self, name: str, value: Any) -> None:
            if name in names and isinstance(value, ModuleType) and value.__name__ == f"{package}.{name}":
                return
            super().__setattr__(name, value)

    return PublicNamesFirst


def _names_by_module(init: Path) -> dict[str, tuple[str, str]]:
    """``{name: (".module", its name there)}`` for every name imported in the ``if TYPE_CHECKING:`` block of ``init``."""
    names: dict[str, tuple[str, str]] = {}
    for node in ast.parse(init.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for statement in node.body:
                if not (isinstance(statement, ast.ImportFrom) and statement.level == 1 and statement.module):
                    raise TypeError(f"{init}: only `from .module import name` (or `from .part.module import name`) belongs in "
                                    "its TYPE_CHECKING block")
                for alias in statement.names:
                    names[alias.asname or alias.name] = ("." + statement.module, alias.name)
    return names
