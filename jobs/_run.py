"""A run's resources, set up in one place: the database engine (migrated once), its sessions, a client
per provider, closed together when the run ends, and the price table its answers are priced with."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from llm_dispatch import storage
from llm_dispatch.core import PriceTable, ProviderTable, Settings

from ._clients import Clients


@dataclass(frozen=True, slots=True)
class JobRun:
    """What every step of one run shares: its settings, one engine's sessions, its clients, one price table."""

    settings: Settings
    sessions: storage.Sessions
    clients: Clients
    # The bundled prices with ``settings.prices_file`` over them: every answer of the run is stored
    # with its cost under these, for every result writer of the run.
    prices: PriceTable


def load_prices(settings: Settings) -> PriceTable:
    """The bundled price table, with the user's ``settings.prices_file`` merged over it, and the prices of the
    models of the providers ``settings.providers_file`` declares."""
    providers = ProviderTable.from_settings(settings) if settings.providers_file else None
    return PriceTable.load(path=Path(settings.prices_file) if settings.prices_file else None, providers=providers)


@asynccontextmanager
async def open_run(
    settings: Settings, *, migrate: bool = True, transport: httpx.AsyncBaseTransport | None = None
) -> AsyncIterator[JobRun]:
    """Open the run's engine (migrating the schema unless ``migrate`` is False) and its clients.

    There is one client per provider the run sends to, made when first needed. The price table is read first: a bad price file stops the run before it opens anything.
    """
    prices = load_prices(settings)
    async with storage.open_database(settings.database_url, migrate=migrate) as sessions:
        clients = Clients(settings=settings, transport=transport)
        try:
            yield JobRun(settings=settings, sessions=sessions, clients=clients, prices=prices)
        finally:
            await clients.aclose()
