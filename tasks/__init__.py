"""Prefect tasks: each does one step over the core and storage (``verb_noun``)."""

from __future__ import annotations

from .realtime import send_chunk
from .record import RecordedJob, record_prompts
from .plan import RealtimePlan, plan_realtime

__all__ = ["RealtimePlan", "RecordedJob", "plan_realtime", "record_prompts", "send_chunk"]
