"""Prefect flows: ``dispatch`` (the main one), ``realtime-dispatch``, ``collect-batches`` and ``cancel-batches``
(and ``wait-for-batches``, the sub-flow a waiting ``dispatch`` follows its batches in). Thin: each builds settings
and runs a recipe over ``tasks``.

Each name is imported when first used (``core.lazy_names``): Prefect builds a flow's parameter schema as its module is
imported, so a command builds only the flows of the modules it uses (a run of ``dispatch``: the two in
``flows/dispatch.py``; its halves, ``_realtime_half`` and ``_batch_half``, define none)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from llm_dispatch.core import lazy_names

if TYPE_CHECKING:
    from .batch import cancel_job_batches, collect_batches
    from .dispatch import dispatch, dispatch_directory
    from .realtime import realtime_dispatch

__all__ = [
    "cancel_job_batches",
    "collect_batches",
    "dispatch",
    "dispatch_directory",
    "realtime_dispatch",
]

__getattr__, __dir__ = lazy_names(__name__)
