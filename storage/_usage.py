"""A job's paid usage and stored cost per route, model and price table (``usage_by_route``): read from its ledger
deltas (``storage._ledger``), a few rows whatever the job's size; summed from its results only where the deltas
were split at another long-prompt threshold than the one asked for."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Integer, and_, case, func, literal, or_, select, type_coerce
from sqlalchemy.orm import InstrumentedAttribute
from sqlalchemy.sql.elements import TypeCoerce

from llm_dispatch.core import PAID_RESULT_STATUSES, Route

from ._engine import Sessions
from ._ledger import ledger_sums
from ._models import Prompt, Result

__all__ = ["UsageRow", "usage_by_route"]


@dataclass(frozen=True, slots=True)
class UsageRow:
    """Paid usage of one job on one route and model, and its stored cost: answers (refusals included: they are
    billed) and failures whose 2xx reported usage, ``reused`` ones left out (they cost 0). One row per price
    table the answers were priced with."""

    route: Route
    model: str
    prompts: int
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    # Picodollars, over the answers whose cost is known; ``unpriced`` of them have none (NULL).
    cost_pico_usd: int = 0
    list_cost_pico_usd: int = 0
    unpriced: int = 0
    prices_as_of: str | None = None
    prices_file: str | None = None
    cost_basis: str | None = None
    # Prompt-cache writes, part of prompt_tokens; of them, those for the longer duration.
    cache_creation_tokens: int = 0
    cache_creation_extended_tokens: int = 0
    # Requests whose prompt was longer than their model's long-prompt threshold (``usage_by_route(long_above=)``).
    long_prompt: bool = False
    # The service tier the answers report (None: they did not say).
    service_tier: str | None = None
    # The endpoint the prompts went to (core.ENDPOINTS).
    endpoint: str = "chat"
    # The provider that served them (None: recorded before providers were kept; the built-in rule's).
    provider: str | None = None


async def usage_by_route(
    sessions: Sessions, *, job_id: str, long_above: Mapping[str, int] | None = None
) -> list[UsageRow]:
    """Tokens paid for and their stored cost per route, requested model (the price table knows the model
    as asked for), endpoint, provider, service tier and the prices they were priced with. ``long_above`` (model ->
    prompt tokens) splits a model's requests into those at most that long and those longer, which a price table prices
    apart.

    Read from the job's ledger deltas, which say the threshold each was split at: where a model is to be split and a
    delta of it was split at another threshold (or none: written without that price), the results are summed instead.
    """
    split = long_above or {}
    deltas = await ledger_sums(sessions, job_id=job_id)
    if any(split.get(model) not in (None, above) for model, _, _, above, *_ in deltas):
        return await usage_from_results(sessions, job_id=job_id, long_above=split)
    merged: dict[tuple[Any, ...], list[int]] = {}
    for model, endpoint, provider, _, is_long, route, tier, as_of, file, basis, *sums in deltas:
        # A model not to be split: its requests of either length together.
        key = (route, model, endpoint, provider, bool(is_long) and model in split, tier, as_of, file, basis)
        totals = merged.setdefault(key, [0] * len(sums))
        for index, value in enumerate(sums):
            totals[index] += value
    return sorted((UsageRow(route, model, n, p, c, k, cost, listed, unknown, as_of, file, basis,
                            cache_creation_tokens=w, cache_creation_extended_tokens=x, long_prompt=is_long,
                            service_tier=tier, endpoint=endpoint, provider=provider)
                   for (route, model, endpoint, provider, is_long, tier, as_of, file, basis),
                   (n, p, c, k, w, x, cost, listed, unknown) in merged.items()
                   if n and route != "reused"), key=_usage_order)


async def usage_from_results(sessions: Sessions, *, job_id: str, long_above: Mapping[str, int]) -> list[UsageRow]:
    """``usage_by_route`` summed from every paid result of the job, each joined to its prompt."""
    long = case(*((and_(Prompt.model == name, Result.prompt_tokens > above), True)
                  for name, above in long_above.items()), else_=False) if long_above else literal(False)
    stmt = (
        select(
            Result.route, Prompt.model, func.count(),
            _total(Result.prompt_tokens),
            _total(Result.completion_tokens),
            _total(Result.cached_tokens),
            _total(Result.cache_creation_tokens),
            _total(Result.cache_creation_extended_tokens),
            _total(Result.cost_pico_usd),
            _total(Result.list_cost_pico_usd),
            func.count() - func.count(Result.cost_pico_usd),
            long.label("long_prompt"),
            Result.service_tier, Prompt.endpoint, Prompt.provider,
            Result.prices_as_of, Result.prices_file, Result.cost_basis,
        )
        .join(Prompt, Prompt.id == Result.prompt_id)
        .where(Result.job_id == job_id, Result.route != "reused",
               # Answers, and failures that reported what they used (a 2xx with no usable answer).
               or_(Result.status.in_(PAID_RESULT_STATUSES), Result.prompt_tokens.is_not(None)))
        .group_by(Result.route, Result.service_tier, Result.prices_as_of, Result.prices_file, Result.cost_basis,
                  Prompt.model, Prompt.endpoint, Prompt.provider)
    )
    if long_above:
        stmt = stmt.group_by("long_prompt")
    async with sessions() as session:
        found = [UsageRow(route, model, int(n), int(p), int(c), int(k), int(cost), int(listed), int(unknown),
                          as_of, file, basis, cache_creation_tokens=int(w), cache_creation_extended_tokens=int(x),
                          long_prompt=bool(is_long), service_tier=tier, endpoint=endpoint, provider=provider)
                 for (route, model, n, p, c, k, w, x, cost, listed, unknown, is_long, tier, endpoint, provider, as_of,
                      file, basis) in await session.execute(stmt)
                 if route != "reused"]  # as the query has it: each row's route is a Route
    # Sorted here: the databases put NULL stamps at opposite ends.
    return sorted(found, key=_usage_order)


def _usage_order(u: UsageRow) -> tuple[Any, ...]:
    return (u.route, u.model, u.provider or "", u.endpoint, u.long_prompt, u.service_tier or "", u.prices_as_of or "",
            u.prices_file or "", u.cost_basis or "")


def _total(column: InstrumentedAttribute[int | None]) -> TypeCoerce[int]:
    """SUM(column), 0 where there is nothing to add: never NULL, as its type says."""
    return type_coerce(func.coalesce(func.sum(column), 0), Integer)


