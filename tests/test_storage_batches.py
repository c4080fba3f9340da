"""Storage for the Batch API path: the 0002 migration, batches and their members, and how a
batched prompt is kept away from the real-time path. A temporary SQLite file per test, and
PostgreSQL when ``LLM_DISPATCH_TEST_PG_URL`` is set (each test in a schema of its own)."""

from __future__ import annotations

from dataclasses import replace

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from alembic import command
from sqlalchemy import column, func, insert, select, table, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine
# The SQLite / PostgreSQL fixtures are test_storage's own (imported names are what pytest finds).
from test_storage import (  # noqa: F401
    db,
    engine,
    sessions,
    PG_URL_ENV,
    Db,
    HEAD,
    answer,
    make_job,
    new_prompts,
    prompt_ids,
    prompt_row,
    results_of,
)

from llm_dispatch import jobs
from llm_dispatch import storage
from llm_dispatch.core import PriceTable
from llm_dispatch.core._exceptions import BadRequestError, RateLimitError, UnknownPromptError
from llm_dispatch.core import (
    ACTIVE_BATCH_STATUSES,
    BATCH_STATUSES,
    HALF_SUBMITTED_BATCH_STATUSES,
    TERMINAL_BATCH_STATUSES,
    BatchConflictError,
)
from llm_dispatch.storage import Batch, Prompt, ResultWriter, Sessions
from llm_dispatch.storage._batches import release_members
from llm_dispatch.storage._migrate import _config


# --- fixtures -------------------------------------------------------------------------


# --- helpers ------------------------------------------------------------------------


async def alembic_to(engine: AsyncEngine, revision: str, *, down: bool = False) -> None:
    def run(sync_conn: Any) -> None:
        config = _config()
        config.attributes["connection"] = sync_conn
        (command.downgrade if down else command.upgrade)(config, revision)

    async with engine.begin() as conn:
        await conn.run_sync(run)


async def version(engine: AsyncEngine) -> list[str]:
    async with engine.connect() as conn:
        return list((await conn.execute(text("SELECT version_num FROM alembic_version"))).scalars())


async def tables(engine: AsyncEngine) -> set[str]:
    async with engine.connect() as conn:
        return await conn.run_sync(lambda c: set(c.dialect.get_table_names(c)))


async def statuses(sessions: Sessions, ids: dict[str, int]) -> dict[str, str]:
    # Only the status column, so it reads older schemas too.
    async with sessions() as session:
        found = dict((await session.execute(select(Prompt.id, Prompt.status).where(Prompt.id.in_(ids.values())))).all())
    return {custom_id: found[pid] for custom_id, pid in ids.items()}


async def batch_count(sessions: Sessions) -> int:
    async with sessions() as session:
        return (await session.execute(select(func.count()).select_from(Batch))).scalar_one()


async def job_with_prompts(sessions: Sessions, n: int, *, fingerprint: str = "f" * 64) -> tuple[str, dict[str, int]]:
    job_id = await make_job(sessions, new_prompts(n), fingerprint=fingerprint)
    return job_id, await prompt_ids(sessions, job_id)


async def new_batch(sessions: Sessions, job_id: str, ids: dict[str, int], names: list[str], **kwargs: Any) -> int:
    members = [(ids[name], f"line-{name}") for name in names]
    return await storage.create_batch_record(
        sessions, job_id=job_id, model="gpt-4o-mini", members=members, file_path="/tmp/b.jsonl", **kwargs
    )


# --- migration ----------------------------------------------------------------------


