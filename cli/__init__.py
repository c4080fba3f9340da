"""The llm-dispatch command line (the top layer: it may import flows, jobs, tasks, storage and the core)."""

from __future__ import annotations

from .main import app, main

__all__ = ["app", "main"]
