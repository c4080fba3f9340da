"""Prefect tasks: each does one step over the core and storage (``verb_noun``).

``batch_submit`` and ``batch_collect`` hold the Batch API steps as plain async code (no Prefect);
``batch`` wraps them as tasks.
"""

from __future__ import annotations

from .batch import finish_submission, ingest, submit_batches
from .realtime import send_chunk
from .plan import RealtimePlan, chunk_size_for, plan_realtime
from .record import RecordedJob, record_prompts, record_rest, routing_rules

__all__ = [
    "RealtimePlan",
    "RecordedJob",
    "chunk_size_for",
    "finish_submission",
    "ingest",
    "plan_realtime",
    "record_prompts",
    "record_rest",
    "routing_rules",
    "send_chunk",
    "submit_batches",
]