async def test_upgrade_from_0001_keeps_the_data(db: Db) -> None:
    engine = db.engine()
    await alembic_to(engine, "0001")
    assert await version(engine) == ["0001"]
    assert "batches" not in await tables(engine)
    sessions = storage.session_factory(engine)
    # Prompts as 0001 stored them (its columns only); the writer touches only 0001's columns.
    job_id = await storage.create_job(
        sessions, name="old", fingerprint="f" * 64, input_path=None, model="gpt-4o-mini", settings={})
    now = datetime.now(UTC)
    await insert_as_old(engine, "prompts", [
        {"job_id": job_id, "custom_id": p.custom_id, "position": p.position, "model": p.model, "messages": p.messages,
         "params": p.params, "metadata": p.metadata, "dedupe_key": p.dedupe_key, "created_at": now, "updated_at": now}
        for p in new_prompts(3)])
    ids = await prompt_ids(sessions, job_id)
    await old_results(engine, job_id, [
        {"prompt_id": ids["p-0"], "route": "realtime", "status": "succeeded", "text": "kept", "attempts": 1,
         "prompt_tokens": 10, "completion_tokens": 5, "cached_tokens": 0},
        {"prompt_id": ids["p-1"], "route": "realtime", "status": "failed", "attempts": 1,
         "error_class": "BadRequestError"}])
    async with engine.begin() as conn:
        await conn.execute(text("UPDATE prompts SET status = 'succeeded' WHERE id = :id"), {"id": ids["p-0"]})
        await conn.execute(text("UPDATE prompts SET status = 'failed' WHERE id = :id"), {"id": ids["p-1"]})

    await storage.migrate(engine)

    assert await version(engine) == [HEAD]
    assert {"batches", "batch_members"} <= await tables(engine)
    assert await storage.job_counts(sessions, job_id=job_id) == {"succeeded": 1, "failed": 1, "pending": 1}
    assert [r.text for r in await results_of(sessions, ids["p-0"])] == ["kept"]
    assert [r.error_class for r in await results_of(sessions, ids["p-1"])] == ["BadRequestError"]
    # The old prompts can be batched at once.
    batch_id = await new_batch(sessions, job_id, ids, ["p-2"])
    assert (await prompt_row(sessions, ids["p-2"])).status == "batched"
    assert await storage.batch_members(sessions, batch_id=batch_id) == {"line-p-2": [ids["p-2"]]}


async def old_results(engine: AsyncEngine, job_id: str, rows: list[dict[str, Any]]) -> None:
    """Result rows as an older schema stored them: 0001's columns only (the writer writes today's)."""
    now = datetime.now(UTC)
    blank = dict.fromkeys(("text", "prompt_tokens", "completion_tokens", "cached_tokens", "error_class"))
    values = [{**blank, "job_id": job_id, "created_at": now, **row} for row in rows]
    await insert_as_old(engine, "results", values)


async def insert_as_old(engine: AsyncEngine, name: str, values: list[dict[str, Any]]) -> None:
    """Rows into table ``name`` through a table of just the columns given (typed as today's): today's model would
    also write the columns (and client-side defaults) of later revisions, which an older schema does not have."""
    today = Prompt.metadata.tables[name]
    names = dict.fromkeys(column_name for value in values for column_name in value)
    old_table = table(name, *(column(column_name, today.c[column_name].type) for column_name in names))
    async with engine.begin() as conn:
        await conn.execute(insert(old_table), values)


