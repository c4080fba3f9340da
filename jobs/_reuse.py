"""Answers from storage: a request already answered (in any job, real-time or by batch) is not paid for again."""

from __future__ import annotations

from collections.abc import Mapping, Sequence


from llm_dispatch import storage
from llm_dispatch.core import ResultSink

__all__ = ["reuse_stored_answers"]


async def reuse_stored_answers(
    *, sessions: storage.Sessions, sink: ResultSink, groups: Mapping[str, Sequence[int]]
) -> list[str]:
    """Give each group of identical prompts (prompt ids by request key) whose request has a stored success
    that answer, with route ``reused`` (no new cost); returns the keys answered, for the caller to leave out."""
    stored = await storage.find_reusable(sessions, dedupe_keys=list(groups))
    for key, result in stored.items():
        await sink.success(prompt_ids=groups[key], result=result, route="reused")
    return list(stored)
