"""Storage against real databases: a temporary SQLite file per test, and PostgreSQL when
``LLM_DISPATCH_TEST_PG_URL`` is set (each test in a schema of its own, dropped afterwards)."""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Column, Integer, MetaData, event, inspect as sa_inspect, select, text
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine

from llm_dispatch.core import to_json
from llm_dispatch import storage
from llm_dispatch.core._exceptions import (
    BadRequestError, ConfigError, DatabaseError, RateLimitError, UnknownJobError, UnknownPromptError,
)
from llm_dispatch.core._types import ChatResult, dedupe_key
from llm_dispatch.storage import NewPrompt, Prompt, Result, ResultWriter, Sessions
from conftest import PG_SKIP_REASON, PG_URL_ENV


def _head_revision() -> str:
    config = Config()
    config.set_main_option("script_location", str(Path(storage.__file__).parent / "migrations"))
    head = ScriptDirectory.from_config(config).get_current_head()
    assert head is not None
    return head


# The newest migration: these tests follow it, so adding a migration does not break them.
HEAD = _head_revision()
REPO_ROOT = Path(__file__).resolve().parents[1]


# --- fixtures -------------------------------------------------------------------------


@dataclass
class Db:
    """One test's database; ``engine()`` makes further engines on it (as other processes would)."""

    kind: str
    url: str
    schema: str | None = None
    engines: list[AsyncEngine] = field(default_factory=list)

    def engine(self) -> AsyncEngine:
        engine = storage.create_engine(self.url)
        if self.schema is not None:
            _use_schema(engine, self.schema)
        self.engines.append(engine)
        return engine

    @property
    def path(self) -> str:
        assert self.kind == "sqlite"
        return self.url.split("///", 1)[1]


def _use_schema(engine: AsyncEngine, schema: str) -> None:
    @event.listens_for(engine.sync_engine, "connect", insert=True)
    def _search_path(dbapi_connection: Any, _record: Any) -> None:
        # Outside a transaction, or the pool's reset rollback would undo the SET.
        autocommit = dbapi_connection.autocommit
        dbapi_connection.autocommit = True
        cursor = dbapi_connection.cursor()
        cursor.execute(f'SET SESSION search_path TO "{schema}"')
        cursor.close()
        dbapi_connection.autocommit = autocommit


@pytest_asyncio.fixture(params=["sqlite", "postgres"], loop_scope="function")
async def db(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Db]:
    if request.param == "sqlite":
        # A directory that does not exist yet: create_engine must make it.
        database = Db(kind="sqlite", url=f"sqlite+aiosqlite:///{tmp_path / 'data' / 'test.db'}")
    else:
        pg_url = os.environ.get(PG_URL_ENV)
        if not pg_url:
            pytest.skip(PG_SKIP_REASON)
        database = Db(kind="postgres", url=pg_url, schema=f"test_storage_{uuid.uuid4().hex[:12]}")
        admin = storage.create_engine(pg_url)
        async with admin.begin() as conn:
            await conn.execute(text(f'CREATE SCHEMA "{database.schema}"'))
        await admin.dispose()
    try:
        yield database
    finally:
        for engine in database.engines:
            await engine.dispose()
        if database.schema is not None:
            admin = storage.create_engine(database.url)
            async with admin.begin() as conn:
                await conn.execute(text(f'DROP SCHEMA "{database.schema}" CASCADE'))
            await admin.dispose()


@pytest_asyncio.fixture(loop_scope="function")
async def engine(db: Db) -> AsyncEngine:
    engine = db.engine()
    await storage.migrate(engine)
    return engine


@pytest.fixture
def sessions(engine: AsyncEngine) -> Sessions:
    return storage.session_factory(engine)


def only_sqlite(db: Db) -> None:
    if db.kind != "sqlite":
        pytest.skip("SQLite file behaviour")


# --- helpers ------------------------------------------------------------------------


def new_prompts(n: int, *, prefix: str = "p", model: str = "gpt-4o-mini", start: int = 0) -> list[NewPrompt]:
    prompts = []
    for i in range(start, start + n):
        messages = [{"role": "user", "content": f"{prefix} question {i}"}]
        params = {"temperature": 0}
        prompts.append(
            NewPrompt(
                custom_id=f"{prefix}-{i}",
                position=i,
                model=model,
                messages=messages,
                params=params,
                metadata={"i": i},
                dedupe_key=dedupe_key(model=model, messages=messages, params=params),
            )
        )
    return prompts


async def make_job(sessions: Sessions, prompts: list[NewPrompt], *, name: str = "job", fingerprint: str = "f" * 64) -> str:
    job_id = await storage.create_job(
        sessions, name=name, fingerprint=fingerprint, input_path=None, model="gpt-4o-mini", settings={}
    )
    await storage.add_prompts(sessions, job_id=job_id, prompts=prompts)
    return job_id


async def prompt_ids(sessions: Sessions, job_id: str) -> dict[str, int]:
    async with sessions() as session:
        rows = await session.execute(select(Prompt.custom_id, Prompt.id).where(Prompt.job_id == job_id)
                                     .order_by(Prompt.position))
        return {custom_id: pid for custom_id, pid in rows}


async def results_of(sessions: Sessions, prompt_id: int) -> list[Result]:
    async with sessions() as session:
        return list((await session.scalars(select(Result).where(Result.prompt_id == prompt_id).order_by(Result.id))).all())


async def prompt_row(sessions: Sessions, prompt_id: int) -> Prompt:
    async with sessions() as session:
        prompt = await session.get(Prompt, prompt_id)
        assert prompt is not None
        return prompt


async def count_results(sessions: Sessions) -> int:
    async with sessions() as session:
        return len((await session.scalars(select(Result.id))).all())


def answer(text_: str = "ok", *, latency_s: float = 0.2, attempts: int = 1, tokens: int = 10) -> ChatResult:
    return ChatResult(
        text=text_,
        finish_reason="stop",
        prompt_tokens=tokens,
        completion_tokens=tokens // 2,
        cached_tokens=1,
        model="gpt-4o-mini-2024-07-18",
        response_id=f"chatcmpl-{uuid.uuid4().hex[:8]}",
        latency_s=latency_s,
        attempts=attempts,
    )


