"""A real-time run's cache plan (``core.caching``): the prefixes its open prompts share, read a page at a time, and
a plan per group for the run's concurrency; logged with what the plan should save."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Literal

from llm_dispatch import storage
from llm_dispatch.core import (
    CachePlan,
    ChatRequest,
    ExplicitCaches,
    GeminiCaches,
    LLMClient,
    PrefixGroups,
    PriceTable,
    from_pico,
    plan_caches,
)

from ._plan import Selection

__all__ = ["describe_outcome", "describe_plan", "explicit_caches", "make_batch_caches", "plan_run_caches"]

logger = logging.getLogger(__name__)

_PAGE = 5_000


async def plan_run_caches(
    *, sessions: storage.Sessions, job_id: str, selection: Selection, prices: PriceTable | None,
    provider_of: Callable[[str], str], concurrency: int, lane: Literal["realtime", "batch"] = "realtime",
) -> CachePlan:
    """The plan for the open prompts of ``job_id`` that ``selection`` takes (those stored so far, for a job still
    being recorded: a prefix first stored later is sent as written)."""
    found = PrefixGroups(provider_of=provider_of)
    async for rows in storage.unfinished_work_in_order(
            sessions, job_id=job_id, page=_PAGE, retry_failed=selection.retry_failed,
            planned_route=selection.planned_route, in_flight=selection.in_flight, shard=selection.shard):
        for row in rows:
            found.add(row.id, ChatRequest(model=row.model, messages=row.messages, params=row.params,
                                          endpoint=row.endpoint))
    return plan_caches(found.groups(), total_prompts=found.prompts, concurrency=concurrency, prices=prices, lane=lane)


def describe_plan(plan: CachePlan) -> list[str]:
    """A line per group (its key, prompts, prefix tokens, what the plan does), and the prefix's money with the plan
    and uncached; nothing for a plan without groups."""
    if not plan.groups:
        return []
    lines = [f"cache plan: {len(plan.groups)} shared prefix(es); prefix cost ${from_pico(plan.planned_cost):.4f} "
             f"planned vs ${from_pico(plan.uncached_cost):.4f} uncached"]
    for group in plan.groups[:20]:
        lines.append(f"  {group.group.key} {group.group.model}: {group.group.prompts:,} prompts, "
                     f"~{group.group.prefix_tokens:,} prefix tokens: {group.action} ({group.reason})")
    if len(plan.groups) > 20:
        lines.append(f"  ... and {len(plan.groups) - 20} more")
    return lines


def describe_outcome(plan: CachePlan) -> list[str]:
    """A line per group its run answered: answers, hit rate (cached over prefix tokens), cache writes, and the money
    saved against the same answers uncached (an explicit cache's create and storage counted as paid)."""
    lines = []
    for group in plan.groups:
        tally = plan.tallies.get(group.group.key)
        if tally is None or not tally.answers:
            continue
        kept = 0 if plan.explicit is None else plan.explicit.costs.get(group.group.key, 0)
        held = f" (${from_pico(kept):.4f} of it the explicit cache's create and storage)" if kept else ""
        lines.append(f"cache {group.group.key} {group.group.model}: {tally.answers:,} answers, hit rate "
                     f"{tally.hit_rate(group.group.prefix_tokens):.1%}, {tally.written_tokens:,} tokens written, "
                     f"${from_pico(tally.cost + kept):.4f} paid{held}, "
                     f"${from_pico(tally.uncached_cost - tally.cost - kept):.4f} saved")
    return lines


def explicit_caches(plan: CachePlan, *, sessions: storage.Sessions, job_id: str, prices: PriceTable | None,
                    client_of: Callable[[str], LLMClient], lease: storage.BudgetLease | None = None,
                    lane: Literal["realtime", "batch"] = "realtime") -> ExplicitCaches | None:
    """The run's explicit caches for the plan's ``explicit`` groups (set as ``plan.explicit``); None when it has
    none. ``client_of``: a model's client (``Clients.for_model``); ``lease``: the run's budget hold, which holds each
    cache's create and storage before it is made and spends what it cost. ``close`` it when the run's sending is
    done."""
    if not any(group.action == "explicit" for group in plan.groups):
        return None
    apis: dict[int, GeminiCaches] = {}

    def api_of(model: str) -> GeminiCaches:
        client = client_of(model)
        return apis.setdefault(id(client), GeminiCaches(client))

    plan.explicit = ExplicitCaches(job_id=job_id, api_of=api_of, prices=prices, budget=lease, lane=lane,
                                   ledger=storage.CachedContentLedger(sessions, lease=lease))
    return plan.explicit


async def make_batch_caches(plan: CachePlan, *, sessions: storage.Sessions, job_id: str, prices: PriceTable | None,
                            client_of: Callable[[str], LLMClient]) -> None:
    """Make (or reuse) the explicit cache of each ``explicit`` group of a Batch API lane plan, from its first prompt's
    request, before its lines are written: each line then names it (``CachePlan.prepare``). Kept for the TTL the
    plan priced (a batch's life), not deleted: a batch may read it until it ends."""
    caches = explicit_caches(plan, sessions=sessions, job_id=job_id, prices=prices, client_of=client_of, lane="batch")
    if caches is None:
        return
    for group in plan.groups:
        if group.action != "explicit" or group.ttl_s is None or not group.group.first_ids:
            continue
        [row] = await storage.load_work(sessions, prompt_ids=group.group.first_ids[:1])
        request = ChatRequest(model=row.model, messages=row.messages, params=row.params, endpoint=row.endpoint)
        await caches.reference(request, group=group.group, ttl_s=group.ttl_s)
