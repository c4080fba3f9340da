"""A job's cache plan (``core.caching``): the prefixes its prompts share, found as the job is recorded (or its open
prompts estimated), each group's plan priced for the estimate and stored with the job (``JobPrefixes``,
``CacheEstimate``); and a run's plan over its open prompts, read a page at a time, logged with what it should save."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import TYPE_CHECKING, ClassVar, Literal

from llm_dispatch import storage
from llm_dispatch.core import (
    CachePlan,
    ChatRequest,
    ExplicitCaches,
    GroupPlan,
    PrefixGroups,
    PriceTable,
    Route,
    from_pico,
    plan_caches,
)

if TYPE_CHECKING:  # the send path: read-only commands (status) import this module and never send
    from llm_dispatch.core import GeminiCaches, LLMClient

    from ._plan import Selection

__all__ = ["CacheEstimate", "CachePlanning", "JobPrefixes", "describe_cache_estimate", "describe_outcome", "describe_plan",
           "explicit_caches", "make_batch_caches", "plan_run_caches"]

# Groups an estimate names one by one; the rest are counted ("and N more").
SHOWN_GROUPS = 20

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


class JobPrefixes:
    """The prefix groups of a job's prompts, found one prompt at a time as they are read once for the estimate (the
    check pass, the recording, or the open prompts read back): a ``PrefixGroups`` per half, since the Batch API's
    plan is not the real-time one. Only what each group needs is held (``PrefixGroups``), never the prompts."""

    def __init__(self, *, provider_of: Callable[[str], str]) -> None:
        self._halves = {lane: PrefixGroups(provider_of=provider_of, keep_ids=1) for lane in ("realtime", "batch")}

    def add(self, position: int, request: ChatRequest, *, route: Route | None) -> None:
        self._halves["batch" if route == "batch" else "realtime"].add(position, request)

    def plans(self, *, prices: PriceTable | None, concurrency: int, enabled: bool) -> list[storage.CacheGroupRow]:
        """Each group's plan as a real-time run or the Batch API's files would make it (``core.plan_caches``), as rows
        to store and show; ``enabled`` False (``--no-cache-plan``): every group plans nothing and prices its prefix
        uncached."""
        rows = []
        for lane, found in self._halves.items():
            groups = found.groups()
            if not groups:
                continue
            plan = plan_caches(groups, total_prompts=found.prompts, concurrency=concurrency, prices=prices,
                               lane="batch" if lane == "batch" else "realtime")
            for group_plan in plan.groups:
                if not enabled:
                    group_plan = replace(group_plan, action="none", reason="the cache plan is off (--no-cache-plan)",
                                         keys=0, ttl=None, warm_up=False, planned_cost=group_plan.uncached_cost)
                rows.append(_row(lane, group_plan))
        # The largest first: what an estimate names one by one.
        rows.sort(key=lambda row: (-row.prefix_tokens * row.prompts, row.lane, row.key))
        return rows


def _row(lane: str, plan: GroupPlan) -> storage.CacheGroupRow:
    """``plan`` as stored and shown with the estimate: priced at its worst case (a keys plan spread over its keys,
    where the provider overflows), so that ``--max-cost`` never passes on a saving the provider may not give."""
    group = plan.group
    return storage.CacheGroupRow(
        lane=lane, key=group.key, provider=group.provider, model=group.model, endpoint=group.endpoint,
        prompts=group.prompts, prefix_tokens=group.prefix_tokens, prefix_messages=group.prefix_messages,
        own_breakpoints=group.own_breakpoints, action=plan.action, reason=plan.reason, keys=plan.keys, ttl=plan.ttl,
        planned_cost_pico_usd=plan.planned_cost if plan.worst_cost is None else plan.worst_cost,
        uncached_cost_pico_usd=plan.uncached_cost)


@dataclass(frozen=True, slots=True)
class CacheEstimate:
    """The cache plan an estimate prices: the largest groups (``groups``, at most ``SHOWN_GROUPS``), how many there
    are in all (``total``), and the shared prefixes' money over all of them with the plan and uncached (a model
    without a price left out of both). ``enabled``: the plan is on; off, ``planned_cost`` is ``uncached_cost``."""

    json_properties: ClassVar = ("saved",)

    groups: list[storage.CacheGroupRow] = field(default_factory=list)
    total: int = 0
    enabled: bool = True
    planned_cost: Decimal = Decimal(0)
    uncached_cost: Decimal = Decimal(0)
    # Groups of a model without a price: their prefix's money is unknown.
    unpriced: int = 0

    @property
    def saved(self) -> Decimal:
        return self.uncached_cost - self.planned_cost

    @classmethod
    def of(cls, rows: list[storage.CacheGroupRow], *, enabled: bool) -> CacheEstimate:
        priced = [row for row in rows if row.planned_cost_pico_usd is not None
                  and row.uncached_cost_pico_usd is not None]
        return cls(groups=rows[:SHOWN_GROUPS], total=len(rows), enabled=enabled,
                   planned_cost=from_pico(sum(row.planned_cost_pico_usd or 0 for row in priced)),
                   uncached_cost=from_pico(sum(row.uncached_cost_pico_usd or 0 for row in priced)),
                   unpriced=len(rows) - len(priced))

    @classmethod
    def stored(cls, found: storage.StoredCacheGroups, *, enabled: bool) -> CacheEstimate:
        """A job's groups as its recording stored them (``storage.job_cache_groups``)."""
        return cls(groups=found.groups, total=found.total, enabled=enabled,
                   planned_cost=from_pico(found.planned_cost_pico_usd),
                   uncached_cost=from_pico(found.uncached_cost_pico_usd))


