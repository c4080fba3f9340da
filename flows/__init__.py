"""Prefect flows: ``dispatch`` (the main one), ``realtime-dispatch``, ``wait-for-batch``,
``collect-batches`` and ``cancel-batches``. Thin: each builds settings and runs a recipe over ``tasks``."""

from __future__ import annotations

from .batch import cancel_job_batches, collect_batches, wait_for_batch
from .dispatch import dispatch, dispatch_directory
from .realtime import realtime_dispatch

__all__ = [
    "cancel_job_batches",
    "collect_batches",
    "dispatch",
    "dispatch_directory",
    "realtime_dispatch",
    "wait_for_batch",
]