@contextmanager
def sqlite_write_lock(path: str) -> Iterator[sqlite3.Connection]:
    """Another process holding the write lock, as a concurrent flow run would."""
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("BEGIN IMMEDIATE")
    try:
        yield con
    finally:
        if con.in_transaction:
            con.execute("ROLLBACK")
        con.close()


def short_busy_timeout(engine: AsyncEngine, ms: int) -> None:
    # Added after storage's own listener, so it wins: tests need "locked" in ms, not 30 s.
    @event.listens_for(engine.sync_engine, "connect")
    def _busy(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout={ms}")
        cursor.close()


# --- engine -------------------------------------------------------------------------


async def test_sqlite_pragmas_are_on_for_every_connection(db: Db) -> None:
    only_sqlite(db)
    engine = db.engine()
    assert Path(db.path).parent.is_dir()
    async with engine.connect() as a, engine.connect() as b:  # two pooled connections
        for conn in (a, b):
            values = {p: (await conn.exec_driver_sql(f"PRAGMA {p}")).scalar() for p in
                      ("journal_mode", "foreign_keys", "busy_timeout", "synchronous")}
            assert values == {"journal_mode": "wal", "foreign_keys": 1, "busy_timeout": 30000, "synchronous": 1}


async def test_foreign_keys_are_enforced(sessions: Sessions) -> None:
    with pytest.raises(IntegrityError):
        await storage.add_prompts(sessions, job_id="no-such-job", prompts=new_prompts(1))


@pytest.mark.parametrize(
    "url",
    ["mysql+aiomysql://u:p@localhost/db", "not a url", "postgresql+psycopg2://u@localhost/db", "sqlite+pysqlite:///x.db"],
)
def test_unusable_database_url_names_the_setting(url: str) -> None:
    with pytest.raises(ConfigError, match="LLM_DISPATCH_DATABASE_URL"):
        storage.create_engine(url)


async def test_driverless_urls_get_the_async_driver(tmp_path: Path) -> None:
    engine = storage.create_engine(f"sqlite:///{tmp_path / 'plain.db'}")
    try:
        assert engine.dialect.driver == "aiosqlite"
        async with engine.connect() as conn:
            assert (await conn.exec_driver_sql("PRAGMA journal_mode")).scalar() == "wal"
    finally:
        await engine.dispose()
    assert storage.create_engine("postgresql://u@localhost/db").dialect.driver == "asyncpg"


# --- migrations ---------------------------------------------------------------------


async def _schema_diff(engine: AsyncEngine, metadata: MetaData) -> list[Any]:
    def diff(sync_conn: Any) -> list[Any]:
        from llm_dispatch.storage._models import built_on

        context = MigrationContext.configure(sync_conn, opts={"compare_type": True, "compare_server_default": True,
                                                              "include_object": built_on(sync_conn.dialect.name)})
        return compare_metadata(context, metadata)

    async with engine.connect() as conn:
        return await conn.run_sync(diff)


def _migrations_up(sync_conn: Any) -> None:
    """Every migration in turn, as an existing database meets them (a new one gets the models' schema at once)."""
    from alembic import command

    from llm_dispatch.storage._migrate import _config

    config = _config()
    config.attributes["connection"] = sync_conn
    command.upgrade(config, "head")


async def test_migrations_and_models_agree(db: Db) -> None:
    engine = db.engine()
    async with engine.begin() as conn:
        await conn.run_sync(_migrations_up)
    assert await _schema_diff(engine, storage.Base.metadata) == []

    # The comparison is not blind: one column more in the models shows up.
    changed = MetaData()
    for table in storage.Base.metadata.tables.values():
        copy = table.to_metadata(changed)
        copied = {item.name: item for item in (*copy.indexes, *copy.constraints)}
        for item in (*table.indexes, *table.constraints):  # to_metadata leaves out their ddl_if
            if item._ddl_if is not None:
                copied[item.name].ddl_if(dialect=item._ddl_if.dialect)
    changed.tables["results"].append_column(Column("cost_usd", Integer()))
    diff = await _schema_diff(engine, changed)
    assert [(d[0], d[3].name) for d in diff] == [("add_column", "cost_usd")]


async def test_migrate_again_is_a_no_op_and_keeps_data(db: Db) -> None:
    engine = db.engine()
    await storage.migrate(engine)
    sessions = storage.session_factory(engine)
    job_id = await make_job(sessions, new_prompts(3))
    await storage.migrate(engine)
    await storage.migrate(db.engine())
    async with engine.connect() as conn:
        assert (await conn.execute(text("SELECT version_num FROM alembic_version"))).scalars().all() == [HEAD]
    assert (await storage.job_counts(sessions, job_id=job_id))["pending"] == 3


def test_the_head_is_read_from_the_migration_files_as_alembic_reads_it() -> None:
    # A run on a database at head checks it without loading Alembic (storage._migrate): both readings must agree.
    from llm_dispatch.storage._migrate import _config, _revisions, _script_heads

    script = ScriptDirectory.from_config(_config())
    assert _revisions() == {
        s.revision: (s.down_revision,) if isinstance(s.down_revision, str) else tuple(s.down_revision or ())
        for s in script.walk_revisions()
    }
    assert _script_heads() == frozenset(script.get_heads()) == {HEAD}


async def test_a_new_database_is_made_at_head_and_migrates_from_there(engine: AsyncEngine) -> None:
    async with engine.connect() as conn:
        assert (await conn.execute(text("SELECT version_num FROM alembic_version"))).scalars().all() == [HEAD]
    assert await _schema_diff(engine, storage.Base.metadata) == []


async def test_a_new_database_is_stamped_as_alembic_stamps_one(engine: AsyncEngine) -> None:
    # storage.migrate made this database and wrote its version row without Alembic; Alembic's own stamp of it makes
    # the same table and row.
    def version_table(sync_conn: Any) -> tuple[Any, ...]:
        found = sa_inspect(sync_conn)
        columns = [(c["name"], str(c["type"]), c["nullable"]) for c in found.get_columns("alembic_version")]
        return (columns, found.get_pk_constraint("alembic_version"),
                sync_conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all())

    def stamp_again(sync_conn: Any) -> None:
        from alembic import command

        from llm_dispatch.storage._migrate import _config

        sync_conn.execute(text("DROP TABLE alembic_version"))
        config = _config()
        config.attributes["connection"] = sync_conn
        command.stamp(config, "head")

    async with engine.begin() as conn:
        ours = await conn.run_sync(version_table)
        await conn.run_sync(stamp_again)
        alembics = await conn.run_sync(version_table)
    assert ours == alembics
    assert ours[2] == [HEAD]


async def test_downgrade_to_nothing_and_up_again(engine: AsyncEngine) -> None:
    from alembic import command

    from llm_dispatch.storage._migrate import _config

    def downgrade(sync_conn: Any) -> None:
        config = _config()
        config.attributes["connection"] = sync_conn
        command.downgrade(config, "base")

    async with engine.begin() as conn:
        await conn.run_sync(downgrade)
        tables = await conn.run_sync(lambda c: set(c.dialect.get_table_names(c)))
    assert tables <= {"alembic_version"}
    await storage.migrate(engine)
    assert await _schema_diff(engine, storage.Base.metadata) == []


async def test_a_database_stamped_other_than_the_heads_is_not_taken_as_current(engine: AsyncEngine) -> None:
    sessions = storage.session_factory(engine)
    for stamp in ("0001", "ffff"):  # an older release's, a newer release's
        async with engine.begin() as conn:
            await conn.execute(text("UPDATE alembic_version SET version_num = :stamp"), {"stamp": stamp})
        with pytest.raises(DatabaseError, match="schema is older than this llm-dispatch"):
            await storage.require_current_schema(sessions)
    with pytest.raises(Exception, match="Can't locate revision identified by 'ffff'"):
        await storage.migrate(engine)


async def test_migrate_at_head_does_not_wait_for_other_writers(db: Db, engine: AsyncEngine) -> None:
    only_sqlite(db)
    with sqlite_write_lock(db.path):  # another run in the middle of a long insert
        await asyncio.wait_for(storage.migrate(db.engine()), timeout=60)


async def test_concurrent_migrations_on_a_fresh_database(db: Db) -> None:
    engines = [db.engine() for _ in range(4)]
    await asyncio.gather(*(storage.migrate(engine) for engine in engines))
    sessions = storage.session_factory(engines[0])
    job_id = await make_job(sessions, new_prompts(2))
    assert (await storage.job_counts(sessions, job_id=job_id))["pending"] == 2
    assert await _schema_diff(engines[0], storage.Base.metadata) == []


_MIGRATE_IN_A_PROCESS = """
import asyncio, sys
from llm_dispatch import storage
async def main():
    engine = storage.create_engine(sys.argv[1])
    print("ready", flush=True)
    sys.stdin.readline()  # start together
    try:
        await storage.migrate(engine)
    finally:
        await engine.dispose()
asyncio.run(main())
"""


def test_two_processes_migrate_a_fresh_sqlite_file(tmp_path: Path) -> None:
    path = tmp_path / "shared" / "fresh.db"
    env = dict(os.environ)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _MIGRATE_IN_A_PROCESS, f"sqlite+aiosqlite:///{path}"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
        )
        for _ in range(3)
    ]
    for proc in procs:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    for proc in procs:
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    with sqlite3.connect(path) as con:
        assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert con.execute("SELECT version_num FROM alembic_version").fetchall() == [(HEAD,)]
        tables = {row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"jobs", "prompts", "results", "alembic_version"} <= tables


