"""A package's public names loaded when first used: a command that reads a report never imports the HTTP stack,
and one that sends never imports what only reports need.

A package lists its names once, as the imports of an ``if TYPE_CHECKING:`` block in its ``__init__`` (what readers
and type checkers see), and hands its module's ``__getattr__`` and ``__dir__`` to ``lazy_names``; the first use of a
name (``from llm_dispatch.storage import open_database`` included) imports its own module only.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(package: str) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``, whose ``__init__`` imports its names from its own modules in
    an ``if TYPE_CHECKING:`` block (``from ._module import name``, one level, no star)."""
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

    return __getattr__, __dir__


def _names_by_module(init: Path) -> dict[str, tuple[str, str]]:
    """``{name: (".module", its name there)}`` for every name imported in the ``if TYPE_CHECKING:`` block of ``init``."""
    names: dict[str, tuple[str, str]] = {}
    for node in ast.parse(init.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for statement in node.body:
                if not (isinstance(statement, ast.ImportFrom) and statement.level == 1 and statement.module):
                    raise TypeError(f"{init}: only `from .module import name` belongs in its TYPE_CHECKING block")
                for alias in statement.names:
                    names[alias.asname or alias.name] = ("." + statement.module, alias.name)
    return names
