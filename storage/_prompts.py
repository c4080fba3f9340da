"""Every read and write of a job's prompts: storing them, routing them again, loading their work, moving them in
and out of flight, and the stored answers an identical request may reuse (a job's row: ``storage._jobs``; unfinished
prompts: ``storage._unfinished``; results: ``storage._results``)."""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import func, or_, select, update

from llm_dispatch.core import (
    JOB_STATUSES,
    ROUTES,
    SENDABLE_PROMPT_STATUSES,
    ChatResult,
    JobStatus,
    Route,
    answer_schema,
)

from ._bulk import IDS_CHUNK, IN_CHUNK, INSERT_BATCH, bind_processor, bind_value, changed_rows, chunks, id_in, placeholders
from ._models import Job, Prompt, Result, utcnow
from ._records import NewPrompt, WorkRow
from ._engine import Sessions
from ._unfinished import WORK_COLUMNS, work_row

__all__ = [
    "add_prompts",
    "find_reusable",
    "load_work",
    "mark_in_flight",
    "release_in_flight",
    "set_background_id",
    "count_background_create",
    "reopen_refused",
    "answer_schemas",
    "reask_levels",
    "reroute_late_prompts",
    "reroute_pending",
    "set_planned_route",
]


_PROMPT_COLUMNS = (
    "job_id", "custom_id", "position", "model", "messages", "params", "metadata", "dedupe_key", "planned_route",
    "route_reason", "deadline", "status", "attempts", "created_at", "updated_at",
)


def _insert_prompts_sql(dialect: Any, *, skip_existing: bool, endpoint: bool = False, provider: bool = True) -> str:
    """The INSERT of prompt rows; with ``provider`` their provider (a run always knows it; rows without one are
    written as before the column existed); with ``endpoint`` their endpoint too (else the column's default, chat: so
    chat prompts are written as before it existed)."""
    columns = (*_PROMPT_COLUMNS, *(("provider",) if provider else ()), *(("endpoint",) if endpoint else ()))
    marks = placeholders(dialect, len(columns))
    sql = f"INSERT INTO prompts ({', '.join(columns)}) VALUES ({', '.join(marks)})"
    # PostgreSQL's upsert clause, which SQLite (3.24+) reads too: a row whose (job_id, custom_id) is stored stays as it is.
    return sql + " ON CONFLICT (job_id, custom_id) DO NOTHING" if skip_existing else sql


