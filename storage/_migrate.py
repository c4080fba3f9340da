"""Bring a database's schema to the newest migration; cheap enough to call at every flow start."""

from __future__ import annotations

import zlib
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from llm_dispatch.core import DatabaseError

from ._models import Base
from ._engine import Sessions

__all__ = ["migrate", "require_current_schema"]

_HERE = Path(__file__).resolve().parent
# Any fixed 64-bit number works; it only has to be the same in every process.
_PG_LOCK_KEY = zlib.crc32(b"llm_dispatch.storage.migrate")


async def migrate(engine: AsyncEngine) -> None:
    """Upgrade the schema to head; a no-op when it is already there.

    The upgrade is one transaction under a database-wide lock, so processes that start
    together take turns: the first migrates, the others wait and find nothing to do.
    """
    async with engine.connect() as connection:
        # The usual case, checked without the lock: on SQLite the lock is the write lock,
        # and waiting for another run's long insert here would only delay this one.
        if await connection.run_sync(_at_head):
            return
        await connection.rollback()
        await _lock(connection)
        await connection.run_sync(_upgrade)
        await connection.commit()


async def require_current_schema(sessions: Sessions) -> None:
    """Raise ``DatabaseError`` when the database's schema is not this version's; reads only, for a command
    that must change nothing (an upgrade writes: it back-fills costs)."""
    async with sessions() as session:
        current = await (await session.connection()).run_sync(_at_head)
    if not current:
        raise DatabaseError("this database's schema is older than this llm-dispatch: run `llm-dispatch cost` "
                          "once to upgrade it (past costs are back-filled and marked so), then try again")


def _config() -> Config:
    config = Config(str(_HERE / "alembic.ini"))
    # Found through the package, not the working directory. "%" is configparser syntax.
    config.set_main_option("script_location", str(_HERE / "migrations").replace("%", "%%"))
    return config


def _at_head(connection: Connection) -> bool:
    current = set(MigrationContext.configure(connection).get_current_heads())
    return current == set(ScriptDirectory.from_config(_config()).get_heads())


async def _lock(connection: AsyncConnection) -> None:
    dialect = connection.dialect.name
    if dialect == "sqlite":
        # IMMEDIATE takes the write lock now, before alembic reads the version table, so a
        # second process waits (busy_timeout) instead of creating the same tables. SQLite
        # DDL is transactional, so a crash mid-migration leaves the file as it was.
        await connection.exec_driver_sql("BEGIN IMMEDIATE")
    elif dialect == "postgresql":
        await connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_LOCK_KEY})


def _upgrade(connection: Connection) -> None:
    config = _config()
    context = MigrationContext.configure(connection)
    if not context.get_current_heads() and not inspect(connection).get_table_names():
        # A new, empty database: the newest schema in one step, stamped as at head (Alembic's own advice; the
        # migrations have nothing to convert, and test_migrations_and_models_agree holds the two the same).
        Base.metadata.create_all(connection)
        context.stamp(ScriptDirectory.from_config(config), "head")
        return
    config.attributes["connection"] = connection
    command.upgrade(config, "head")
