"""The exception tree drawn in ``core/_exceptions.py`` is the tree there is: every error class of every layer in it,
each under its real parent, and nothing drawn that does not exist."""

from __future__ import annotations

import importlib
import re

from llm_dispatch.core import LLMDispatchError, _exceptions

LAYERS = ["core", "storage", "jobs", "tasks", "flows", "cli", "simulator"]
_NODE = re.compile(r"^(?P<indent>[ │]*)(?:[├└]── )?(?P<name>[A-Z]\w+)\b")


def drawn_tree() -> dict[str, str | None]:
    """Each class the docstring draws, with the class drawn as its parent."""
    lines = [line[4:] for line in (_exceptions.__doc__ or "").splitlines() if line.startswith("    ")]
    parents: dict[str, str | None] = {}
    stack: list[str] = []
    for line in lines:
        match = _NODE.match(line)
        assert match, f"not a line of the tree: {line!r}"
        depth = len(match["indent"]) // 4 + (1 if line[len(match["indent"]):].startswith(("├", "└")) else 0)
        del stack[depth:]
        parents[match["name"]] = stack[-1] if stack else None
        stack.append(match["name"])
    return parents


def every_error_class() -> dict[str, type[BaseException]]:
    for layer in LAYERS:
        importlib.import_module(f"llm_dispatch.{layer}")
    found: dict[str, type[BaseException]] = {}
    queue: list[type[BaseException]] = [LLMDispatchError]
    while queue:
        cls = queue.pop()
        if cls.__module__.startswith("llm_dispatch."):
            found[cls.__name__] = cls
        queue.extend(cls.__subclasses__())
    return found


def test_the_drawing_names_every_error_class_under_its_parent() -> None:
    drawn = drawn_tree()
    classes = every_error_class()
    assert sorted(drawn) == sorted(classes)
    for name, parent in drawn.items():
        bases = [base.__name__ for base in classes[name].__bases__ if issubclass(base, LLMDispatchError)]
        assert bases == ([parent] if parent else []), name


def test_every_error_class_is_defined_with_the_drawing() -> None:
    assert {cls.__module__ for cls in every_error_class().values()} == {"llm_dispatch.core._exceptions"}
