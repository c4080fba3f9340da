"""A run's resources, set up in one place: the database engine (migrated once), its sessions, and the
client of the provider, closed together when the run ends."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httpx
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

import storage
from llm_dispatch import LLMClient, Settings

Sessions = async_sessionmaker[AsyncSession]


@dataclass(frozen=True, slots=True)
class JobRun:
    """What every step of one run shares: its settings, one engine's sessions, one client."""

    settings: Settings
    sessions: Sessions
    client: LLMClient


@asynccontextmanager
async def open_run(
    settings: Settings, *, migrate: bool = True, transport: httpx.AsyncBaseTransport | None = None
) -> AsyncIterator[JobRun]:
    """Open the run's engine (migrating the schema unless ``migrate`` is False) and its client.

    The client is the run's only one, so ``settings.concurrency`` bounds every request the run makes.
    """
    async with storage.open_database(settings.database_url, migrate=migrate) as sessions, \
            LLMClient.from_settings(settings, transport=transport) as client:
        yield JobRun(settings=settings, sessions=sessions, client=client)