def test_alembic_command_line_from_another_directory(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'cli.db'}"
    ini = REPO_ROOT / "storage" / "alembic.ini"
    env = {**os.environ, "LLM_DISPATCH_DATABASE_URL": url}
    done = subprocess.run(
        [sys.executable, "-m", "alembic", "-c", str(ini), "upgrade", "head"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    with sqlite3.connect(tmp_path / "cli.db") as con:
        assert con.execute("SELECT version_num FROM alembic_version").fetchall() == [(HEAD,)]


# --- jobs and prompts ---------------------------------------------------------------


async def test_job_and_prompts_round_trip(sessions: Sessions) -> None:
    settings = {"model": "gpt-4o-mini", "concurrency": 64, "note": "Grüße, 你好 🚀"}
    job_id = await storage.create_job(
        sessions, name="première", fingerprint="a" * 64, input_path="/data/prompts.jsonl",
        model="gpt-4o-mini", settings=settings,
    )
    messages = [{"role": "system", "content": "Réponds en français."}, {"role": "user", "content": "日本語で？ 🙂"}]
    params = {"temperature": 0.2, "max_tokens": 50, "stop": ["\n\n"], "response_format": {"type": "json_object"}}
    prompts = [
        NewPrompt(custom_id="zeta", position=1, model="gpt-4o", messages=messages, params=params,
                  metadata={"tags": ["ü", 1, None]}, dedupe_key=dedupe_key(model="gpt-4o", messages=messages, params=params)),
        NewPrompt(custom_id="alpha", position=0, model="gpt-4o-mini", messages=messages[1:], params={},
                  metadata=None, dedupe_key="b" * 64),
    ]
    assert await storage.add_prompts(sessions, job_id=job_id, prompts=iter(prompts)) == 2

    job = await storage.get_job(sessions, job_id=job_id)
    assert job is not None
    assert (job.id, job.name, job.status, job.model, job.input_path) == (
        job_id, "première", "created", "gpt-4o-mini", "/data/prompts.jsonl")
    assert job.settings == settings
    assert job.created_at.tzinfo is not None
    assert job.counts == {"pending": 2}
    assert await storage.get_job(sessions, job_id="nope") is None

    ids = await prompt_ids(sessions, job_id)
    work = await storage.load_work(sessions, prompt_ids=[ids["zeta"], ids["alpha"], 10**9])
    assert [w.custom_id for w in work] == ["alpha", "zeta"]  # input order, unknown id left out
    assert work[1].messages == messages and work[1].params == params and work[1].model == "gpt-4o"
    assert (await prompt_row(sessions, ids["zeta"])).metadata_ == {"tags": ["ü", 1, None]}
    assert (await prompt_row(sessions, ids["alpha"])).metadata_ is None

    await storage.set_job_status(sessions, job_id=job_id, status="running")
    assert (await storage.get_job(sessions, job_id=job_id)).status == "running"  # type: ignore[union-attr]
    with pytest.raises(LookupError):
        await storage.set_job_status(sessions, job_id="nope", status="running")
    with pytest.raises(ValueError):
        await storage.set_job_status(sessions, job_id=job_id, status="done")  # type: ignore[arg-type]


async def test_find_job_returns_the_newest_with_that_fingerprint(sessions: Sessions) -> None:
    first = await make_job(sessions, [], fingerprint="1" * 64)
    await asyncio.sleep(0.002)
    second = await make_job(sessions, [], fingerprint="1" * 64)
    await make_job(sessions, [], fingerprint="2" * 64)
    assert first != second
    assert await storage.find_job(sessions, fingerprint="1" * 64) == second
    assert await storage.find_job(sessions, fingerprint="3" * 64) is None


async def test_find_job_by_name_finds_only_jobs_of_that_name(sessions: Sessions) -> None:
    unnamed = await make_job(sessions, [], name="questions.jsonl", fingerprint="1" * 64)
    named = await make_job(sessions, [], name="nightly-2026-11-26", fingerprint="1" * 64)
    await asyncio.sleep(0.002)
    await make_job(sessions, [], name="nightly-2026-11-26", fingerprint="2" * 64)
    assert await storage.find_job(sessions, fingerprint="1" * 64, name="nightly-2026-11-26") == named
    assert await storage.find_job(sessions, fingerprint="1" * 64, name="questions.jsonl") == unnamed
    assert await storage.find_job(sessions, fingerprint="1" * 64, name="nightly-2026-11-27") is None


async def test_a_job_is_named_by_its_id_a_unique_prefix_of_it_or_its_name(sessions: Sessions) -> None:
    first = await make_job(sessions, [], name="nightly-2026-11-26")
    second = await make_job(sessions, [], name="questions.jsonl")
    third = await make_job(sessions, [], name="questions.jsonl")
    assert await storage.resolve_job(sessions, reference=first) == first
    assert await storage.resolve_job(sessions, reference=first[:8]) == first
    assert await storage.resolve_job(sessions, reference=f" {second[:6]} ") == second
    assert await storage.resolve_job(sessions, reference="nightly-2026-11-26") == first
    with pytest.raises(UnknownJobError, match="is ambiguous: several jobs are called that") as named_twice:
        await storage.resolve_job(sessions, reference="questions.jsonl")
    assert second[:8] in str(named_twice.value) and third[:8] in str(named_twice.value)
    with pytest.raises(UnknownJobError, match="needs at least 4 characters"):
        await storage.resolve_job(sessions, reference=first[:3])
    with pytest.raises(UnknownJobError, match="no job 'zzzz'"):
        await storage.resolve_job(sessions, reference="zzzz")
    # "%" and "_" are characters of an id prefix, not patterns.
    with pytest.raises(UnknownJobError, match="no job"):
        await storage.resolve_job(sessions, reference="%%%%")


async def test_an_id_prefix_shared_by_two_jobs_is_ambiguous(sessions: Sessions) -> None:
    from llm_dispatch.storage import Job

    async with sessions.begin() as session:
        for job_id in ("abcd1111-0000", "abcd2222-0000"):
            session.add(Job(id=job_id, name=job_id, fingerprint="f" * 64, input_path=None, model="m", settings={},
                            status="created"))
    with pytest.raises(UnknownJobError, match="is ambiguous: several job ids start with it") as shared:
        await storage.resolve_job(sessions, reference="abcd")
    assert "abcd1111" in str(shared.value) and "abcd2222" in str(shared.value)
    assert await storage.resolve_job(sessions, reference="abcd2") == "abcd2222-0000"


async def test_custom_id_is_unique_within_a_job(sessions: Sessions) -> None:
    job_id = await make_job(sessions, [])
    with pytest.raises(IntegrityError):
        await storage.add_prompts(sessions, job_id=job_id, prompts=new_prompts(2) + new_prompts(1))
    assert await storage.job_counts(sessions, job_id=job_id) == {}
    other = await make_job(sessions, new_prompts(2))  # the same custom ids in another job are fine
    assert (await storage.job_counts(sessions, job_id=other))["pending"] == 2


async def test_recording_in_slices_moves_on_with_the_last_slice(sessions: Sessions) -> None:
    prompts = new_prompts(10)
    job_id = await storage.create_job(sessions, name="big", fingerprint="r" * 64, input_path=None, model="gpt-4o-mini",
                                      settings={}, status="recording")
    await storage.add_prompts(sessions, job_id=job_id, prompts=prompts[:4])
    job = await storage.get_job(sessions, job_id=job_id)
    assert job is not None and (job.status, job.counts) == ("recording", {"pending": 4})

    # A run finishing the recording gives every prompt again: those stored stay as they are.
    ids_before = await prompt_ids(sessions, job_id)
    await storage.add_prompts(sessions, job_id=job_id, prompts=prompts, skip_existing=True, then_status="created")
    job = await storage.get_job(sessions, job_id=job_id)
    assert job is not None and (job.status, job.counts) == ("created", {"pending": 10})
    ids_after = await prompt_ids(sessions, job_id)
    assert {c: ids_after[c] for c in ids_before} == ids_before

    # Without skip_existing a stored id is still an error. A job no longer recording keeps its status.
    with pytest.raises(IntegrityError):
        await storage.add_prompts(sessions, job_id=job_id, prompts=prompts[:1])
    await storage.set_job_status(sessions, job_id=job_id, status="finished")
    await storage.add_prompts(sessions, job_id=job_id, prompts=prompts, skip_existing=True, then_status="running")
    job = await storage.get_job(sessions, job_id=job_id)
    assert job is not None and (job.status, job.counts) == ("finished", {"pending": 10})
    with pytest.raises(ValueError, match="unknown job status"):
        await storage.create_job(sessions, name="x", fingerprint="x", input_path=None, model="m", settings={},
                                 status="half-done")  # type: ignore[arg-type]


async def test_unfinished_prompt_ids_by_positions_and_requests(sessions: Sessions) -> None:
    prompts = new_prompts(6)
    twin = prompts[1]  # p-5 asks what p-1 asks
    prompts[5] = NewPrompt(custom_id="p-5", position=5, model=twin.model, messages=twin.messages, params=twin.params,
                           dedupe_key=twin.dedupe_key)
    job_id = await make_job(sessions, prompts)
    ids = await prompt_ids(sessions, job_id)
    by_id = {v: k for k, v in ids.items()}

    sliced = await storage.unfinished_prompt_ids(sessions, job_id=job_id, positions=(2, 5))
    assert [by_id[i] for i in sliced] == ["p-2", "p-3", "p-4"]
    twins = await storage.unfinished_prompt_ids(sessions, job_id=job_id, dedupe_keys=[twin.dedupe_key, prompts[0].dedupe_key])
    assert [by_id[i] for i in twins] == ["p-0", "p-1", "p-5"]
    # Many keys: looked up in bounded IN lists, still in input order.
    many = [p.dedupe_key for p in new_prompts(1_200, prefix="other")] + [twin.dedupe_key]
    assert [by_id[i] for i in await storage.unfinished_prompt_ids(sessions, job_id=job_id, dedupe_keys=many)] == ["p-1", "p-5"]


async def test_load_work_and_mark_in_flight_beyond_one_in_list(sessions: Sessions) -> None:
    job_id = await make_job(sessions, new_prompts(1_234))
    ids = await storage.unfinished_prompt_ids(sessions, job_id=job_id)
    work = await storage.load_work(sessions, prompt_ids=list(reversed(ids)))
    assert [w.id for w in work] == ids
    assert await storage.mark_in_flight(sessions, prompt_ids=ids) == 1_234
    assert (await storage.job_counts(sessions, job_id=job_id))["in_flight"] == 1_234


# --- which prompts are still open ---------------------------------------------------


@pytest.mark.parametrize(
    ("retry_failed", "expected"),
    [
        ("retryable", ["p-1", "p-3", "p-4"]),
        ("all", ["p-1", "p-2", "p-3", "p-4"]),
        ("none", ["p-3", "p-4"]),
    ],
)
async def test_unfinished_prompt_ids(sessions: Sessions, retry_failed: str, expected: list[str]) -> None:
    # Positions run opposite to insert order, so "input order" is not just "by id".
    prompts = [
        NewPrompt(custom_id=p.custom_id, position=100 - p.position, model=p.model, messages=p.messages,
                  params=p.params, metadata=p.metadata, dedupe_key=p.dedupe_key)
        for p in new_prompts(7)
    ]
    job_id = await make_job(sessions, prompts)
    ids = await prompt_ids(sessions, job_id)
    # p-0 succeeded; p-1 failed, retryable; p-2 failed for good; p-3 was in flight when its
    # process died; p-4 was never sent; p-5 succeeded, then a late failure came; p-6 failed, then succeeded.
    await storage.mark_in_flight(sessions, prompt_ids=[i for c, i in ids.items() if c != "p-4"])
    async with ResultWriter(sessions) as writer:
        await writer.success(prompt_ids=[ids["p-0"]], result=answer())
        await writer.failure(prompt_ids=[ids["p-1"]], error=RateLimitError("slow down", status_code=429, attempts=6))
        await writer.failure(prompt_ids=[ids["p-2"]], error=BadRequestError("bad", status_code=400))
        await writer.success(prompt_ids=[ids["p-5"]], result=answer())
        await writer.flush()
        await writer.failure(prompt_ids=[ids["p-5"]], error=RateLimitError("late", status_code=429))
        await writer.failure(prompt_ids=[ids["p-6"]], error=RateLimitError("first", status_code=429))
        await writer.flush()
        await writer.success(prompt_ids=[ids["p-6"]], result=answer())
    assert await storage.mark_in_flight(sessions, prompt_ids=[ids["p-0"], ids["p-5"], ids["p-6"]]) == 0

    unfinished_ids = await storage.unfinished_prompt_ids(sessions, job_id=job_id, retry_failed=retry_failed)  # type: ignore[arg-type]
    by_id = {v: k for k, v in ids.items()}
    assert [by_id[i] for i in unfinished_ids] == sorted(expected, reverse=True)  # position order
    assert (await prompt_row(sessions, ids["p-5"])).status == "succeeded"
    assert (await prompt_row(sessions, ids["p-6"])).failed_retryable is None


async def test_unfinished_prompt_ids_rejects_an_unknown_flag(sessions: Sessions) -> None:
    with pytest.raises(ValueError):
        await storage.unfinished_prompt_ids(sessions, job_id="x", retry_failed="some")  # type: ignore[arg-type]


# --- reuse --------------------------------------------------------------------------


async def test_find_reusable_across_jobs(sessions: Sessions) -> None:
    old_job = await make_job(sessions, new_prompts(4), fingerprint="o" * 64)
    old = await prompt_ids(sessions, old_job)
    async with ResultWriter(sessions) as writer:
        await writer.success(prompt_ids=[old["p-0"]], result=answer("first", attempts=2))
        await writer.success(prompt_ids=[old["p-1"]], result=answer("batch answer"), route="batch")
        await writer.failure(prompt_ids=[old["p-2"]], error=BadRequestError("no", status_code=400))
        await writer.success(prompt_ids=[old["p-3"]], result=answer("stored copy"), route="reused")
    new_job = await make_job(sessions, new_prompts(4), fingerprint="n" * 64)
    new = await prompt_ids(sessions, new_job)
    async with ResultWriter(sessions) as writer:  # a newer answer to p-0 wins
        await writer.success(prompt_ids=[new["p-0"]], result=answer("second", latency_s=1.5))

    work = await storage.load_work(sessions, prompt_ids=list(new.values()))
    keys = {w.custom_id: w.dedupe_key for w in work}
    found = await storage.find_reusable(sessions, dedupe_keys=list(keys.values()) + ["0" * 64])
    assert set(found) == {keys["p-0"], keys["p-1"]}  # failed and reused-only rows are not answers
    assert found[keys["p-0"]].text == "second"
    assert found[keys["p-0"]].latency_s == pytest.approx(1.5)
    reused = found[keys["p-1"]]
    assert (reused.text, reused.finish_reason, reused.prompt_tokens, reused.model) == (
        "batch answer", "stop", 10, "gpt-4o-mini-2024-07-18")


# --- ResultWriter -------------------------------------------------------------------


async def test_writer_rows_are_visible_after_the_flush_interval(sessions: Sessions) -> None:
    job_id = await make_job(sessions, new_prompts(1))
    (pid,) = (await prompt_ids(sessions, job_id)).values()
    async with ResultWriter(sessions, flush_rows=1_000, flush_interval=0.05) as writer:
        await writer.success(prompt_ids=[pid], result=answer())
        deadline = time.monotonic() + 5
        while await count_results(sessions) == 0:
            assert time.monotonic() < deadline, "result not written while the writer stayed open"
            await asyncio.sleep(0.01)
        assert (await prompt_row(sessions, pid)).status == "succeeded"
        assert writer.pending_rows == 0 and writer.flushes == 1


@pytest.mark.parametrize(
    ("prompts", "flush_rows", "written", "flushes"),
    [
        (550, 100, 550, (1, 1)),  # fell behind by 5 batches' worth: caught up in one transaction
        (1_050, 100, 1_000, (1, 2)),  # the caller is held at 10 x flush_rows: one write of 1,000, the tail at exit
        (5, 1_000, 0, (0, 1)),  # fewer than flush_rows and the interval far off: written at exit
    ],
)
async def test_writer_writes_every_waiting_row_at_once_and_exit_writes_the_tail(
    sessions: Sessions, prompts: int, flush_rows: int, written: int, flushes: tuple[int, int]
) -> None:
    job_id = await make_job(sessions, new_prompts(prompts))
    ids = list((await prompt_ids(sessions, job_id)).values())
    async with ResultWriter(sessions, flush_rows=flush_rows, flush_interval=3_600) as writer:
        for pid in ids:  # no await yields to the writer until the back-pressure limit
            await writer.success(prompt_ids=[pid], result=answer())
        for _ in range(500 if written else 20):  # let the background flusher catch up
            if writer.rows_written == written and written:
                break
            await asyncio.sleep(0.01)
        assert (writer.flushes, writer.rows_written, writer.pending_rows) == (flushes[0], written, prompts - written)
        assert await count_results(sessions) == written
    assert (writer.flushes, writer.rows_written, writer.pending_rows) == (flushes[1], prompts, 0)
    assert (await storage.job_counts(sessions, job_id=job_id))["succeeded"] == prompts


async def test_writer_exit_flushes_even_when_the_body_fails(sessions: Sessions) -> None:
    job_id = await make_job(sessions, new_prompts(3))
    ids = list((await prompt_ids(sessions, job_id)).values())
    with pytest.raises(KeyError):
        async with ResultWriter(sessions, flush_interval=3_600, job_id=job_id) as writer:
            for pid in ids:
                await writer.success(prompt_ids=[pid], result=answer())
            raise KeyError("boom")
    assert await count_results(sessions) == 3


async def test_writer_one_call_for_identical_prompts(sessions: Sessions) -> None:
    job_id = await make_job(sessions, new_prompts(3))
    ids = list((await prompt_ids(sessions, job_id)).values())
    async with ResultWriter(sessions) as writer:
        await writer.success(prompt_ids=ids, result=answer(attempts=3, tokens=40))
    rows = [(await results_of(sessions, pid))[0] for pid in ids]
    assert [r.route for r in rows] == ["realtime", "reused", "reused"]
    assert [r.attempts for r in rows] == [3, 0, 0]
    assert {r.job_id for r in rows} == {job_id}
    assert [(await prompt_row(sessions, pid)).attempts for pid in ids] == [3, 0, 0]
    stats = await storage.result_stats(sessions, job_id=job_id)
    assert (stats.succeeded, stats.reused, stats.prompt_tokens, stats.completion_tokens) == (3, 2, 40, 20)


async def test_writer_records_failures(sessions: Sessions) -> None:
    job_id = await make_job(sessions, new_prompts(5))
    ids = list((await prompt_ids(sessions, job_id)).values())
    async with ResultWriter(sessions, job_id=job_id) as writer:
        await writer.failure(prompt_ids=[ids[0]], error=BadRequestError("x" * 5_000, status_code=400))
        await writer.failure(prompt_ids=[ids[1], ids[2]], error=RateLimitError("429 again", status_code=429, attempts=6))
        await writer.failure(prompt_ids=[ids[3]], error=ValueError("not JSON"))
        await writer.failure(prompt_ids=[ids[4]], error=RateLimitError("later", status_code=429, attempts=2), final=False)

    bad = (await results_of(sessions, ids[0]))[0]
    assert (bad.status, bad.error_class, bad.http_status, bad.attempts, bad.text) == (
        "failed", "BadRequestError", 400, 1, None)
    assert bad.error_message == "x" * 2_000
    assert bad.prompt_tokens is None and bad.latency_ms is None
    first = await prompt_row(sessions, ids[0])
    assert (first.status, first.failed_retryable, first.last_error_class, first.attempts) == (
        "failed", False, "BadRequestError", 1)

    limited = [await prompt_row(sessions, pid) for pid in ids[1:3]]
    assert [(p.status, p.failed_retryable, p.attempts) for p in limited] == [("failed", True, 6), ("failed", True, 0)]
    assert (await results_of(sessions, ids[2]))[0].route == "reused"

    odd = (await results_of(sessions, ids[3]))[0]
    assert (odd.error_class, odd.http_status, odd.error_message) == ("ValueError", None, "not JSON")
    assert (await prompt_row(sessions, ids[3])).failed_retryable is False

    not_final = await prompt_row(sessions, ids[4])
    assert (not_final.status, not_final.failed_retryable, not_final.attempts, not_final.last_error_class) == (
        "pending", None, 2, "RateLimitError")
    assert (await results_of(sessions, ids[4]))[0].status == "failed"

    stats = await storage.result_stats(sessions, job_id=job_id)
    assert stats.failed == 4
    assert stats.failed_by_class == {"RateLimitError": 2, "BadRequestError": 1, "ValueError": 1}


async def test_writer_raises_for_unknown_prompt_ids(sessions: Sessions) -> None:
    with pytest.raises(UnknownPromptError, match="not in the database"):
        async with ResultWriter(sessions) as writer:
            await writer.success(prompt_ids=[10**9], result=answer())
    assert writer.pending_rows == 1  # kept, not dropped


async def test_writer_must_be_entered(sessions: Sessions) -> None:
    with pytest.raises(RuntimeError, match="async with"):
        await ResultWriter(sessions).success(prompt_ids=[1], result=answer())


async def test_result_stats(sessions: Sessions) -> None:
    job_id = await make_job(sessions, new_prompts(12))
    ids = list((await prompt_ids(sessions, job_id)).values())
    async with ResultWriter(sessions) as writer:
        for i, pid in enumerate(ids[:10], start=1):  # 10..100 ms
            await writer.success(prompt_ids=[pid], result=answer(latency_s=i / 100, tokens=10))
        await writer.success(prompt_ids=[ids[10]], result=answer(latency_s=9.0, tokens=1_000), route="reused")
        await writer.success(prompt_ids=[ids[11]], result=answer(latency_s=5.0, tokens=10), route="batch")
    stats = await storage.result_stats(sessions, job_id=job_id)
    assert (stats.succeeded, stats.failed, stats.reused) == (12, 0, 1)
    assert stats.p50_latency_ms == pytest.approx(50) and stats.p95_latency_ms == pytest.approx(100)
    assert (stats.prompt_tokens, stats.completion_tokens, stats.cached_tokens) == (110, 55, 11)
    assert to_json(stats)["p95_latency_ms"] == pytest.approx(100)
    empty = await storage.result_stats(sessions, job_id="nope")
    assert (empty.succeeded, empty.p50_latency_ms, empty.prompt_tokens) == (0, None, 0)


async def test_export_rows_in_input_order_with_each_prompts_latest_result(
    sessions: Sessions, monkeypatch: pytest.MonkeyPatch
) -> None:
    from llm_dispatch.storage import _reports

    monkeypatch.setattr(_reports, "EXPORT_PAGE", 2)  # pages of 2: a prompt's results never straddle a page's end
    job_id = await make_job(sessions, new_prompts(5))
    other_job = await make_job(sessions, new_prompts(2, prefix="other"), name="other", fingerprint="e" * 64)
    ids = list((await prompt_ids(sessions, job_id)).values())
    async with ResultWriter(sessions) as writer:
        await writer.failure(prompt_ids=[ids[1]], error=RateLimitError("429", status_code=429, attempts=2), final=False)
        await writer.success(prompt_ids=[ids[0]], result=answer("first"))
        await writer.success(prompt_ids=[ids[1]], result=answer("at last"))
        await writer.failure(prompt_ids=[ids[3]], error=BadRequestError("no", status_code=400))
        await writer.success(prompt_ids=list((await prompt_ids(sessions, other_job)).values()), result=answer("other"))

    rows = [row async for row in storage.export_rows(sessions, job_id=job_id)]

    assert [(r.position, r.status, r.text, r.error_class) for r in rows] == [
        (0, "succeeded", "first", None), (1, "succeeded", "at last", None), (2, "pending", None, None),
        (3, "failed", None, "BadRequestError"), (4, "pending", None, None)]


async def test_export_rows_reads_the_fields_asked_for_and_stops_when_its_reader_does(
    sessions: Sessions, monkeypatch: pytest.MonkeyPatch
) -> None:
    from llm_dispatch.storage import _reports

    monkeypatch.setattr(_reports, "EXPORT_PAGE", 2)
    job_id = await make_job(sessions, new_prompts(5))
    ids = list((await prompt_ids(sessions, job_id)).values())
    async with ResultWriter(sessions) as writer:
        await writer.success(prompt_ids=[ids[0]], result=answer("first"))

    rows = [row async for row in storage.export_rows(sessions, job_id=job_id, fields=["custom_id", "text"])]
    assert [(r.position, r.custom_id, r.text, r.status, r.messages) for r in rows] == [
        (0, "p-0", "first", None, None), (1, "p-1", None, None, None), (2, "p-2", None, None, None),
        (3, "p-3", None, None, None), (4, "p-4", None, None, None)]
    with pytest.raises(ValueError, match="ExportRow has no field answer"):
        [row async for row in storage.export_rows(sessions, job_id=job_id, fields=["answer"])]

    first = storage.export_rows(sessions, job_id=job_id)
    assert (await anext(first)).text == "first"  # a reader that stops after one row of a page of two
    await first.aclose()
    assert [r.position async for r in storage.export_rows(sessions, job_id=job_id)] == [0, 1, 2, 3, 4]


# --- writer under lock contention (SQLite: another process holds the write lock) ----


@pytest_asyncio.fixture(loop_scope="function")
async def impatient(db: Db, engine: AsyncEngine) -> Sessions:
    """Sessions on a second engine whose writes give up on a lock after 50 ms."""
    only_sqlite(db)
    other = db.engine()
    short_busy_timeout(other, 50)
    return storage.session_factory(other)


async def test_writer_retries_once_when_the_database_is_locked(
    db: Db, sessions: Sessions, impatient: Sessions, caplog: pytest.LogCaptureFixture
) -> None:
    job_id = await make_job(sessions, new_prompts(20))
    ids = list((await prompt_ids(sessions, job_id)).values())
    caplog.set_level(logging.WARNING, logger="llm_dispatch.storage._writer")
    async with ResultWriter(impatient, flush_rows=10, flush_interval=0.01) as writer:
        writer.retry_delay = 1.0
        with sqlite_write_lock(db.path):
            for pid in ids:
                await writer.success(prompt_ids=[pid], result=answer())
            for _ in range(6000):  # the first write gives up on the lock after 50 ms...
                if "retrying once" in caplog.text:
                    break
                await asyncio.sleep(0.01)
        # ...and the retry, after the lock is gone, succeeds.
    assert writer.rows_written == 20
    assert await count_results(sessions) == 20
    assert "retrying once" in caplog.text


async def test_writer_raises_loudly_and_keeps_rows_when_writes_keep_failing(
    db: Db, sessions: Sessions, impatient: Sessions
) -> None:
    job_id = await make_job(sessions, new_prompts(5))
    ids = list((await prompt_ids(sessions, job_id)).values())
    with sqlite_write_lock(db.path):
        with pytest.raises(OperationalError, match="locked"):
            async with ResultWriter(impatient, flush_interval=0.01) as writer:
                writer.retry_delay = 0.01
                await writer.success(prompt_ids=ids[:3], result=answer())
                accepted = 3
                for _ in range(200):  # results keep coming until the writer says it is broken
                    await asyncio.sleep(0.01)
                    try:
                        await writer.success(prompt_ids=[ids[3]], result=answer())
                    except RuntimeError as exc:
                        assert "can no longer be written" in str(exc)
                        break
                    accepted += 1
                else:
                    pytest.fail("the writer never reported its failure")
        assert writer.pending_rows == accepted and writer.rows_written == 0  # all held, none dropped
    assert await count_results(sessions) == 0


async def test_writer_backpressure_holds_callers_while_the_database_is_busy(db: Db, sessions: Sessions) -> None:
    only_sqlite(db)
    job_id = await make_job(sessions, new_prompts(150))
    ids = list((await prompt_ids(sessions, job_id)).values())
    async with ResultWriter(sessions, flush_rows=10, flush_interval=0.01) as writer:
        with sqlite_write_lock(db.path):  # the writer waits on busy_timeout meanwhile

            async def produce() -> None:
                for pid in ids:
                    await writer.success(prompt_ids=[pid], result=answer())

            producer = asyncio.create_task(produce())
            for _ in range(6000):  # until the writer holds as many rows as it takes
                if writer.pending_rows >= 100:
                    break
                await asyncio.sleep(0.01)
            for _ in range(20):  # the producer, given the loop, gets no further
                await asyncio.sleep(0.01)
            assert not producer.done()
            assert 100 <= writer.pending_rows <= 101
        await asyncio.wait_for(producer, timeout=30)
    assert writer.rows_written == 150


# --- volume -------------------------------------------------------------------------


@pytest.mark.slow
async def test_100k_prompts_and_a_stream_of_results(sessions: Sessions, db: Db) -> None:
    n = 100_000
    prompts = new_prompts(n)
    started = time.perf_counter()
    job_id = await make_job(sessions, prompts)
    insert_s = time.perf_counter() - started
    assert (await storage.job_counts(sessions, job_id=job_id))["pending"] == n

    ids = await storage.unfinished_prompt_ids(sessions, job_id=job_id)
    assert len(ids) == n
    sample = ids[:20_000]
    started = time.perf_counter()
    async with ResultWriter(sessions, job_id=job_id) as writer:
        for pid in sample:
            await writer.success(prompt_ids=[pid], result=answer())
    write_s = time.perf_counter() - started
    assert writer.rows_written == len(sample)
    print(
        f"\n[{db.kind}] add_prompts: {n / insert_s:,.0f} rows/s ({insert_s:.2f} s for {n:,}); "
        f"ResultWriter: {len(sample) / write_s:,.0f} results/s ({writer.flushes} flushes)"
    )


def test_result_rows_carry_every_results_column() -> None:
    # A column the row builders do not know would be stored NULL by both writers without a word.
    from llm_dispatch.storage._results import RESULT_COLUMNS

    assert sorted(RESULT_COLUMNS) == sorted(column.name for column in storage.Result.__table__.columns if column.name != "id")


async def test_a_jobs_cache_groups_are_kept_and_read_back_largest_first(sessions: Sessions) -> None:
    job_id = await make_job(sessions, [])

    def group(key: str, *, prompts: int, tokens: int, cost: int | None) -> storage.CacheGroupRow:
        return storage.CacheGroupRow(
            lane="realtime", key=key, provider="anthropic", model="claude-sonnet-5-5", endpoint="chat", prompts=prompts,
            prefix_tokens=tokens, prefix_messages=1, own_breakpoints=False, action="breakpoint",
            reason="breakpoint after message 1, ttl 5m", keys=0, ttl="5m",
            planned_cost_pico_usd=None if cost is None else cost // 10, uncached_cost_pico_usd=cost)

    groups = [group(f"k{n}", prompts=n + 2, tokens=1_000 + n, cost=None if n == 3 else 10**9 * (n + 1))
              for n in range(2_500)]  # more than one insert's rows
    await storage.store_cache_groups(sessions, job_id=job_id, groups=groups)
    found = await storage.job_cache_groups(sessions, job_id=job_id, limit=3)
    assert [row.key for row in found.groups] == ["k2499", "k2498", "k2497"] and found.groups[0] == groups[-1]
    priced = [row.uncached_cost_pico_usd or 0 for row in groups]
    assert (found.total, found.uncached_cost_pico_usd) == (2_500, sum(priced))
    assert found.planned_cost_pico_usd == sum(cost // 10 for cost in priced)
    # Recorded again (a recording cut off and done again): the job's groups are replaced, not added to.
    await storage.store_cache_groups(sessions, job_id=job_id, groups=groups[:1])
    assert (await storage.job_cache_groups(sessions, job_id=job_id)).total == 1
    # A million prompts of a 3,000-token prefix: their product is past a 32-bit INTEGER (PostgreSQL's).
    big = [group("big", prompts=1_000_000, tokens=3_000, cost=10**15), groups[0]]
    await storage.store_cache_groups(sessions, job_id=job_id, groups=big)
    assert [row.key for row in (await storage.job_cache_groups(sessions, job_id=job_id)).groups] == ["big", "k0"]