async def add_prompts(
    sessions: Sessions,
    *,
    job_id: str,
    prompts: Iterable[NewPrompt],
    skip_existing: bool = False,
    then_status: JobStatus | None = None,
) -> int:
    """Store a job's prompts (status ``pending``) in one transaction; returns how many were given.

    ``prompts`` may be a generator: it is consumed in batches, never held whole.
    A ``custom_id`` seen twice in one job raises ``IntegrityError`` and stores nothing, unless
    ``skip_existing``: then a prompt whose id the job has already is left as stored (finishing a
    recording that was cut off, or that another run is finishing too).
    ``then_status`` moves a job that is ``recording`` on to it in the same transaction, so the
    status changes only together with the last of its prompts (a job in another status keeps it:
    another run may have finished the recording and moved on).
    """
    if then_status is not None and then_status not in JOB_STATUSES:
        raise ValueError(f"unknown job status {then_status!r}; expected one of {JOB_STATUSES}")
    now = utcnow()
    table = Prompt.__table__
    total = 0
    async with sessions.begin() as session:
        conn = await session.connection()
        dialect = conn.dialect
        # Driver executemany over tuples (see storage._bulk), the hot path of recording a large job.
        # Values that need converting (JSON, timestamps) go through their column type's own processor.
        to_json = {name: bind_processor(table.c[name], dialect) for name in ("messages", "params", "metadata")}
        to_time = bind_processor(table.c.deadline, dialect)
        stamp = bind_value(table.c.created_at, now, dialect)
        statements = {(endpoint, provider): _insert_prompts_sql(dialect, skip_existing=skip_existing,
                                                                endpoint=endpoint, provider=provider)
                      for endpoint in (False, True) for provider in (False, True)}
        batches = chunks(prompts, INSERT_BATCH)

        def next_rows() -> tuple[str, list[tuple[Any, ...]]] | None:
            batch = next(batches, None)
            if batch is None:
                return None
            rows: list[tuple[Any, ...]] = [
                (
                    job_id, p.custom_id, p.position, p.model, to_json["messages"](p.messages),
                    to_json["params"](p.params), to_json["metadata"](p.metadata), p.dedupe_key, p.planned_route,
                    p.route_reason, None if p.deadline is None else to_time(p.deadline), "pending", 0, stamp, stamp,
                )
                for p in batch
            ]
            provider = any(p.provider is not None for p in batch)
            if provider:
                rows = [(*row, p.provider) for row, p in zip(rows, batch)]
            if any(p.endpoint != "chat" for p in batch):
                return statements[True, provider], [(*row, p.endpoint) for row, p in zip(rows, batch)]
            return statements[False, provider], rows

        # Each batch's rows are made (the input read, checked and routed on the way) in a worker thread while the
        # one before is written: the driver works outside the GIL, so the two overlap. One statement at a time.
        made = next_rows()
        while made is not None:
            statement, rows = made
            write = asyncio.ensure_future(conn.exec_driver_sql(statement, rows))
            try:
                made = await asyncio.to_thread(next_rows)
            finally:
                # The statement ends before anything else uses the connection, a rollback included.
                await write
            total += len(rows)
        if then_status is not None:
            await session.execute(
                update(Job).where(Job.id == job_id, Job.status == "recording").values(status=then_status, updated_at=now)
            )
    return total


async def reroute_late_prompts(sessions: Sessions, *, job_id: str, before: datetime, reason: str) -> int:
    """Route to real-time the job's batch-routed prompts still to send (pending or in flight) whose
    deadline is earlier than ``before``, with ``reason``; returns how many. One statement."""
    stmt = (
        update(Prompt)
        .where(
            Prompt.job_id == job_id,
            Prompt.status.in_(SENDABLE_PROMPT_STATUSES),
            Prompt.planned_route == "batch",
            Prompt.deadline < before,
        )
        .values(planned_route="realtime", route_reason=reason, updated_at=utcnow())
        .execution_options(synchronize_session=False)
    )
    async with sessions.begin() as session:
        return changed_rows(await session.execute(stmt))


async def reopen_refused(sessions: Sessions, *, job_id: str) -> int:
    """Make the job's refused prompts pending again, to be asked once more (``--retry-refused``); returns how
    many. Their refusals stay stored as history; each prompt keeps its route."""
    stmt = (
        update(Prompt)
        .where(Prompt.job_id == job_id, Prompt.status == "refused")
        .values(status="pending", updated_at=utcnow())
        .execution_options(synchronize_session=False)
    )
    async with sessions.begin() as session:
        return changed_rows(await session.execute(stmt))


async def set_planned_route(sessions: Sessions, *, prompt_ids: Sequence[int], route: Route, reason: str) -> int:
    """Re-route prompts (say, from batch to real-time when a deadline no longer allows a batch); returns how many."""
    changed = 0
    async with sessions.begin() as session:
        for chunk in chunks(list(prompt_ids), IN_CHUNK):
            stmt = (
                update(Prompt)
                .where(Prompt.id.in_(chunk))
                .values(planned_route=route, route_reason=reason, updated_at=utcnow())
                .execution_options(synchronize_session=False)
            )
            changed += changed_rows(await session.execute(stmt))
    return changed