async def test_upgrade_to_0004_backfills_costs_from_tokens_and_says_so(db: Db) -> None:
    engine = db.engine()
    await alembic_to(engine, "0003")
    sessions = storage.session_factory(engine)
    job_id = await make_job(sessions, [*new_prompts(4), *new_prompts(1, prefix="q", model="mystery-model", start=4)])
    ids = await prompt_ids(sessions, job_id)
    M = 1_000_000
    await old_results(engine, job_id, [
        # gpt-4o-mini: 0.8M x 0.15 + 0.2M x 0.075 + 0.5M x 0.60 = $0.435 real-time, half that by batch.
        {"prompt_id": ids["p-0"], "route": "realtime", "status": "succeeded", "attempts": 1,
         "prompt_tokens": M, "completion_tokens": M // 2, "cached_tokens": 200_000},
        {"prompt_id": ids["p-1"], "route": "batch", "status": "succeeded", "attempts": 1,
         "prompt_tokens": M, "completion_tokens": M // 2, "cached_tokens": 200_000},
        {"prompt_id": ids["p-2"], "route": "reused", "status": "succeeded", "attempts": 0,
         "prompt_tokens": M, "completion_tokens": M // 2, "cached_tokens": 200_000},
        {"prompt_id": ids["p-3"], "route": "realtime", "status": "failed", "attempts": 3, "error_class": "RateLimitError"},
        {"prompt_id": ids["q-4"], "route": "realtime", "status": "succeeded", "attempts": 1,
         "prompt_tokens": 100, "completion_tokens": 100, "cached_tokens": 0},
    ])

    await storage.migrate(engine)

    bundled = storage_prices_as_of()
    got = {name: (await results_of(sessions, pid))[0] for name, pid in ids.items()}
    assert [(name, r.cost_pico_usd, r.list_cost_pico_usd, r.discount) for name, r in sorted(got.items())] == [
        ("p-0", 435_000_000_000, 435_000_000_000, "0"),
        ("p-1", 217_500_000_000, 435_000_000_000, "0.5"),
        ("p-2", 0, 0, None),  # paid once, by another row
        ("p-3", 0, 0, None),  # a failed call is not billed
        ("q-4", None, None, None),  # no price: unknown, not 0
    ]
    # Nobody mistakes them for costs recorded when answered.
    assert {(r.cost_basis, r.prices_as_of, r.prices_file) for r in got.values()} == {("backfill", bundled, None)}
    ledger = await jobs.actual_cost(sessions=sessions, job_id=job_id)
    assert (ledger.total, ledger.savings, ledger.backfilled) == (Decimal("0.6525"), Decimal("0.2175"), 3)
    assert ledger.totals.unpriced_models == {"mystery-model": 1}

    # Down and up again: the columns go, and come back back-filled the same.
    await alembic_to(engine, "0003", down=True)
    await storage.migrate(engine)
    assert (await results_of(sessions, ids["p-1"]))[0].cost_pico_usd == 217_500_000_000


def storage_prices_as_of() -> str:
    return PriceTable.load().prices_as_of


async def test_downgrade_to_0001_sends_batched_prompts_again(sessions: Sessions, engine: AsyncEngine) -> None:
    job_id, ids = await job_with_prompts(sessions, 2)
    await new_batch(sessions, job_id, ids, ["p-0"])
    await alembic_to(engine, "0001", down=True)
    assert await version(engine) == ["0001"]
    assert not {"batches", "batch_members"} & await tables(engine)
    assert await statuses(sessions, ids) == {"p-0": "pending", "p-1": "pending"}


# --- batches ------------------------------------------------------------------------


async def test_create_get_update_and_find_a_batch(sessions: Sessions) -> None:
    job_id, ids = await job_with_prompts(sessions, 3)
    before = datetime.now(UTC)
    batch_id = await new_batch(sessions, job_id, ids, ["p-0", "p-2"])

    batch = await storage.get_batch(sessions, batch_id=batch_id)
    assert batch is not None
    assert (batch.id, batch.job_id, batch.model, batch.status, batch.file_path) == (
        batch_id, job_id, "gpt-4o-mini", "preparing", "/tmp/b.jsonl")
    assert (batch.request_total, batch.request_completed, batch.request_failed) == (2, 0, 0)
    assert batch.provider_batch_id is None and batch.resubmission_of is None and batch.errors is None
    assert batch.created_at >= before and batch.created_at.tzinfo is not None
    assert await storage.batch_members(sessions, batch_id=batch_id) == {"line-p-0": [ids["p-0"]], "line-p-2": [ids["p-2"]]}
    assert await statuses(sessions, ids) == {"p-0": "batched", "p-1": "pending", "p-2": "batched"}
    assert await storage.job_counts(sessions, job_id=job_id) == {"batched": 2, "pending": 1}

    await storage.update_batch(sessions, batch_id=batch_id, status="uploaded", input_file_id="file-in")
    submitted = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
    await storage.update_batch(
        sessions,
        batch_id=batch_id,
        status="in_progress",
        provider_batch_id="batch_abc",
        submitted_at=submitted,
        expires_at=submitted + timedelta(hours=24),
        last_polled_at=submitted + timedelta(minutes=1),
        request_completed=1,
        request_failed=1,
        errors=[{"code": "invalid_request", "message": "line 2", "line": 2}],
    )
    found = await storage.find_batch_by_provider_id(sessions, provider_batch_id="batch_abc")
    assert found is not None and found.id == batch_id
    assert (found.status, found.input_file_id, found.request_completed, found.request_failed) == (
        "in_progress", "file-in", 1, 1)
    assert found.submitted_at == submitted
    assert found.expires_at == submitted + timedelta(hours=24)
    assert found.errors == [{"code": "invalid_request", "message": "line 2", "line": 2}]
    assert found.updated_at >= batch.updated_at
    assert found.finished_at is None and found.output_file_id is None
    assert await storage.find_batch_by_provider_id(sessions, provider_batch_id="batch_other") is None
    assert await storage.get_batch(sessions, batch_id=batch_id + 100) is None


async def test_update_batch_refuses_what_it_cannot_store(sessions: Sessions) -> None:
    job_id, ids = await job_with_prompts(sessions, 1)
    batch_id = await new_batch(sessions, job_id, ids, ["p-0"])
    with pytest.raises(TypeError, match="output_file"):
        await storage.update_batch(sessions, batch_id=batch_id, output_file="typo")
    with pytest.raises(TypeError):
        await storage.update_batch(sessions, batch_id=batch_id, job_id="another")
    with pytest.raises(ValueError, match="unknown batch status"):
        await storage.update_batch(sessions, batch_id=batch_id, status="done")
    with pytest.raises(ValueError, match="mark_batch_ingested"):
        await storage.update_batch(sessions, batch_id=batch_id, status="ingested")
    with pytest.raises(LookupError):
        await storage.update_batch(sessions, batch_id=batch_id + 1, status="failed")
    with pytest.raises(LookupError):
        await storage.mark_batch_ingested(sessions, batch_id=batch_id + 1)
    assert (await storage.get_batch(sessions, batch_id=batch_id)).status == "preparing"  # type: ignore[union-attr]


async def test_provider_batch_id_is_unique(sessions: Sessions) -> None:
    job_id, ids = await job_with_prompts(sessions, 2)
    first = await new_batch(sessions, job_id, ids, ["p-0"])
    second = await new_batch(sessions, job_id, ids, ["p-1"])
    await storage.update_batch(sessions, batch_id=first, provider_batch_id="batch_1")
    with pytest.raises(IntegrityError):
        await storage.update_batch(sessions, batch_id=second, provider_batch_id="batch_1")


async def test_bad_member_lists_store_nothing(sessions: Sessions) -> None:
    job_id, ids = await job_with_prompts(sessions, 2)
    _, other = await job_with_prompts(sessions, 1, fingerprint="o" * 64)
    create = storage.create_batch_record
    with pytest.raises(ValueError, match="at least one"):
        await create(sessions, job_id=job_id, model="m", members=[], file_path=None)
    with pytest.raises(ValueError, match="only once"):
        await create(sessions, job_id=job_id, model="m", members=[(ids["p-0"], "a"), (ids["p-0"], "b")], file_path=None)
    with pytest.raises(UnknownPromptError, match="not in the database"):
        await create(sessions, job_id=job_id, model="m", members=[(ids["p-0"], "a"), (10**9, "b")], file_path=None)
    with pytest.raises(ValueError, match="another job"):
        await create(sessions, job_id=job_id, model="m", members=[(ids["p-0"], "a"), (other["p-0"], "b")], file_path=None)
    assert await batch_count(sessions) == 0
    assert await statuses(sessions, ids) == {"p-0": "pending", "p-1": "pending"}
    assert await statuses(sessions, other) == {"p-0": "pending"}


async def test_batched_prompts_are_never_sent_real_time(sessions: Sessions) -> None:
    job_id, ids = await job_with_prompts(sessions, 5)
    # p-3 failed retryably and p-4 for good: a retry run would pick them, unless they are batched.
    async with ResultWriter(sessions, job_id=job_id) as writer:
        await writer.failure(prompt_ids=[ids["p-3"]], error=RateLimitError("slow", status_code=429))
        await writer.failure(prompt_ids=[ids["p-4"]], error=BadRequestError("bad", status_code=400))
    await storage.mark_in_flight(sessions, prompt_ids=[ids["p-2"]])  # its process died
    await new_batch(sessions, job_id, ids, ["p-0", "p-2", "p-3", "p-4"])

    by_id = {v: k for k, v in ids.items()}
    for retry_failed in ("retryable", "all", "none"):
        unfinished_ids = await storage.unfinished_prompt_ids(sessions, job_id=job_id, retry_failed=retry_failed)  # type: ignore[arg-type]
        assert [by_id[i] for i in unfinished_ids] == ["p-1"]
    # A real-time sender that got the ids anyway does not take them from the batch.
    assert await storage.mark_in_flight(sessions, prompt_ids=list(ids.values())) == 1
    assert await statuses(sessions, ids) == {
        "p-0": "batched", "p-1": "in_flight", "p-2": "batched", "p-3": "batched", "p-4": "batched"}


async def test_a_prompt_in_an_open_batch_cannot_join_another(sessions: Sessions) -> None:
    job_id, ids = await job_with_prompts(sessions, 3)
    first = await new_batch(sessions, job_id, ids, ["p-0", "p-1"])

    with pytest.raises(BatchConflictError, match=rf"open batch\(es\) \[{first}\]") as caught:
        await new_batch(sessions, job_id, ids, ["p-1", "p-2"])
    assert caught.value.prompt_ids == [ids["p-1"]] and caught.value.batch_ids == [first]
    assert await batch_count(sessions) == 1  # nothing of the refused batch was stored
    assert await statuses(sessions, ids) == {"p-0": "batched", "p-1": "batched", "p-2": "pending"}

    # Released (the provider never answered it), p-1 may go into a resubmission.
    assert await release_members(sessions, batch_id=first, prompt_ids=[ids["p-1"]]) == 1
    second = await new_batch(sessions, job_id, ids, ["p-1", "p-2"], resubmission_of=first)
    assert (await storage.get_batch(sessions, batch_id=second)).resubmission_of == first  # type: ignore[union-attr]
    assert await statuses(sessions, ids) == {"p-0": "batched", "p-1": "batched", "p-2": "batched"}


async def test_succeeded_prompts_stay_succeeded_in_a_batch(sessions: Sessions) -> None:
    job_id, ids = await job_with_prompts(sessions, 2)
    async with ResultWriter(sessions, job_id=job_id) as writer:
        await writer.success(prompt_ids=[ids["p-0"]], result=answer())
    batch_id = await new_batch(sessions, job_id, ids, ["p-0", "p-1"])
    assert (await storage.get_batch(sessions, batch_id=batch_id)).request_total == 2  # type: ignore[union-attr]
    assert await statuses(sessions, ids) == {"p-0": "succeeded", "p-1": "batched"}


async def test_unfinished_batches_are_all_but_the_ingested_and_the_lost(sessions: Sessions) -> None:
    job_id, ids = await job_with_prompts(sessions, 12)
    other_job, other = await job_with_prompts(sessions, 1, fingerprint="o" * 64)
    by_status: dict[str, int] = {}
    for index, status in enumerate(BATCH_STATUSES):
        batch_id = await new_batch(sessions, job_id, ids, [f"p-{index}"])
        if status == "ingested":
            await storage.mark_batch_ingested(sessions, batch_id=batch_id)
        elif status == "lost":
            assert await storage.mark_batch_lost(sessions, batch_id=batch_id, reason="gone") == 1
        elif status != "preparing":
            await storage.update_batch(sessions, batch_id=batch_id, status=status)
        by_status[status] = batch_id
    other_batch = await new_batch(sessions, other_job, other, ["p-0"])

    mine = await storage.unfinished_batches(sessions, job_id=job_id)
    assert [b.status for b in mine] == [s for s in BATCH_STATUSES if s not in ("ingested", "lost")]
    assert [b.id for b in mine] == sorted(b.id for b in mine)
    everyone = await storage.unfinished_batches(sessions)
    assert {b.id for b in everyone} == {b.id for b in mine} | {other_batch}
    assert by_status["ingested"] not in {b.id for b in everyone} and by_status["lost"] not in {b.id for b in everyone}
    assert ACTIVE_BATCH_STATUSES | TERMINAL_BATCH_STATUSES | HALF_SUBMITTED_BATCH_STATUSES == (
        set(BATCH_STATUSES) - {"ingested", "lost"})
    lost = await storage.require_batch(sessions, batch_id=by_status["lost"])
    assert (lost.status, lost.last_error) == ("lost", "gone")


async def test_a_batch_keeps_its_errors_in_a_row_until_a_step_works_again(sessions: Sessions) -> None:
    job_id, ids = await job_with_prompts(sessions, 1)
    batch_id = await new_batch(sessions, job_id, ids, ["p-0"])
    later = datetime.now(UTC) + timedelta(minutes=5)
    assert await storage.record_batch_error(sessions, batch_id=batch_id, error="poll: boom", retry_after=later) == 1
    assert await storage.record_batch_error(sessions, batch_id=batch_id, error="poll: again", retry_after=later) == 2
    record = await storage.require_batch(sessions, batch_id=batch_id)
    assert (record.last_error, record.error_count, record.retry_after) == ("poll: again", 2, later)
    assert record.last_error_at is not None and record.status == "preparing"
    await storage.clear_batch_error(sessions, batch_id=batch_id)
    record = await storage.require_batch(sessions, batch_id=batch_id)
    assert (record.last_error, record.error_count, record.retry_after) == ("poll: again", 0, None)


async def test_ingesting_a_batch_through_the_writer(sessions: Sessions) -> None:
    job_id, ids = await job_with_prompts(sessions, 5)
    batch_id = await new_batch(sessions, job_id, ids, ["p-0", "p-1", "p-2", "p-3", "p-4"])
    await storage.update_batch(sessions, batch_id=batch_id, status="expired", output_file_id="file-out")
    members = await storage.batch_members(sessions, batch_id=batch_id)

    async with ResultWriter(sessions, job_id=job_id) as writer:
        await writer.success(prompt_ids=members["line-p-0"], result=answer("from batch", tokens=20), route="batch")
        await writer.failure(prompt_ids=members["line-p-1"], error=BadRequestError("bad line", status_code=400),
                             route="batch")
        await writer.failure(prompt_ids=members["line-p-2"], error=RateLimitError("expired", status_code=429),
                             final=False, route="batch")
    assert await statuses(sessions, ids) == {
        "p-0": "succeeded", "p-1": "failed", "p-2": "pending", "p-3": "batched", "p-4": "batched"}
    row = (await results_of(sessions, ids["p-0"]))[0]
    assert (row.route, row.status, row.text, row.prompt_tokens) == ("batch", "succeeded", "from batch", 20)
    assert (await results_of(sessions, ids["p-1"]))[0].route == "batch"
    stats = await storage.result_stats(sessions, job_id=job_id)
    assert (stats.succeeded, stats.failed, stats.prompt_tokens) == (1, 1, 20)

    # Releasing only moves prompts still waiting on this batch: p-0 keeps its answer.
    assert await release_members(sessions, batch_id=batch_id, prompt_ids=[ids["p-0"], ids["p-3"]]) == 1
    # Members nobody released (p-4) are freed when the batch is marked ingested, not lost.
    assert await storage.mark_batch_ingested(sessions, batch_id=batch_id) == 1
    assert await statuses(sessions, ids) == {
        "p-0": "succeeded", "p-1": "failed", "p-2": "pending", "p-3": "pending", "p-4": "pending"}
    assert (await storage.get_batch(sessions, batch_id=batch_id)).status == "ingested"  # type: ignore[union-attr]
    assert await storage.unfinished_batches(sessions, job_id=job_id) == []
    assert await storage.mark_batch_ingested(sessions, batch_id=batch_id) == 0  # again: nothing changes
    unfinished_ids = await storage.unfinished_prompt_ids(sessions, job_id=job_id, retry_failed="none")
    assert unfinished_ids == [ids["p-2"], ids["p-3"], ids["p-4"]]


async def test_release_leaves_other_batches_alone(sessions: Sessions) -> None:
    job_id, ids = await job_with_prompts(sessions, 2)
    first = await new_batch(sessions, job_id, ids, ["p-0"])
    await new_batch(sessions, job_id, ids, ["p-1"])
    assert await release_members(sessions, batch_id=first, prompt_ids=[ids["p-0"], ids["p-1"]]) == 1
    assert await statuses(sessions, ids) == {"p-0": "pending", "p-1": "batched"}


async def test_identical_prompts_share_one_line_and_one_answer(sessions: Sessions) -> None:
    job_id, ids = await job_with_prompts(sessions, 3)
    batch_id = await storage.create_batch_record(
        sessions, job_id=job_id, model="gpt-4o-mini", file_path=None,
        members=[(ids["p-0"], "line-a"), (ids["p-1"], "line-a"), (ids["p-2"], "line-b")],
    )
    batch = await storage.get_batch(sessions, batch_id=batch_id)
    assert batch is not None and batch.request_total == 2  # lines, not prompts
    assert await storage.batch_members(sessions, batch_id=batch_id) == {
        "line-a": sorted([ids["p-0"], ids["p-1"]]), "line-b": [ids["p-2"]]}
    async with ResultWriter(sessions, job_id=job_id) as writer:
        await writer.success(prompt_ids=[ids["p-0"], ids["p-1"]], result=answer("one answer"), route="batch")
    # A second ingest of the same output finds only what still waits.
    assert await storage.batch_members(sessions, batch_id=batch_id, waiting_only=True) == {"line-b": [ids["p-2"]]}
    assert [r.route for r in await results_of(sessions, ids["p-1"])] == ["reused"]
    assert await storage.batch_submissions(sessions, prompt_ids=list(ids.values())) == {
        ids["p-0"]: 1, ids["p-1"]: 1, ids["p-2"]: 1}


async def test_bulk_batch_answers_land_like_the_writers(sessions: Sessions) -> None:
    job_id, ids = await job_with_prompts(sessions, 4)
    await storage.create_batch_record(
        sessions, job_id=job_id, model="gpt-4o-mini", file_path=None,
        members=[(ids["p-0"], "a"), (ids["p-1"], "a"), (ids["p-2"], "b"), (ids["p-3"], "c")])
    before = datetime.now(UTC)
    written = await storage.store_batch_answers(
        sessions, job_id=job_id, latency_s=60.0, model="gpt-4o-mini", prices=PriceTable.load(),
        answers=[([ids["p-0"], ids["p-1"]], answer("shared", tokens=7)), ([ids["p-2"]], answer("own", tokens=9))])
    assert written == 3
    assert await statuses(sessions, ids) == {"p-0": "succeeded", "p-1": "succeeded", "p-2": "succeeded",
                                             "p-3": "batched"}
    first, shared, own = [await results_of(sessions, ids[name]) for name in ("p-0", "p-1", "p-2")]
    assert [(r.route, r.text, r.prompt_tokens, r.attempts, r.http_status, r.latency_ms) for r in first] == [
        ("batch", "shared", 7, 1, 200, 60_000.0)]
    assert [(r.route, r.attempts, r.http_status) for r in shared] == [("reused", 0, None)]
    # Priced as the batch's model on the Batch API, the discount stored; the reused row costs nothing.
    # gpt-4o-mini, half price: (6 x 0.15 + 1 x 0.075 + 3 x 0.60) / 2 per 1M tokens = 1,387,500 picodollars.
    assert [(r.cost_pico_usd, r.list_cost_pico_usd, r.discount, r.cost_basis) for r in (*first, *shared)] == [
        (1_387_500, 2_775_000, "0.5", "answer"), (0, 0, None, "answer")]
    assert first[0].prices_as_of == PriceTable.load().prices_as_of and first[0].prices_file is None
    assert own[0].text == "own" and own[0].job_id == job_id
    assert own[0].created_at.replace(tzinfo=own[0].created_at.tzinfo or UTC) >= before.replace(microsecond=0)
    assert (await prompt_row(sessions, ids["p-0"])).attempts == 1
    assert (await prompt_row(sessions, ids["p-1"])).attempts == 0
    # Stored twice (an ingest run again): the prompts are no longer batched, so nothing changes them.
    stats = await storage.result_stats(sessions, job_id=job_id)
    assert (stats.succeeded, stats.prompt_tokens) == (3, 16)


async def test_routes_and_deadlines_are_stored_as_given(sessions: Sessions) -> None:
    deadline = datetime(2026, 11, 22, 9, 30, 15, 123456, tzinfo=UTC)
    prompts = [
        replace(p, planned_route=route, route_reason=f"because {i}", deadline=deadline if i == 0 else None)
        for i, (p, route) in enumerate(zip(new_prompts(2), ("batch", "realtime")))
    ]
    job_id = await make_job(sessions, prompts, fingerprint="d" * 64)
    ids = await prompt_ids(sessions, job_id)
    [first, second] = await storage.load_work(sessions, prompt_ids=[ids["p-0"], ids["p-1"]])
    assert first.deadline == deadline and second.deadline is None
    assert first.messages == prompts[0].messages and first.params == prompts[0].params
    assert await storage.unfinished_prompt_ids(sessions, job_id=job_id, planned_route="batch") == [ids["p-0"]]
    assert await storage.route_counts(sessions, job_id=job_id) == {"batch": {"pending": 1}, "realtime": {"pending": 1}}
