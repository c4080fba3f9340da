"""Every query llm-dispatch runs: jobs, prompts, reuse of stored answers, and the numbers for reports."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from llm_dispatch._types import ChatResult

from ._models import Job, Prompt, Result, utcnow
from ._status import JobStatus, RetryFailed

__all__ = [
    "JobInfo",
    "NewPrompt",
    "ResultStats",
    "WorkRow",
    "add_prompts",
    "create_job",
    "find_job",
    "find_reusable",
    "get_job",
    "job_counts",
    "load_work",
    "mark_in_flight",
    "open_prompt_ids",
    "result_stats",
    "set_job_status",
]

Sessions = async_sessionmaker[AsyncSession]
# SQLite allows 32,766 bound parameters per statement; stay far below it, and keep IN lists short.
IN_CHUNK = 900
INSERT_CHUNK = 1_000


@dataclass(frozen=True, slots=True)
class NewPrompt:
    custom_id: str
    position: int
    model: str
    messages: list[dict[str, Any]]
    params: dict[str, Any]
    metadata: dict[str, Any] | None
    dedupe_key: str


@dataclass(frozen=True, slots=True)
class WorkRow:
    """What it takes to send one prompt."""

    id: int
    custom_id: str
    model: str
    messages: list[dict[str, Any]]
    params: dict[str, Any]
    dedupe_key: str


@dataclass(frozen=True, slots=True)
class JobInfo:
    id: str
    name: str
    created_at: datetime
    status: str
    model: str
    input_path: str | None
    counts: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ResultStats:
    """Figures over a job's results (latency over real-time successes only)."""

    succeeded: int = 0
    failed: int = 0
    failed_by_class: dict[str, int] = field(default_factory=dict)
    p50_latency_ms: float | None = None
    p95_latency_ms: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "succeeded": self.succeeded,
            "failed": self.failed,
            "failed_by_class": dict(self.failed_by_class),
            "p50_latency_ms": self.p50_latency_ms,
            "p95_latency_ms": self.p95_latency_ms,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
        }


