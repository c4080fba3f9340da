"""A run's explicit caches (Gemini's cached contents): each planned group's made once, before its first request
goes, then named by every request of the group; deleted when the run's sending is done.

Never paying twice, never paying long: the cache's record is stored before the create (its displayName,
``llm-dispatch:<job>:<group>``, finds a create whose answer was lost) and its name after; a run that finds a live
cache of its group reuses it (its TTL set again); a run killed outright leaves nothing paid beyond the TTL, which the
plan sets to the group's expected duration plus a margin. Storage is recorded as a cost of the job, for the TTL when
made and for what it lived once deleted.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from .._exceptions import APIError, BudgetExceededError
from .._types import ChatRequest
from ..pricing._costs import storage_cost
from ..pricing._pricing import PriceTable
from ..wire._gemini_caches import (
    CachedContent,
    cache_display_name,
    cached_content_body,
    can_reference,
    referencing_cache,
)
from ._prefixes import PrefixGroup

__all__ = ["CacheBudget", "CacheLedger", "CacheRecord", "CachedContents", "ExplicitCaches"]

logger = logging.getLogger(__name__)

# A recorded cache is reused only when it has at least this long left; its TTL is then set again.
_REUSE_MARGIN_S = 30.0


class CachedContents(Protocol):
    """A provider's explicit caches (``core.batches``' ``GeminiCaches``)."""

    async def create(self, body: dict[str, Any]) -> CachedContent: ...
    async def get(self, name: str) -> CachedContent | None: ...
    async def update(self, name: str, *, ttl_s: float) -> CachedContent | None: ...
    async def delete(self, name: str) -> None: ...
    async def find(self, display_name: str) -> CachedContent | None: ...


@dataclass(frozen=True, slots=True)
class CacheRecord:
    """A job's cache of one group as stored: ``name`` None while its create has no answer yet."""

    group_key: str
    display_name: str
    name: str | None
    created_at: datetime | None
    expire_at: datetime | None
    tokens: int
    deleted: bool


class CacheBudget(Protocol):
    """A run's budget hold, for a cost that is no request (``storage.BudgetLease``)."""

    async def reserve_amount(self, amount: int) -> int | None: ...
    def landed(self, amount: int) -> None: ...


class CacheLedger(Protocol):
    """Where a job's caches are recorded (``storage.CachedContentLedger``); ``cost`` in picodollars, None unpriced."""

    async def recorded(self, *, job_id: str, group_key: str) -> CacheRecord | None: ...
    async def creating(self, *, job_id: str, group_key: str, model: str, display_name: str, ttl_s: float) -> None: ...
    async def created(self, *, job_id: str, group_key: str, name: str, tokens: int, created_at: datetime,
                      expire_at: datetime, cost: int | None) -> None: ...
    async def ended(self, *, job_id: str, group_key: str, expire_at: datetime, cost: int | None) -> None: ...


