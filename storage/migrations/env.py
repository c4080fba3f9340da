"""Alembic environment for llm-dispatch: runs on the caller's connection or an async engine.

``storage.migrate`` hands over a synchronous connection (from ``AsyncConnection.run_sync``)
in ``config.attributes["connection"]``, already inside a locked transaction. The ``alembic``
command line instead gets the URL from ``-x url=...`` or ``LLM_DISPATCH_DATABASE_URL``.
"""

from __future__ import annotations

import asyncio
import os
from logging.config import fileConfig

from alembic import context
from sqlalchemy.engine import Connection

from llm_dispatch.storage._engine import DATABASE_URL_ENV, create_engine
from llm_dispatch.storage._models import Base, built_on

config = context.config
target_metadata = Base.metadata


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        compare_type=True,
        include_object=built_on(connection.dialect.name),
        # SQLite cannot ALTER most things; batch mode recreates the table instead.
        render_as_batch=connection.dialect.name == "sqlite",
    )


def _run_on(connection: Connection) -> None:
    _configure(connection)
    with context.begin_transaction():
        context.run_migrations()


def _cli_url() -> str:
    url = context.get_x_argument(as_dictionary=True).get("url") or os.environ.get(DATABASE_URL_ENV)
    url = url or config.get_main_option("sqlalchemy.url")
    if not url:
        raise SystemExit(f"No database URL: pass -x url=... or set {DATABASE_URL_ENV}")
    return url


async def _run_cli_online(url: str) -> None:
    engine = create_engine(url)
    try:
        async with engine.connect() as connection:
            await connection.run_sync(_run_on)
            await connection.commit()
    finally:
        await engine.dispose()


def _main() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        # Called from storage.migrate: leave the application's logging alone.
        _run_on(connection)
        return
    if config.config_file_name is not None:
        fileConfig(config.config_file_name)
    if context.is_offline_mode():
        context.configure(url=_cli_url(), target_metadata=target_metadata, literal_binds=True)
        with context.begin_transaction():
            context.run_migrations()
    else:
        asyncio.run(_run_cli_online(_cli_url()))


_main()
