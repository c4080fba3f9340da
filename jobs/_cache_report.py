"""A job's prompt caching as its stored answers tell it, per group of prompts sharing a prefix: the group found
again from each prompt's stored request (``core.prefix_key``, as the plan found it), so any job's figures are there
after the fact, whatever run sent it and whether a plan did."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import ClassVar

from llm_dispatch import storage
from llm_dispatch.core import CacheTally, ChatRequest, PrefixGroups, PriceTable, Route, from_pico, json_field, prefix_key

__all__ = ["CacheGroupReport", "cache_report"]


# Keyword-only: ``hit_rate`` is made by ``json_field``, whose fields a type checker takes as defaulted.
@dataclass(frozen=True, slots=True, kw_only=True)
class CacheGroupReport:
    """One group's paid answers (those of the prompts' own requests): ``prefix_tokens`` is the estimate of the shared
    prefix, ``hit_rate`` the cached tokens over the prefix tokens the answers held (``CacheTally.hit_rate``),
    ``cost`` what the answers cost as stored and the group's explicit cache (``cache_cost``: its create and storage,
    Gemini's), ``uncached_cost`` the same answers with nothing cached or written; ``unpriced``: answers with no
    stored cost, left out of both."""

    json_properties: ClassVar = ("saved",)

    key: str
    model: str
    prompts: int
    answers: int
    prefix_tokens: int
    cached_tokens: int
    written_tokens: int
    hit_rate: float = json_field(digits=4)
    cost: Decimal
    uncached_cost: Decimal
    unpriced: int = 0
    cache_cost: Decimal = Decimal(0)

    @property
    def saved(self) -> Decimal:
        return self.uncached_cost - self.cost


async def cache_report(
    sessions: storage.Sessions, *, job_id: str, prices: PriceTable | None, provider_of: Callable[[str], str],
) -> list[CacheGroupReport]:
    """The job's groups (prompts sharing a prefix, more than one) with a paid answer, in order of their first
    prompt. Costs are the stored ones; the uncached cost adds what ``prices`` say caching took off each answer."""
    found = PrefixGroups(provider_of=provider_of)
    tallies: dict[str, CacheTally] = {}
    unpriced: dict[str, int] = {}
    last_prompt = None
    async for page in storage.cache_answer_pages(sessions, job_id=job_id):
        for answer in page:
            request = ChatRequest(model=answer.model, messages=answer.messages, params=answer.params,
                                  endpoint=answer.endpoint)
            key = prefix_key(request)
            if key is None:
                continue
            if answer.prompt_id != last_prompt:
                found.add(answer.prompt_id, request)
                last_prompt = answer.prompt_id
            if answer.cost_pico_usd is None:
                unpriced[key] = unpriced.get(key, 0) + 1
            route: Route = "realtime" if answer.route == "reused" else answer.route
            tallies.setdefault(key, CacheTally()).add(
                prices=None if answer.cost_pico_usd is None else prices, model=answer.model, route=route,
                prompt_tokens=answer.prompt_tokens, completion_tokens=answer.completion_tokens,
                cached_tokens=answer.cached_tokens, cache_creation_tokens=answer.cache_creation_tokens,
                cache_creation_extended_tokens=answer.cache_creation_extended_tokens,
                service_tier=answer.service_tier, paid=answer.cost_pico_usd)
    kept: dict[str, int] = {}
    for key, _, _, cost, _ in await storage.cache_storage_costs(sessions, job_id=job_id):
        group_key = key.partition(":")[0]  # a group's Batch API lane cache is recorded as KEY:batch
        kept[group_key] = kept.get(group_key, 0) + cost
    reports = []
    for group in found.groups():
        tally = tallies[group.key]
        cache_cost = kept.get(group.key, 0)
        reports.append(CacheGroupReport(
            key=group.key, model=group.model, prompts=group.prompts, answers=tally.answers,
            prefix_tokens=group.prefix_tokens, cached_tokens=tally.cached_tokens, written_tokens=tally.written_tokens,
            hit_rate=tally.hit_rate(group.prefix_tokens), cost=from_pico(tally.cost + cache_cost),
            uncached_cost=from_pico(tally.uncached_cost), unpriced=unpriced.get(group.key, 0),
            cache_cost=from_pico(cache_cost)))
    return reports
