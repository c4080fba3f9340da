"""A job's prefix groups as its recording found them, each with the cache plan chosen then: written once, when the
job is recorded (``store_cache_groups``), and read back a few at a time (``job_cache_groups``) by ``status``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from sqlalchemy import BigInteger, cast, delete, func, insert, select

from ._engine import Sessions
from ._models import CacheGroup

__all__ = ["CacheGroupRow", "StoredCacheGroups", "job_cache_groups", "store_cache_groups"]

# Rows inserted per statement: a job may hold many small groups.
_INSERT_ROWS = 1_000


@dataclass(frozen=True, slots=True)
class CacheGroupRow:
    """One group of prompts sharing a cached prefix on one half of a job (``lane``: realtime or batch), and its
    plan: ``action`` (``keys``, ``breakpoint``, ``implicit``, ``as-given``, ``none``) with ``reason``, ``keys`` and
    ``ttl``; the prefix's money with the plan and uncached, in picodollars (None: the model has no price)."""

    lane: str
    key: str
    provider: str
    model: str
    endpoint: str
    prompts: int
    prefix_tokens: int
    prefix_messages: int
    own_breakpoints: bool
    action: str
    reason: str
    keys: int
    ttl: str | None
    planned_cost_pico_usd: int | None
    uncached_cost_pico_usd: int | None


@dataclass(frozen=True, slots=True)
class StoredCacheGroups:
    """The largest of a job's stored groups (``groups``, most prefix tokens first), how many it has in all, and the
    prefix's money of all of them, planned and uncached (picodollars; unpriced groups left out)."""

    groups: list[CacheGroupRow]
    total: int
    planned_cost_pico_usd: int
    uncached_cost_pico_usd: int


async def store_cache_groups(sessions: Sessions, *, job_id: str, groups: Sequence[CacheGroupRow]) -> None:
    """Keep ``groups`` as the job's (replacing any it had: a recording cut off and done again finds them again)."""
    async with sessions.begin() as session:
        await session.execute(delete(CacheGroup).where(CacheGroup.job_id == job_id))
        for start in range(0, len(groups), _INSERT_ROWS):
            await session.execute(insert(CacheGroup), [{"job_id": job_id, **asdict(group)}
                                                       for group in groups[start:start + _INSERT_ROWS]])


async def job_cache_groups(sessions: Sessions, *, job_id: str, limit: int = 20) -> StoredCacheGroups:
    """The job's ``limit`` largest groups (prefix tokens times prompts) and the sums over all of them: two queries
    on the job's rows, whatever its prompt count."""
    # BIGINT: a million prompts of a 3,000-token prefix is past PostgreSQL's INTEGER.
    size = cast(CacheGroup.prefix_tokens, BigInteger) * CacheGroup.prompts
    columns = [getattr(CacheGroup, name) for name in CacheGroupRow.__dataclass_fields__]
    async with sessions() as session:
        rows = (await session.execute(select(*columns).where(CacheGroup.job_id == job_id)
                                      .order_by(size.desc(), CacheGroup.lane, CacheGroup.key).limit(limit))).all()
        total, planned, uncached = (await session.execute(select(
            func.count(), func.coalesce(func.sum(CacheGroup.planned_cost_pico_usd), 0),
            func.coalesce(func.sum(CacheGroup.uncached_cost_pico_usd), 0)).where(CacheGroup.job_id == job_id))).one()
    return StoredCacheGroups(groups=[CacheGroupRow(*row) for row in rows], total=total,
                             planned_cost_pico_usd=int(planned or 0), uncached_cost_pico_usd=int(uncached or 0))
