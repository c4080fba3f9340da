"""The llm-dispatch command line, and its runs from Python (``run_prompts``): the top layer, it may import flows,
jobs, tasks, storage and the core. Each name is loaded when first used: the command (``main``) loads no
``run_prompts``, and a report loads nothing of a run."""

from __future__ import annotations

from typing import TYPE_CHECKING

from llm_dispatch.core import lazy_names

if TYPE_CHECKING:
    from ._python import Row, Rows, arun_prompts, run_prompts
    from .main import app, main

__all__ = ["Row", "Rows", "app", "arun_prompts", "main", "run_prompts"]

__getattr__, __dir__ = lazy_names(__name__)