class ExplicitCaches:
    """The explicit caches of one run: ``reference`` gives a planned group's request as it goes (its cache named,
    the cached part dropped), making the cache first if none is live; ``close`` deletes those made or reused."""

    def __init__(self, *, job_id: str, api_of: Any, ledger: CacheLedger, prices: PriceTable | None,
                 budget: CacheBudget | None = None, lane: str = "realtime",
                 shard: tuple[int, int] | None = None) -> None:
        # ``api_of(model)``: the CachedContents of the provider of ``model``; ``budget``: held for each create and
        # its storage for the TTL before it is made (the ledger settles what it cost).
        self.job_id, self._api_of, self._ledger, self._prices = job_id, api_of, ledger, prices
        self._budget = budget
        # A job's two halves run at once, each with its caches: a group's cache on the Batch API lane is recorded
        # (and named) apart, so the real-time half never shortens or deletes one that batch lines read; so is each
        # shard's (``shard``: index, of), as shards run at once and each deletes its own when it ends.
        self._suffix = (("" if lane == "realtime" else f":{lane}")
                        + ("" if shard is None else f":s{shard[0]}of{shard[1]}"))
        self._names: dict[str, str | None] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        # group -> (model, name, created, tokens, expires)
        self._live: dict[str, tuple[str, str, datetime, int, datetime]] = {}
        self.created = 0
        self.reused = 0
        # What each group's cache cost (create and storage) as last recorded, picodollars; none for no price.
        self.costs: dict[str, int] = {}

    def known(self, group_key: str) -> str | None:
        """The name of the cache made (or reused) for ``group_key``, None if none."""
        return self._names.get(group_key)

    async def reference(self, request: ChatRequest, *, group: PrefixGroup, ttl_s: float) -> ChatRequest | None:
        """``request`` naming its group's cache instead of holding the prefix; None when no cache could be had, or the
        request cannot name one (``can_reference``): it then goes as written, and implicit caching may still serve it."""
        if not can_reference(request, prefix_messages=group.prefix_messages):
            return None
        name = await self._name(request, group=group, ttl_s=ttl_s)
        if name is None:
            return None
        return referencing_cache(request, name=name, prefix_messages=group.prefix_messages)

    async def _name(self, request: ChatRequest, *, group: PrefixGroup, ttl_s: float) -> str | None:
        if group.key in self._names and not self._expiring(group.key, ttl_s=ttl_s):
            return self._names[group.key]
        lock = self._locks.setdefault(group.key, asyncio.Lock())
        async with lock:
            if group.key in self._names and self._expiring(group.key, ttl_s=ttl_s):
                try:
                    await self._extend(request, group=group, ttl_s=ttl_s)
                except Exception as exc:  # noqa: BLE001 - the group's later requests go as written
                    logger.warning("Job %s: explicit cache of group %s not kept longer (%s); its requests go as "
                                   "written", self.job_id, group.key, type(exc).__name__)
                    self._names[group.key] = None
            if group.key not in self._names:
                try:
                    self._names[group.key] = await self._open(request, group=group, ttl_s=ttl_s)
                except Exception as exc:  # noqa: BLE001 - any failure to have a cache leaves the group as written
                    # The group's requests go as written: a failed create costs its prefix's saving, not the run.
                    logger.warning("Job %s: no explicit cache for group %s (%s); its requests go as written",
                                   self.job_id, group.key, type(exc).__name__)
                    self._names[group.key] = None
            return self._names[group.key]

    async def _open(self, request: ChatRequest, *, group: PrefixGroup, ttl_s: float) -> str:
        held = await self._hold(request.model, tokens=group.prefix_tokens, ttl_s=ttl_s)
        try:
            return await self._reuse_or_make(request, group=group, ttl_s=ttl_s)
        finally:
            if self._budget is not None and held:
                self._budget.landed(held)  # after the ledger settled what the cache cost

    async def _reuse_or_make(self, request: ChatRequest, *, group: PrefixGroup, ttl_s: float) -> str:
        api: CachedContents = self._api_of(request.model)
        key = group.key + self._suffix
        display = cache_display_name(job_id=self.job_id, group_key=key)
        record = await self._ledger.recorded(job_id=self.job_id, group_key=key)
        found: CachedContent | None = None
        if record is not None and not record.deleted:
            if record.name is not None:
                found = await api.get(record.name)
            else:  # recorded before a create whose answer never came back: it may exist
                found = await api.find(display)
            now = datetime.now(UTC)
            if found is None or (found.expire_time is not None
                                 and found.expire_time <= now + timedelta(seconds=_REUSE_MARGIN_S)):
                found = None
            elif found.expire_time is None or found.expire_time < now + timedelta(seconds=ttl_s):
                found = await api.update(found.name, ttl_s=ttl_s)  # kept longer, never shortened
        if found is not None:
            self.reused += 1
            created_at = record.created_at if record is not None and record.created_at else datetime.now(UTC)
        else:
            await self._ledger.creating(job_id=self.job_id, group_key=key, model=request.model,
                                        display_name=display, ttl_s=ttl_s)
            prefix = ChatRequest(model=request.model, messages=request.messages[:group.prefix_messages],
                                 params=request.params, endpoint=request.endpoint)
            found = await api.create(cached_content_body(prefix, ttl_s=ttl_s, display_name=display))
            self.created += 1
            created_at = datetime.now(UTC)
        tokens = found.tokens or group.prefix_tokens
        expire_at = found.expire_time or datetime.now(UTC) + timedelta(seconds=ttl_s)
        cost = self._cost(request.model, tokens=tokens, since=created_at, until=expire_at)
        # Live before it is recorded: a cache made is deleted by ``close`` even if the record below fails.
        self._live[key] = (request.model, found.name, created_at, tokens, expire_at)
        await self._ledger.created(job_id=self.job_id, group_key=key, name=found.name, tokens=tokens,
                                   created_at=created_at, expire_at=expire_at, cost=cost)
        if cost is not None:
            self.costs[group.key] = cost
        return found.name

    def _expiring(self, group_key: str, *, ttl_s: float) -> bool:
        """Whether the live cache of ``group_key`` ends within a fifth of ``ttl_s`` (the group outlasted its plan)."""
        live = self._live.get(group_key + self._suffix)
        if live is None or self._names.get(group_key) is None:
            return False
        left = (live[4] - datetime.now(UTC)).total_seconds()
        return left < max(_REUSE_MARGIN_S, ttl_s / 5)

    async def _extend(self, request: ChatRequest, *, group: PrefixGroup, ttl_s: float) -> None:
        """Keep the live cache of ``group`` ``ttl_s`` longer from now, its storage held out of the budget first and
        its cost recorded to the new end."""
        key = group.key + self._suffix
        model, name, created_at, tokens, _ = self._live[key]
        held = await self._hold(model, tokens=tokens, ttl_s=ttl_s)
        try:
            found = await self._api_of(model).update(name, ttl_s=ttl_s)
            if found is None:
                raise LookupError("the cache is gone")
            expire_at = found.expire_time or datetime.now(UTC) + timedelta(seconds=ttl_s)
            self._live[key] = (model, name, created_at, tokens, expire_at)
            cost = self._cost(model, tokens=tokens, since=created_at, until=expire_at)
            await self._ledger.created(job_id=self.job_id, group_key=key, name=name, tokens=tokens,
                                       created_at=created_at, expire_at=expire_at, cost=cost)
            if cost is not None:
                self.costs[group.key] = cost
        finally:
            if self._budget is not None and held:
                self._budget.landed(held)

    async def _hold(self, model: str, *, tokens: int, ttl_s: float) -> int:
        """Hold the create and the storage for ``ttl_s`` (with a tenth more tokens than the estimate) out of the
        budget; raises ``BudgetExceededError`` when it does not fit (the group then goes as written)."""
        if self._budget is None:
            return 0
        now = datetime.now(UTC)
        amount = self._cost(model, tokens=tokens + tokens // 10, since=now, until=now + timedelta(seconds=ttl_s))
        if amount is None:
            return 0
        if await self._budget.reserve_amount(amount) is None:
            raise BudgetExceededError("the budget does not hold an explicit cache's create and storage")
        return amount

    def _cost(self, model: str, *, tokens: int, since: datetime, until: datetime) -> int | None:
        """The create (the prefix once at the input price) and storage from ``since`` to ``until``."""
        if self._prices is None:
            return None
        create = self._prices.price(model=model, route="realtime", prompt_tokens=tokens, completion_tokens=0)
        kept = storage_cost(self._prices, model=model, tokens=tokens, seconds=(until - since).total_seconds())
        return None if create is None or kept is None else create.cost + kept

    async def __aenter__(self) -> ExplicitCaches:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Delete every cache this run made or reused; its storage cost is then what it lived. One that cannot be
        deleted expires at its TTL, its recorded cost left at that."""
        for group_key, (model, name, created_at, tokens, _) in list(self._live.items()):
            try:
                await self._api_of(model).delete(name)
            except APIError as exc:
                logger.warning("Job %s: cache of group %s not deleted (%s); it expires at its TTL", self.job_id,
                               group_key, type(exc).__name__)
                continue
            now = datetime.now(UTC)
            cost = self._cost(model, tokens=tokens, since=created_at, until=now)
            await self._ledger.ended(job_id=self.job_id, group_key=group_key, expire_at=now, cost=cost)
            if cost is not None:
                self.costs[group_key.partition(":")[0]] = cost
            del self._live[group_key]
