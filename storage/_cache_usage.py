"""A job's paid answers with the request each answered, a keyset page at a time: what a report of the job's prompt
caching (``jobs.cache_report``) reads, the prefix group of each found from its stored request."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy import or_, select, tuple_

from llm_dispatch.core import PAID_RESULT_STATUSES, ResultRoute

from ._engine import Sessions
from ._models import Prompt, Result

__all__ = ["CacheAnswer", "cache_answer_pages"]


@dataclass(frozen=True, slots=True)
class CacheAnswer:
    """One paid answer (``usage_by_route``'s: answers and failures that reported usage, none reused) of the
    prompt's own request (no re-ask: those hold more than the prompt's request), its usage and stored cost
    (None: no price then), beside the prompt's stored request."""

    prompt_id: int
    model: str
    endpoint: str
    messages: list[dict[str, Any]]
    params: dict[str, Any]
    route: ResultRoute
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    cache_creation_tokens: int
    cache_creation_extended_tokens: int
    service_tier: str | None
    cost_pico_usd: int | None


async def cache_answer_pages(sessions: Sessions, *, job_id: str, page: int = 2000) -> AsyncIterator[list[CacheAnswer]]:
    """The job's paid answers in order of prompt (a prompt's answers one after another), ``page`` at a time."""
    order = (Result.prompt_id, Result.id)
    base = (select(Result.id, Result.prompt_id, Prompt.model, Prompt.endpoint, Prompt.messages, Prompt.params,
                   Result.route, Result.prompt_tokens, Result.completion_tokens, Result.cached_tokens,
                   Result.cache_creation_tokens, Result.cache_creation_extended_tokens, Result.service_tier,
                   Result.cost_pico_usd)
            .join(Prompt, Prompt.id == Result.prompt_id)
            .where(Result.job_id == job_id, Result.route != "reused", Result.reask == 0,
                   or_(Result.status.in_(PAID_RESULT_STATUSES), Result.prompt_tokens.is_not(None)))
            .order_by(*order))
    after: tuple[int, int] | None = None
    while True:
        stmt = base if after is None else base.where(tuple_(*order) > tuple_(*after))
        async with sessions() as session:
            found = (await session.execute(stmt.limit(page))).all()
        if not found:
            return
        yield [CacheAnswer(prompt_id=row.prompt_id, model=row.model, endpoint=row.endpoint, messages=row.messages,
                           params=row.params, route=row.route, prompt_tokens=row.prompt_tokens or 0,
                           completion_tokens=row.completion_tokens or 0, cached_tokens=row.cached_tokens or 0,
                           cache_creation_tokens=row.cache_creation_tokens or 0,
                           cache_creation_extended_tokens=row.cache_creation_extended_tokens or 0,
                           service_tier=row.service_tier, cost_pico_usd=row.cost_pico_usd) for row in found]
        if len(found) < page:
            return
        after = (found[-1].prompt_id, found[-1].id)
