"""The llm-dispatch command line, and its runs from Python (``run_prompts``): the top layer, it may import flows,
jobs, tasks, storage and the core."""

from __future__ import annotations

from ._python import Row, Rows, arun_prompts, run_prompts
from .main import app, main

__all__ = ["Row", "Rows", "app", "arun_prompts", "main", "run_prompts"]
