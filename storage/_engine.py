"""The async engine for a database URL (SQLite file in WAL mode, or PostgreSQL via asyncpg)."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine

try:
    from sqlalchemy.util import await_
except ImportError:  # SQLAlchemy 2.0
    from sqlalchemy.util import await_only as await_

from llm_dispatch.core import DatabaseError, read_json, stored_json

__all__ = ["DATABASE_URL_ENV", "SQLITE_BUSY_TIMEOUT_MS", "Sessions", "check_database_url", "create_engine",
           "open_database", "session_factory", "write_lanes"]

# What every query takes: the sessions of one engine (``session_factory``), never a session or an engine.
Sessions = async_sessionmaker[AsyncSession]

DATABASE_URL_ENV = "LLM_DISPATCH_DATABASE_URL"
# Several flow runs (processes) may write one SQLite file; a writer waits this long for
# another's transaction instead of failing with "database is locked".
SQLITE_BUSY_TIMEOUT_MS = 30_000

_SQLITE_PRAGMAS = (
    "PRAGMA foreign_keys=ON",
    # NORMAL is durable across process crashes in WAL mode; only a power cut can lose the
    # last commits, and a lost result is simply sent again.
    "PRAGMA synchronous=NORMAL",
)
_WAL_RETRY_SECONDS = 0.02
_WAL_RETRIES = int(SQLITE_BUSY_TIMEOUT_MS / 1000 / _WAL_RETRY_SECONDS)

_ASYNC_DRIVERS = {"sqlite": "aiosqlite", "postgresql": "asyncpg"}
_EXAMPLES = "sqlite+aiosqlite:///path/to/llm_dispatch.db or postgresql+asyncpg://user:password@host:5432/dbname"


def create_engine(url: str, *, echo: bool = False) -> AsyncEngine:
    """An async engine for ``url``; the caller disposes of it (``await engine.dispose()``)."""
    parsed = _async_url(url)
    # Prompts are often not English; escaped \uXXXX JSON would double their stored size.
    # Read back by orjson where it reads as json.loads does (read_json): a page of prompts decodes two columns a row.
    kwargs: dict[str, Any] = {"echo": echo, "json_serializer": stored_json, "json_deserializer": read_json}
    if parsed.get_backend_name() == "sqlite":
        _make_parent_dir(parsed)
    elif parsed.get_driver_name() == "asyncpg":
        # No JIT: every query here is short, and a row estimate that is off (a table filling faster than it is
        # analyzed) made PostgreSQL compile each page's query for longer than it ran.
        kwargs["connect_args"] = {"server_settings": {"jit": "off"}}
    try:
        engine = create_async_engine(parsed, **kwargs)
    except ImportError as exc:
        raise DatabaseError(
            f"The database driver for {parsed.drivername!r} is not installed; "
            "for PostgreSQL install the extra: pip install 'llm-dispatch[postgres]'"
        ) from exc
    if parsed.get_backend_name() == "sqlite":
        event.listen(engine.sync_engine, "connect", _set_sqlite_pragmas)
    return engine


def session_factory(engine: AsyncEngine) -> Sessions:
    """Sessions that keep loaded values after commit, so results can be used outside them."""
    return async_sessionmaker(engine, expire_on_commit=False)


def write_lanes(sessions: Sessions) -> int:
    """How many write transactions of disjoint rows are worth running at once on ``sessions``' database: SQLite
    takes one writer at a time (a second waits for the lock); PostgreSQL runs each in a server process of its own,
    two side by side."""
    bind = sessions.kw.get("bind")
    return 2 if bind is not None and bind.dialect.name == "postgresql" else 1


def check_database_url(url: str, *, given_as: str = DATABASE_URL_ENV) -> None:
    """Raise ``DatabaseError`` (saying what to give instead) for a URL no engine can be made for; connects to nothing.
    ``given_as``: where the URL came from, as the messages name it (a flag, a keyword; the environment variable by
    default)."""
    _async_url(url, given_as=given_as)


def _async_url(url: str, *, given_as: str = DATABASE_URL_ENV) -> URL:
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        if "://" not in url:
            # A bare path: no password to hide, and the likely fix is plain.
            raise DatabaseError(
                f"{url!r} is a path, not a database URL; for a SQLite file give sqlite+aiosqlite:///{url} "
                f"({given_as})"
            ) from exc
        # The URL itself is not repeated: it may hold a password.
        raise DatabaseError(f"Cannot parse the database URL; set {given_as} to e.g. {_EXAMPLES}") from exc
    backend = "postgresql" if parsed.get_backend_name() == "postgres" else parsed.get_backend_name()
    driver = parsed.get_driver_name() if "+" in parsed.drivername else ""
    wanted = _ASYNC_DRIVERS.get(backend)
    if wanted is None:
        raise DatabaseError(
            f"Unsupported database {backend!r} in {given_as}; use SQLite or PostgreSQL, e.g. {_EXAMPLES}"
        )
    if driver and driver != wanted:
        # Not swapped silently: query options differ between drivers (sslmode vs ssl).
        raise DatabaseError(
            f"The database driver {driver!r} is not supported (llm-dispatch talks to {backend} through "
            f"{wanted}); set {given_as} to a {backend}+{wanted}:// URL instead of {parsed.drivername}://"
        )
    return parsed.set(drivername=f"{backend}+{wanted}")


def _make_parent_dir(url: URL) -> None:
    database = url.database or ""
    if database in ("", ":memory:") or database.startswith("file:") or url.query.get("uri") == "true":
        return
    try:
        Path(database).parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DatabaseError(
            f"Cannot create the directory for the SQLite database {database!r} ({exc}); "
            f"check {DATABASE_URL_ENV} and the directory's permissions"
        ) from exc


def _set_sqlite_pragmas(dbapi_connection: Any, _connection_record: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        # busy_timeout first: everything after it may wait on another process's lock.
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        _enable_wal(cursor)
        for pragma in _SQLITE_PRAGMAS:
            cursor.execute(pragma)
    finally:
        cursor.close()


def _enable_wal(cursor: Any) -> None:
    # WAL is remembered in the file, so this only changes a new database. When two processes
    # switch a new file at the same moment, SQLite answers one "database is locked" at once
    # instead of calling the busy handler (waiting could deadlock), so retry here.
    for _ in range(_WAL_RETRIES):
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.fetchall()
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc):
                raise
        # We run inside SQLAlchemy's greenlet bridge: sleep without blocking the event loop.
        await_(asyncio.sleep(_WAL_RETRY_SECONDS))
    cursor.execute("PRAGMA journal_mode=WAL")


@asynccontextmanager
async def open_database(url: str, *, migrate: bool = True) -> AsyncIterator[Sessions]:
    """Sessions on the database at ``url``, its schema brought to the newest migration first (unless
    ``migrate`` is False); the engine is disposed of on the way out. The one way a run opens its database."""
    from ._migrate import migrate as upgrade

    engine = create_engine(url)
    try:
        try:
            # A first connection, kept in the pool for what follows: a database that is missing, unreachable or
            # refuses us is one clear error here, not a driver's traceback from deep inside a migration.
            async with engine.connect():
                pass
        except (SQLAlchemyError, OSError) as exc:
            raise DatabaseError(_cannot_open(engine.url, exc)) from exc
        if migrate:
            await upgrade(engine)
        yield session_factory(engine)
    finally:
        await engine.dispose()


def _cannot_open(url: URL, exc: BaseException) -> str:
    """One line on why the database at ``url`` cannot be opened, its password hidden."""
    reason = getattr(exc, "orig", None) or exc
    detail = (str(reason).strip().splitlines() or [type(reason).__name__])[0]
    if url.password:
        detail = detail.replace(str(url.password), "***")
    shown = url.render_as_string(hide_password=True)
    hint = " (llm-dispatch makes the tables, not the database: `createdb NAME` first)" if url.get_backend_name() == "postgresql" else ""
    return f"cannot open the database {shown}: {detail}; check --database-url or {DATABASE_URL_ENV}{hint}"
