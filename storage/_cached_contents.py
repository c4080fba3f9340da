"""A job's explicit caches (Gemini's cached contents), one row per prefix group: what ``core.ExplicitCaches``
records before and after each create, reads on resume, and what the job's cost adds of their create and storage."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from sqlalchemy import select

from ._budgets import BudgetLease
from ._engine import Sessions
from ._models import CachedContentRecord, aware

if TYPE_CHECKING:  # its module is the send path's explicit caches (the Gemini wire): a report sums costs only
    from llm_dispatch.core import CacheRecord

__all__ = ["CachedContentLedger", "cache_storage_costs"]


class CachedContentLedger:
    """``core.CacheLedger`` over the database: one transaction a step, so a kill between two leaves the row saying
    what is known (a create asked for, or a cache made and its name). With ``lease`` (the run's budget hold), what a
    cache's cost grows by is spent from the budget in the transaction that stores it; a cache deleted before its TTL
    stays counted at the TTL's storage there (its row has what it lived)."""

    def __init__(self, sessions: Sessions, *, provider: str = "gemini", lease: BudgetLease | None = None) -> None:
        self._sessions, self._provider, self._lease = sessions, provider, lease

    async def recorded(self, *, job_id: str, group_key: str) -> CacheRecord | None:
        async with self._sessions() as session:
            row = await session.get(CachedContentRecord, (job_id, group_key))
        if row is None:
            return None
        from llm_dispatch.core import CacheRecord

        return CacheRecord(group_key=row.group_key, display_name=row.display_name, name=row.name,
                           created_at=None if row.created_at is None else aware(row.created_at),
                           expire_at=None if row.expire_at is None else aware(row.expire_at), tokens=row.tokens,
                           deleted=row.deleted)

    async def creating(self, *, job_id: str, group_key: str, model: str, display_name: str, ttl_s: float) -> None:
        """Before a create: the row names the cache to look for should the answer be lost."""
        async with self._sessions.begin() as session:
            row = await session.get(CachedContentRecord, (job_id, group_key))
            if row is None:
                session.add(CachedContentRecord(job_id=job_id, group_key=group_key, provider=self._provider,
                                                model=model, display_name=display_name, ttl_s=ttl_s, tokens=0,
                                                deleted=False, carried_pico_usd=0))
            else:  # an earlier cache of the group, expired or deleted: what it cost stays the job's
                if row.name is not None and row.cost_pico_usd is not None:
                    row.carried_pico_usd = row.cost_pico_usd
                row.name, row.deleted, row.ttl_s, row.display_name = None, False, ttl_s, display_name

    async def created(self, *, job_id: str, group_key: str, name: str, tokens: int, created_at: datetime,
                      expire_at: datetime, cost: int | None) -> None:
        async with self._sessions.begin() as session:
            row = await session.get(CachedContentRecord, (job_id, group_key))
            if row is None:
                raise LookupError(f"no cache recorded for group {group_key} of job {job_id}")
            row.name, row.tokens, row.created_at, row.expire_at = name, tokens, created_at, expire_at
            before = row.cost_pico_usd or row.carried_pico_usd
            row.cost_pico_usd = None if cost is None else row.carried_pico_usd + cost
            grown = (row.cost_pico_usd or 0) - before
            moved = None
            if self._lease is not None and grown > 0:
                self._lease.buffered(grown)
                moved = await self._lease.settle(await session.connection(), cost=grown)
        if self._lease is not None and grown > 0:
            self._lease.settled(cost=grown, moved=moved)

    async def ended(self, *, job_id: str, group_key: str, expire_at: datetime, cost: int | None) -> None:
        async with self._sessions.begin() as session:
            row = await session.get(CachedContentRecord, (job_id, group_key))
            if row is not None:
                row.deleted, row.expire_at = True, expire_at
                row.cost_pico_usd = None if cost is None else row.carried_pico_usd + cost


async def cache_storage_costs(sessions: Sessions, *, job_id: str) -> list[tuple[str, str, str, int, int]]:
    """(group key, model, provider, the create and storage cost in picodollars, 1 for a cache with no price) of each
    of the job's explicit caches."""
    async with sessions() as session:
        found = await session.execute(
            select(CachedContentRecord.group_key, CachedContentRecord.model, CachedContentRecord.provider,
                   CachedContentRecord.cost_pico_usd, CachedContentRecord.name)
            .where(CachedContentRecord.job_id == job_id).order_by(CachedContentRecord.group_key))
    return [(key, model, provider, cost or 0, int(cost is None and name is not None))
            for key, model, provider, cost, name in found]