async def reroute_pending(
    sessions: Sessions, *, job_id: str, route: Route, reason: str, from_routes: Collection[Route] | None = None,
    models: Collection[str] | None = None, due_after: datetime | None = None,
) -> int:
    """Re-route every pending prompt of the job that is routed otherwise (or, given ``from_routes``, by one of
    those: say, the batch ones to real-time at an endpoint with no Batch API), of these ``models`` only when given,
    and only those with no deadline or one not before ``due_after`` when given; returns how many."""
    moved = Prompt.planned_route != route if from_routes is None else Prompt.planned_route.in_(list(from_routes))
    stmt = (
        update(Prompt)
        .where(Prompt.job_id == job_id, Prompt.status == "pending", moved)
        .values(planned_route=route, route_reason=reason, updated_at=utcnow())
        .execution_options(synchronize_session=False)
    )
    if due_after is not None:
        stmt = stmt.where(or_(Prompt.deadline.is_(None), Prompt.deadline >= due_after))
    if models is not None:
        if not models:
            return 0
        stmt = stmt.where(Prompt.model.in_(list(models)))
    async with sessions.begin() as session:
        return changed_rows(await session.execute(stmt))


async def load_work(sessions: Sessions, *, prompt_ids: Sequence[int]) -> list[WorkRow]:
    """The prompts with these ids in input (position) order, whatever order the ids came in.

    Unknown ids are left out.
    """
    found: list[tuple[int, int, WorkRow]] = []
    async with sessions() as session:
        # Core on the session's connection: the ORM's statement handling would double the cost of
        # loading a chunk's rows, while other chunks are sending.
        conn = await session.connection()
        for chunk in chunks(dict.fromkeys(prompt_ids), IN_CHUNK):
            for row in await conn.execute(select(*WORK_COLUMNS).where(Prompt.id.in_(chunk))):
                found.append((row.position, row.id, work_row(row)))
    found.sort(key=lambda item: item[:2])
    return [work for _, _, work in found]


async def answer_schemas(sessions: Sessions, *, prompt_ids: Collection[int]) -> dict[int, dict[str, Any]]:
    """The JSON schema each of these prompts asks its answer to follow (``core.answer_schema``), for those that ask."""
    found: dict[int, dict[str, Any]] = {}
    async with sessions() as session:
        conn = await session.connection()
        for chunk in chunks(list(prompt_ids), IDS_CHUNK):
            # Only prompts whose params name a response_format or output_config come back: the rest (most
            # prompts, in most jobs) cost the database a key lookup, not a row decoded here.
            stmt = select(Prompt.id, Prompt.params).where(id_in(Prompt.id, chunk, conn.dialect), or_(
                Prompt.params["response_format"].as_string().is_not(None),
                Prompt.params["output_config"].as_string().is_not(None)))
            for prompt_id, params in await conn.execute(stmt):
                schema = answer_schema(params or {})
                if schema is not None:
                    found[prompt_id] = schema
    return found


async def reask_levels(sessions: Sessions, *, prompt_ids: Collection[int]) -> dict[int, int]:
    """For those of these prompts with an invalid answer stored: the highest ``reask`` of those answers (0: only
    their own request's). A new answer to such a prompt is its asking again number level + 1."""
    found: dict[int, int] = {}
    async with sessions() as session:
        conn = await session.connection()
        for chunk in chunks(list(prompt_ids), IDS_CHUNK):
            stmt = (select(Result.prompt_id, func.max(Result.reask))
                    .where(id_in(Result.prompt_id, chunk, conn.dialect), Result.status == "invalid")
                    .group_by(Result.prompt_id))
            found.update((prompt_id, int(level)) for prompt_id, level in await conn.execute(stmt))
    return found


async def mark_in_flight(sessions: Sessions, *, prompt_ids: Sequence[int]) -> int:
    """Mark prompts as being sent; returns how many changed.

    A succeeded prompt stays succeeded, and a batched one stays batched: its batch holds it
    until the batch's result is written or the prompt is released.
    """
    return await _move(sessions, prompt_ids=prompt_ids, to="in_flight",
                       when=Prompt.status.not_in(("succeeded", "batched")))


async def set_background_id(sessions: Sessions, *, prompt_ids: Sequence[int], background_id: str) -> None:
    """Store the background response created for these prompts (one request), before it is polled."""
    async with sessions.begin() as session:
        await session.execute(update(Prompt).where(Prompt.id.in_(list(prompt_ids))).values(
            background_id=background_id, updated_at=utcnow()))


