"""Prefect tasks, one step each over ``jobs`` (``verb_noun``): what a flow run shows in the Prefect UI."""

from __future__ import annotations

from .batch import abandon_batch, cancel_batch, finish_submission, ingest_batch, record_batch_error, submit_batches
from .realtime import chunk_sender, send_chunk
from .record import record_prompts
from ._states import outcome_of, result_of, run_state

__all__ = [
    "abandon_batch",
    "cancel_batch",
    "chunk_sender",
    "finish_submission",
    "ingest_batch",
    "outcome_of",
    "record_batch_error",
    "record_prompts",
    "result_of",
    "run_state",
    "send_chunk",
    "submit_batches",
]
