"""Prefect flows: orchestration only, one module per deployable flow."""

from __future__ import annotations

from .realtime import realtime_dispatch

__all__ = ["realtime_dispatch"]