@dataclass(frozen=True, slots=True)
class CachePlanning:
    """How an estimate plans the prompts' caches: each model's provider (``ProviderTable.cache_rules_of``), the run's
    concurrency, whether the plan is on (``Settings.cache_plan``), and the groups the recording found (a new job's
    ``RecordedJob.cache``), else found as its open prompts are read back."""

    provider_of: Callable[[str], str]
    concurrency: int
    enabled: bool = True
    recorded: CacheEstimate | None = None

    def collector(self) -> JobPrefixes:
        return JobPrefixes(provider_of=self.provider_of)

    def estimate(self, found: JobPrefixes, *, prices: PriceTable | None) -> CacheEstimate:
        rows = found.plans(prices=prices, concurrency=self.concurrency, enabled=self.enabled)
        return CacheEstimate.of(rows, enabled=self.enabled)


def describe_cache_estimate(cache: CacheEstimate) -> list[str]:
    """What the estimate says of the shared prefixes: a line of totals, then a line per group (its half, key, model,
    prompts, prefix tokens, plan, and its prefix's cost planned vs uncached), the largest ``SHOWN_GROUPS`` of them,
    then how many more; nothing when no prompts share a prefix."""
    if not cache.total:
        return []
    plan = "planned" if cache.enabled else "with the cache plan off"
    lines = [f"cache plan: {cache.total:,} shared prefix(es); prefix cost ${cache.planned_cost:.4f} {plan} vs "
             f"${cache.uncached_cost:.4f} uncached"]
    for row in cache.groups:
        money = ("no price" if row.planned_cost_pico_usd is None or row.uncached_cost_pico_usd is None else
                 f"${from_pico(row.planned_cost_pico_usd):.4f} vs ${from_pico(row.uncached_cost_pico_usd):.4f}")
        lines.append(f"  {row.lane} {row.key} {row.model}: {row.prompts:,} prompts, ~{row.prefix_tokens:,} prefix "
                     f"tokens: {row.action} ({row.reason}); {money}")
    if cache.total > len(cache.groups):
        lines.append(f"  and {cache.total - len(cache.groups):,} more")
    return lines


def describe_plan(plan: CachePlan) -> list[str]:
    """A line per group (its key, prompts, prefix tokens, what the plan does), and the prefix's money with the plan
    and uncached; nothing for a plan without groups."""
    if not plan.groups:
        return []
    worst = sum(group.worst_cost or group.planned_cost or 0 for group in plan.groups)
    overflow = (f" (up to ${from_pico(worst):.4f} where the provider overflows)" if worst > plan.planned_cost
                else "")
    lines = [f"cache plan: {len(plan.groups)} shared prefix(es); prefix cost ${from_pico(plan.planned_cost):.4f} "
             f"planned{overflow} vs ${from_pico(plan.uncached_cost):.4f} uncached"]
    for group in plan.groups[:20]:
        lines.append(f"  {group.group.key} {group.group.model}: {group.group.prompts:,} prompts, "
                     f"~{group.group.prefix_tokens:,} prefix tokens: {group.action} ({group.reason})")
    if len(plan.groups) > 20:
        lines.append(f"  ... and {len(plan.groups) - 20} more")
    return lines