async def count_background_create(sessions: Sessions, *, prompt_ids: Sequence[int]) -> None:
    """Count one more background create for these prompts (one request), committed before it is sent."""
    async with sessions.begin() as session:
        await session.execute(update(Prompt).where(Prompt.id.in_(list(prompt_ids))).values(
            background_creates=Prompt.background_creates + 1, updated_at=utcnow()))


async def release_in_flight(sessions: Sessions, *, prompt_ids: Sequence[int]) -> int:
    """Put prompts still marked in flight back to pending (never sent); returns how many."""
    return await _move(sessions, prompt_ids=prompt_ids, to="pending", when=Prompt.status == "in_flight")


async def _move(sessions: Sessions, *, prompt_ids: Sequence[int], to: str, when: Any) -> int:
    """Set the status of the prompts with these ids that match ``when`` to ``to``; returns how many changed."""
    changed = 0
    now = utcnow()
    async with sessions.begin() as session:
        for chunk in chunks(prompt_ids, IN_CHUNK):
            stmt = (
                update(Prompt)
                .where(Prompt.id.in_(chunk), when)
                .values(status=to, updated_at=now)
                .execution_options(synchronize_session=False)
            )
            changed += changed_rows(await session.execute(stmt))
    return changed




async def find_reusable(sessions: Sessions, *, dedupe_keys: Collection[str]) -> dict[str, ChatResult]:
    """For each key with a stored success (any job, sent real-time or by batch), the newest one.

    Rows with route ``reused`` are copies of one of those and are not looked at; nor are refusals (status
    ``refused``): an identical prompt is asked again, never given another's refusal.
    """
    found: dict[str, ChatResult] = {}
    # Two index-driven steps, a plan that holds whatever the tables' statistics say: the newest success of each key's
    # prompts (index on dedupe_key, then each prompt's results by prompt_id), then those rows by primary key. A join
    # or an IN (subquery) over results let PostgreSQL, with no statistics yet for a results table filling during
    # the run (autovacuum off, or not yet run), scan every result once per chunk.
    per_prompt = (
        select(func.max(Result.id))
        .where(Result.prompt_id == Prompt.id, Result.status == "succeeded", Result.route.in_(ROUTES))
        .correlate(Prompt)
        .scalar_subquery()
    )
    async with sessions() as session:
        # No result stored at all (a new database, a first job): nothing to reuse, known from one row of the primary key.
        if not dedupe_keys or (await session.execute(select(Result.id).limit(1))).first() is None:
            return found
        dialect = (await session.connection()).dialect
        for chunk in chunks(set(dedupe_keys), IDS_CHUNK):
            newest_of = (
                select(Prompt.dedupe_key, per_prompt.label("result_id"))
                .where(id_in(Prompt.dedupe_key, chunk, dialect)).subquery()
            )
            newest = select(func.max(newest_of.c.result_id)).group_by(newest_of.c.dedupe_key)
            result_ids = [result_id for (result_id,) in await session.execute(newest) if result_id is not None]
            if not result_ids:
                continue
            stmt = (
                select(Prompt.dedupe_key, Result)
                .join(Prompt, Prompt.id == Result.prompt_id)
                .where(id_in(Result.id, result_ids, dialect))
            )
            for key, result in await session.execute(stmt):
                found[key] = ChatResult(
                    text=result.text,
                    finish_reason=result.finish_reason,
                    prompt_tokens=result.prompt_tokens or 0,
                    completion_tokens=result.completion_tokens or 0,
                    cached_tokens=result.cached_tokens or 0,
                    cache_creation_tokens=result.cache_creation_tokens or 0,
                    cache_creation_extended_tokens=result.cache_creation_extended_tokens or 0,
                    reasoning_tokens=result.reasoning_tokens or 0,
                    service_tier=result.service_tier,
                    tool_calls=result.tool_calls,
                    embedding=result.embedding,
                    model=result.response_model,
                    response_id=result.response_id,
                    latency_s=(result.latency_ms or 0.0) / 1000,
                    attempts=result.attempts,
                )
    return found
