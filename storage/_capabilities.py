"""What each endpoint (base URL) can do, as learnt from its answers: one row per base URL."""

from __future__ import annotations

from sqlalchemy import select

from ._engine import Sessions
from ._models import EndpointCapability, utcnow

__all__ = ["no_batch_api", "remember_no_batch_api"]


async def remember_no_batch_api(sessions: Sessions, *, base_url: str, reason: str) -> None:
    """Keep that ``base_url`` has no Batch API (its files or batches route answered 404), and why."""
    async with sessions.begin() as session:
        found = await session.get(EndpointCapability, base_url)
        if found is None:
            session.add(EndpointCapability(base_url=base_url, batch_api=False, reason=reason, learnt_at=utcnow()))
        else:
            found.batch_api, found.reason, found.learnt_at = False, reason, utcnow()


async def no_batch_api(sessions: Sessions, *, base_url: str) -> str | None:
    """Why ``base_url`` is known to have no Batch API, or None when it is not known to lack one."""
    stmt = select(EndpointCapability.reason).where(EndpointCapability.base_url == base_url,
                                                   EndpointCapability.batch_api.is_(False))
    async with sessions() as session:
        reason = (await session.execute(stmt)).scalar_one_or_none()
    return None if reason is None else reason or "no Batch API"