def describe_outcome(plan: CachePlan) -> list[str]:
    """A line per group its run answered: answers, hit rate (cached over prefix tokens), cache writes, the keys a
    keys plan spread over, and the money saved against the same answers uncached (an explicit cache's create and
    storage counted as paid)."""
    lines = []
    for group in plan.groups:
        tally = plan.tallies.get(group.group.key)
        if tally is None or not tally.answers:
            continue
        keys = plan.keys_used(group.group.key)
        spread = "" if keys is None else f", {keys:,} prompt_cache_key(s)"
        kept = 0 if plan.explicit is None else plan.explicit.costs.get(group.group.key, 0)
        held = f" (${from_pico(kept):.4f} of it the explicit cache's create and storage)" if kept else ""
        lines.append(f"cache {group.group.key} {group.group.model}: {tally.answers:,} answers, hit rate "
                     f"{tally.hit_rate(group.group.prefix_tokens):.1%}, {tally.written_tokens:,} tokens written"
                     f"{spread}, ${from_pico(tally.cost + kept):.4f} paid{held}, "
                     f"${from_pico(tally.uncached_cost - tally.cost - kept):.4f} saved")
    return lines


def explicit_caches(plan: CachePlan, *, sessions: storage.Sessions, job_id: str, prices: PriceTable | None,
                    client_of: Callable[[str], LLMClient], lease: storage.BudgetLease | None = None,
                    lane: Literal["realtime", "batch"] = "realtime",
                    shard: tuple[int, int] | None = None) -> ExplicitCaches | None:
    """The run's explicit caches for the plan's ``explicit`` groups (set as ``plan.explicit``); None when it has
    none. ``client_of``: a model's client (``Clients.for_model``); ``lease``: the run's budget hold, which holds each
    cache's create and storage before it is made and spends what it cost; ``shard``: the run's (index, of), whose
    caches are its own. ``close`` it when the run's sending is done."""
    if not any(group.action == "explicit" for group in plan.groups):
        return None
    from llm_dispatch.core import GeminiCaches

    apis: dict[int, GeminiCaches] = {}

    def api_of(model: str) -> GeminiCaches:
        client = client_of(model)
        return apis.setdefault(id(client), GeminiCaches(client))

    plan.explicit = ExplicitCaches(job_id=job_id, api_of=api_of, prices=prices, budget=lease, lane=lane, shard=shard,
                                   ledger=storage.CachedContentLedger(sessions, lease=lease))
    return plan.explicit


async def make_batch_caches(plan: CachePlan, *, sessions: storage.Sessions, job_id: str, prices: PriceTable | None,
                            client_of: Callable[[str], LLMClient], lease: storage.BudgetLease | None = None) -> None:
    """Make (or reuse) the explicit cache of each ``explicit`` group of a Batch API lane plan, from its first prompt's
    request, before its lines are written: each line then names it (``CachePlan.prepare``). Kept for the TTL the
    plan priced (a batch's life), not deleted: a batch may read it until it ends. ``lease``: the submission's budget
    hold, which holds each cache's create and storage before it is made (a group it cannot hold goes as written)."""
    caches = explicit_caches(plan, sessions=sessions, job_id=job_id, prices=prices, client_of=client_of, lane="batch",
                             lease=lease)
    if caches is None:
        return
    for group in plan.groups:
        if group.action != "explicit" or group.ttl_s is None or not group.group.first_ids:
            continue
        [row] = await storage.load_work(sessions, prompt_ids=group.group.first_ids[:1])
        request = ChatRequest(model=row.model, messages=row.messages, params=row.params, endpoint=row.endpoint)
        await caches.reference(request, group=group.group, ttl_s=group.ttl_s)
