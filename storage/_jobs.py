"""A job's row (create, find, resolve a reference, status) and what its prompts and answers came to: counts by
status, the models named, and ``result_stats`` for its summary (prompts: ``storage._prompts``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from sqlalchemy import and_, case, func, insert, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from llm_dispatch.core import JOB_STATUSES, PAID_RESULT_STATUSES, TRUNCATED_FINISH_REASONS, JobStatus, UnknownJobError

from ._bulk import changed_rows
from ._models import Job, Prompt, Result, aware, new_job_id, utcnow
from ._records import JobInfo, ResultStats
from ._engine import Sessions

__all__ = [
    "create_job",
    "find_job",
    "get_job",
    "job_counts",
    "job_model_endpoints",
    "job_models",
    "job_providers",
    "resolve_job",
    "result_stats",
    "set_job_status",
]


async def create_job(
    sessions: Sessions,
    *,
    name: str,
    fingerprint: str,
    input_path: str | None,
    model: str,
    settings: dict[str, Any],
    status: JobStatus = "created",
) -> str:
    """Store a new job and return its id.

    ``status="recording"`` marks a job whose prompts are stored in several transactions (see
    ``add_prompts``): until the last one, a reader knows the job may be missing prompts.
    """
    if status not in JOB_STATUSES:
        raise ValueError(f"unknown job status {status!r}; expected one of {JOB_STATUSES}")
    now = utcnow()
    job_id = new_job_id()
    async with sessions.begin() as session:
        # The columns a job is made with, and no others (the ORM would name every column, later ones NULL): the
        # upgrade tests make jobs in databases still at an old revision.
        await session.execute(insert(Job).values(
            id=job_id, name=name, fingerprint=fingerprint, input_path=input_path, model=model, settings=settings,
            status=status, created_at=now, updated_at=now))
    return job_id


async def find_job(sessions: Sessions, *, fingerprint: str, name: str | None = None) -> str | None:
    """The newest job made from the same prompt set (and carrying ``name``, when given), if any."""
    async with sessions() as session:
        stmt = select(Job.id).where(Job.fingerprint == fingerprint)
        if name is not None:
            stmt = stmt.where(Job.name == name)
        stmt = stmt.order_by(Job.created_at.desc()).limit(1)
        return (await session.execute(stmt)).scalar_one_or_none()


# A job id may be given by its first characters, as git takes a commit's; fewer than this match too much.
MIN_ID_PREFIX = 4
# Jobs named in the line that says a reference is ambiguous.
AMBIGUOUS_SHOWN = 5


async def resolve_job(sessions: Sessions, *, reference: str) -> str:
    """The id of the job ``reference`` names: its whole id, its name (when one job has it) or the first
    characters of its id (at least ``MIN_ID_PREFIX``, when one job's id starts so); ``UnknownJobError``
    saying which jobs match, when none or several do."""
    reference = reference.strip()
    async with sessions() as session:
        if reference and await session.get(Job, reference) is not None:
            return reference
        ways = [(Job.name == reference, "several jobs are called that")]
        if len(reference) >= MIN_ID_PREFIX:
            ways.append((Job.id.startswith(reference, autoescape=True), "several job ids start with it"))
        for clause, what in ways:
            stmt = select(Job.id, Job.name).where(clause).order_by(Job.created_at.desc()).limit(AMBIGUOUS_SHOWN + 1)
            found = (await session.execute(stmt)).all()
            if len(found) == 1:
                return str(found[0][0])
            if found:
                shown = ", ".join(f"{job_id[:8]} ({name})" for job_id, name in found[:AMBIGUOUS_SHOWN])
                more = " and more" if len(found) > AMBIGUOUS_SHOWN else ""
                raise UnknownJobError(f"job {reference!r} is ambiguous: {what}: {shown}{more}; "
                                      "give more of the id (`llm-dispatch status` lists jobs)")
    short = "" if len(reference) >= MIN_ID_PREFIX else f" (an id prefix needs at least {MIN_ID_PREFIX} characters)"
    raise UnknownJobError(f"no job {reference!r}{short}; `llm-dispatch status` lists jobs")


# JobInfo's fields read from the jobs row as they are (the timestamps are made timezone-aware).
_JOB_COLUMNS = ("id", "name", "status", "model", "input_path", "fingerprint", "settings")


async def get_job(sessions: Sessions, *, job_id: str, counts: bool = True) -> JobInfo | None:
    """The job, with its prompts by status; ``counts=False``: with none (``counts`` empty), for a caller that counts
    them another way (a pass over the prompts of a job of millions is not free)."""
    async with sessions() as session:
        job = await session.get(Job, job_id)
        if job is None:
            return None
        by_status = await _prompt_counts(session, job_id=job_id) if counts else {}
    columns = {name: getattr(job, name) for name in _JOB_COLUMNS}
    return JobInfo(**columns, created_at=aware(job.created_at), updated_at=aware(job.updated_at), counts=by_status)


async def set_job_status(sessions: Sessions, *, job_id: str, status: JobStatus) -> None:
    if status not in JOB_STATUSES:
        raise ValueError(f"unknown job status {status!r}; expected one of {JOB_STATUSES}")
    async with sessions.begin() as session:
        done = await session.execute(update(Job).where(Job.id == job_id).values(status=status, updated_at=utcnow()))
        if changed_rows(done) == 0:
            raise UnknownJobError(f"no job with id {job_id!r}; `llm-dispatch status` lists jobs")


async def job_counts(sessions: Sessions, *, job_id: str) -> dict[str, int]:
    """Prompts of a job by status; statuses no prompt has are left out (use ``.get(s, 0)``)."""
    async with sessions() as session:
        return await _prompt_counts(session, job_id=job_id)


async def job_models(sessions: Sessions, *, job_id: str) -> list[str]:
    """The models a job's prompts name, each once."""
    return sorted({model for model, _ in await job_model_endpoints(sessions, job_id=job_id)})


async def job_model_endpoints(sessions: Sessions, *, job_id: str) -> list[tuple[str, str]]:
    """The (model, endpoint) pairs a job's prompts name, each once, in order: each pair one seek on the index
    (job_id, model, endpoint) past the one before, so a job of millions of prompts costs a query per pair."""
    pairs: list[tuple[str, str]] = []
    base = (select(Prompt.model, Prompt.endpoint).where(Prompt.job_id == job_id)
            .order_by(Prompt.model, Prompt.endpoint).limit(1))
    async with sessions() as session:
        connection = await session.connection()
        row = (await connection.execute(base)).first()
        while row is not None:
            model, endpoint = row
            pairs.append((model, endpoint))
            # The model's next endpoint, else the next model: two range seeks (a row-value comparison is not one).
            row = (await connection.execute(base.where(Prompt.model == model, Prompt.endpoint > endpoint))).first()
            if row is None:
                row = (await connection.execute(base.where(Prompt.model > model))).first()
    return pairs


async def job_providers(sessions: Sessions, *, job_id: str) -> dict[str, str | None]:
    """Each model a job's prompts name, with the provider they were recorded for (None: stored before providers
    were kept, the built-in rule's)."""
    async with sessions() as session:
        found = await session.execute(select(Prompt.model, Prompt.provider).where(Prompt.job_id == job_id).distinct())
        return dict(sorted((model, provider) for model, provider in found))


async def _prompt_counts(session: AsyncSession, *, job_id: str) -> dict[str, int]:
    stmt = select(Prompt.status, func.count()).where(Prompt.job_id == job_id).group_by(Prompt.status)
    return {status: count for status, count in await session.execute(stmt)}



async def result_stats(sessions: Sessions, *, job_id: str) -> ResultStats:
    """Outcome of a job for the CLI summary; see ``ResultStats`` for what is counted."""
    async with sessions() as session:
        counts = await _prompt_counts(session, job_id=job_id)
        by_class = {
            error_class or "unknown": count
            for error_class, count in await session.execute(
                select(Prompt.last_error_class, func.count())
                .where(Prompt.job_id == job_id, Prompt.status == "failed")
                .group_by(Prompt.last_error_class)
            )
        }
        succeeded = Result.status == "succeeded"
        answered = Result.status.in_(PAID_RESULT_STATUSES)
        # Answers, and failures that reported what they used (a 2xx with no usable answer), paid once each.
        paid = and_(or_(answered, Result.prompt_tokens.is_not(None)), Result.route != "reused")
        timed = and_(succeeded, Result.route == "realtime", Result.latency_ms.is_not(None))
        # One pass over the job's results for the sums and counts (each a query of its own cost as much again).
        tokens = (
            await session.execute(
                select(
                    func.coalesce(func.sum(case((paid, Result.prompt_tokens))), 0),
                    func.coalesce(func.sum(case((paid, Result.completion_tokens))), 0),
                    func.coalesce(func.sum(case((paid, Result.cached_tokens))), 0),
                    func.count(case((and_(succeeded, Result.route == "reused"), 1))),
                    func.count(case((timed, 1))),
                    func.coalesce(func.sum(case((paid, Result.reasoning_tokens))), 0),
                    func.count(case((and_(answered, Result.finish_reason.in_(TRUNCATED_FINISH_REASONS)), 1))),
                    func.count(case((and_(answered, Result.tool_calls.is_not(None)), 1))),
                    # Attempts that may have been billed beyond the answers kept: lost generations, 2xx non-answers.
                    func.coalesce(func.sum(case((Result.route != "reused", Result.maybe_billed - case(
                        (answered, 1), else_=0)))), 0),
                ).where(Result.job_id == job_id)
            )
        ).one()
        # What the user is told of each kind of failure: its newest stored message (what to do included).
        newest = (select(func.max(Result.id)).where(Result.job_id == job_id, Result.status == "failed")
                  .group_by(Result.error_class).scalar_subquery())
        told = {error_class or "unknown": message or "" for error_class, message in await session.execute(
            select(Result.error_class, Result.error_message).where(Result.id.in_(newest)))}
        reused, n_timed = int(tokens[3]), int(tokens[4])
        p50, p95 = await _percentiles(session, where=and_(Result.job_id == job_id, timed), n=n_timed, fractions=(0.50, 0.95))
    return ResultStats(
        succeeded=counts.get("succeeded", 0),
        failed=counts.get("failed", 0),
        reused=reused,
        failed_by_class=dict(sorted(by_class.items(), key=lambda item: -item[1])),
        failure_messages={name: told[name] for name in by_class if name in told},
        p50_latency_ms=p50,
        p95_latency_ms=p95,
        prompt_tokens=int(tokens[0]),
        completion_tokens=int(tokens[1]),
        cached_tokens=int(tokens[2]),
        refused=counts.get("refused", 0),
        truncated=int(tokens[6]),
        tool_calls=int(tokens[7]),
        reasoning_tokens=int(tokens[5]),
        billed_unanswered=int(tokens[8]),
    )


async def _percentiles(session: AsyncSession, *, where: Any, n: int, fractions: Sequence[float]) -> list[float | None]:
    """Nearest-rank percentiles of the latency of the ``n`` results matching ``where``.

    Picked by the database in one sort (a window function, on SQLite and PostgreSQL alike), so a
    million-row job is not shipped to Python.
    """
    if n == 0:
        return [None for _ in fractions]
    ranks = [max(1, math.ceil(fraction * n)) for fraction in fractions]
    ranked = select(
        Result.latency_ms.label("latency_ms"), func.row_number().over(order_by=Result.latency_ms).label("rank")
    ).where(where).subquery()
    stmt = select(ranked.c.rank, ranked.c.latency_ms).where(ranked.c.rank.in_(sorted(set(ranks))))
    at = {rank: value for rank, value in await session.execute(stmt)}
    return [at.get(rank) for rank in ranks]