def _chunks(items: Sequence[Any], size: int = IN_CHUNK) -> Iterable[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


async def create_job(
    sessions: Sessions, *, name: str, fingerprint: str, input_path: str | None, model: str, settings: dict[str, Any]
) -> str:
    async with sessions.begin() as session:
        job = Job(name=name, fingerprint=fingerprint, input_path=input_path, model=model, settings=settings, status="created")
        session.add(job)
        await session.flush()
        return job.id


async def find_job(sessions: Sessions, *, fingerprint: str) -> str | None:
    """The newest job recorded from exactly this prompt set."""
    async with sessions() as session:
        return await session.scalar(
            select(Job.id).where(Job.fingerprint == fingerprint).order_by(Job.created_at.desc()).limit(1)
        )


async def get_job(sessions: Sessions, *, job_id: str) -> JobInfo | None:
    async with sessions() as session:
        job = await session.get(Job, job_id)
        if job is None:
            return None
        counts = await _counts(session, job_id)
        return JobInfo(id=job.id, name=job.name, created_at=job.created_at, status=job.status, model=job.model,
                       input_path=job.input_path, counts=counts)


async def set_job_status(sessions: Sessions, *, job_id: str, status: JobStatus) -> None:
    async with sessions.begin() as session:
        await session.execute(update(Job).where(Job.id == job_id).values(status=status, updated_at=utcnow()))


async def add_prompts(sessions: Sessions, *, job_id: str, prompts: Iterable[NewPrompt]) -> int:
    """Insert the prompts of a job in one transaction, a thousand rows per statement."""
    total = 0
    now = utcnow()
    async with sessions.begin() as session:
        batch: list[dict[str, Any]] = []
        for prompt in prompts:
            batch.append({
                "job_id": job_id, "custom_id": prompt.custom_id, "position": prompt.position, "model": prompt.model,
                "messages": prompt.messages, "params": prompt.params, "metadata_": prompt.metadata,
                "dedupe_key": prompt.dedupe_key, "status": "pending", "attempts": 0,
                "created_at": now, "updated_at": now,
            })
            if len(batch) >= INSERT_CHUNK:
                await session.execute(insert(Prompt), batch)
                total += len(batch)
                batch = []
        if batch:
            await session.execute(insert(Prompt), batch)
            total += len(batch)
    return total


async def open_prompt_ids(sessions: Sessions, *, job_id: str, retry_failed: RetryFailed = "retryable") -> list[int]:
    """Prompts without a final result, in input order: pending, in flight when a process died, and
    failed ones as ``retry_failed`` says. A succeeded prompt is never among them."""
    condition = Prompt.status.in_(("pending", "in_flight"))
    if retry_failed == "all":
        condition = condition | (Prompt.status == "failed")
    elif retry_failed == "retryable":
        condition = condition | ((Prompt.status == "failed") & Prompt.failed_retryable.is_(True))
    async with sessions() as session:
        rows = await session.scalars(select(Prompt.id).where(Prompt.job_id == job_id, condition).order_by(Prompt.position))
        return list(rows)


async def load_work(sessions: Sessions, *, prompt_ids: Sequence[int]) -> list[WorkRow]:
    """The prompts to send, in input order."""
    found: list[tuple[int, WorkRow]] = []
    async with sessions() as session:
        for part in _chunks(prompt_ids):
            result = await session.execute(
                select(Prompt.id, Prompt.custom_id, Prompt.model, Prompt.messages, Prompt.params, Prompt.dedupe_key,
                       Prompt.position).where(Prompt.id.in_(part))
            )
            found.extend((row.position, WorkRow(id=row.id, custom_id=row.custom_id, model=row.model,
                                                messages=row.messages, params=row.params, dedupe_key=row.dedupe_key))
                         for row in result)
    found.sort(key=lambda pair: pair[0])
    return [row for _, row in found]


async def mark_in_flight(sessions: Sessions, *, prompt_ids: Sequence[int]) -> None:
    async with sessions.begin() as session:
        now = utcnow()
        for part in _chunks(prompt_ids):
            await session.execute(
                update(Prompt).where(Prompt.id.in_(part), Prompt.status != "succeeded").values(status="in_flight", updated_at=now)
            )


async def find_reusable(sessions: Sessions, *, dedupe_keys: Collection[str]) -> dict[str, ChatResult]:
    """For each key, a stored success of an identical request (any job) that can answer it for free."""
    keys = list(dedupe_keys)
    found: dict[str, ChatResult] = {}
    async with sessions() as session:
        for part in _chunks(keys):
            result = await session.execute(
                select(Prompt.dedupe_key, Result)
                .join(Result, Result.prompt_id == Prompt.id)
                .where(Prompt.dedupe_key.in_(part), Result.status == "succeeded", Result.route.in_(("realtime", "batch")))
                .order_by(Result.id)
            )
            for key, row in result:
                found.setdefault(key, ChatResult(
                    text=row.text, finish_reason=row.finish_reason, prompt_tokens=row.prompt_tokens or 0,
                    completion_tokens=row.completion_tokens or 0, cached_tokens=row.cached_tokens or 0,
                    model=row.response_model, response_id=row.response_id, latency_s=0.0, attempts=0,
                ))
    return found


async def _counts(session: AsyncSession, job_id: str) -> dict[str, int]:
    rows = await session.execute(select(Prompt.status, func.count()).where(Prompt.job_id == job_id).group_by(Prompt.status))
    return {status: count for status, count in rows}


async def job_counts(sessions: Sessions, *, job_id: str) -> dict[str, int]:
    """Prompts of a job by status."""
    async with sessions() as session:
        return await _counts(session, job_id)


async def result_stats(sessions: Sessions, *, job_id: str) -> ResultStats:
    """Final outcomes of a job's prompts: the success of a prompt, or its latest failure if it has none."""
    async with sessions() as session:
        succeeded = (await session.execute(
            select(Result.route, Result.latency_ms, Result.prompt_tokens, Result.completion_tokens, Result.cached_tokens)
            .where(Result.job_id == job_id, Result.status == "succeeded")
        )).all()
        failed_classes = (await session.execute(
            select(Prompt.last_error_class, func.count()).where(Prompt.job_id == job_id, Prompt.status == "failed")
            .group_by(Prompt.last_error_class)
        )).all()
    latencies = sorted(row.latency_ms for row in succeeded if row.route == "realtime" and row.latency_ms is not None)
    paid = [row for row in succeeded if row.route != "reused"]
    by_class = Counter({name or "unknown": count for name, count in failed_classes})
    return ResultStats(
        succeeded=len(succeeded),
        failed=sum(by_class.values()),
        failed_by_class=dict(by_class),
        p50_latency_ms=_percentile(latencies, 50),
        p95_latency_ms=_percentile(latencies, 95),
        prompt_tokens=sum(row.prompt_tokens or 0 for row in paid),
        completion_tokens=sum(row.completion_tokens or 0 for row in paid),
        cached_tokens=sum(row.cached_tokens or 0 for row in paid),
    )


def _percentile(values: Sequence[float], pct: int) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[pct - 1]
