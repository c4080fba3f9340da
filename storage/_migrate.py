"""Bring a database's schema to the newest migration; cheap enough to call at every flow start.

A database at head is told so, and a new one made and stamped at head, without Alembic: its version table is read
(or written) with SQLAlchemy and the head taken from the ``revision``/``down_revision`` lines of the migration files.
Alembic and the migrations themselves are loaded only to upgrade an older database.
"""

from __future__ import annotations

import ast
import functools
import re
import zlib
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Column, MetaData, PrimaryKeyConstraint, String, Table, inspect, select, text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from llm_dispatch.core import DatabaseError

from ._models import Base

if TYPE_CHECKING:
    from alembic.config import Config

    from ._engine import Sessions

__all__ = ["migrate", "require_current_schema"]

_HERE = Path(__file__).resolve().parent
_VERSIONS = _HERE / "migrations" / "versions"
# Alembic's default: migrations/env.py names no other version table.
_VERSION_TABLE = "alembic_version"
# A migration's ids, as Alembic's template writes them (``down_revision: str | None = "0018"`` too).
_REVISION_LINE = re.compile(r"^(revision|down_revision)\s*(?::[^=\n]*)?=\s*(.+?)\s*$", re.MULTILINE)
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
    from alembic.config import Config

    config = Config(str(_HERE / "alembic.ini"))
    # Found through the package, not the working directory. "%" is configparser syntax.
    config.set_main_option("script_location", str(_HERE / "migrations").replace("%", "%%"))
    return config


def _at_head(connection: Connection) -> bool:
    # What Alembic's MigrationContext.get_current_heads and ScriptDirectory.get_heads would say
    # (test_the_head_is_read_from_the_migration_files_as_alembic_reads_it).
    if not inspect(connection).has_table(_VERSION_TABLE):
        return False
    version = _version_table()
    return frozenset(connection.execute(select(version.c.version_num)).scalars()) == _script_heads()


def _version_table() -> Table:
    """Alembic's version table, as its ``DefaultImpl.version_table_impl`` defines it (every later upgrade reads it)."""
    return Table(_VERSION_TABLE, MetaData(), Column("version_num", String(32), nullable=False),
                 PrimaryKeyConstraint("version_num", name=f"{_VERSION_TABLE}_pkc"))


@functools.cache
def _revisions() -> dict[str, tuple[str, ...]]:
    """``{revision: the revisions it revises}`` of every migration file, read without running them."""
    revisions: dict[str, tuple[str, ...]] = {}
    for path in sorted(_VERSIONS.glob("*.py")):
        found = {name: ast.literal_eval(value) for name, value in _REVISION_LINE.findall(path.read_text(encoding="utf-8"))}
        if not isinstance(found.get("revision"), str):
            raise DatabaseError(f"{path}: no `revision = \"...\"` line; a migration names its revision id")
        down = found.get("down_revision")
        revisions[found["revision"]] = (down,) if isinstance(down, str) else tuple(down or ())
    return revisions


def _script_heads() -> frozenset[str]:
    """The revisions no other revises: the schema's head (one, unless the migrations branch)."""
    revisions = _revisions()
    return frozenset(revisions) - {down for downs in revisions.values() for down in downs}


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
    if not inspect(connection).get_table_names():
        # A new, empty database (not even a version table): the newest schema in one step, stamped as at head
        # (Alembic's own advice; the migrations have nothing to convert, and test_migrations_and_models_agree holds
        # the two the same). The stamp is the table and row Alembic's would write
        # (test_a_new_database_is_stamped_as_alembic_stamps_one).
        Base.metadata.create_all(connection)
        version = _version_table()
        version.create(connection)
        connection.execute(version.insert(), [{"version_num": head} for head in sorted(_script_heads())])
        return
    from alembic import command

    config = _config()
    config.attributes["connection"] = connection
    command.upgrade(config, "head")
