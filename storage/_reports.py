"""Read-only queries for reports: counts per route and status, job lists, and results joined to their inputs
for export (a job's usage per route and model: ``storage._usage``). The small query API for programmatic use."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncGenerator, AsyncIterator, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any, ClassVar, Unpack

from sqlalchemy import Integer, Text, and_, case, cast, func, literal, null, or_, select, text, type_coerce
from sqlalchemy.engine import Row
from sqlalchemy.sql.elements import TypeCoerce
from sqlalchemy.orm import InstrumentedAttribute, aliased

from llm_dispatch.core import (
    CLOSED_BATCH_STATUSES,
    PAID_RESULT_STATUSES,
    JobStatus,
    PromptStatus,
    ResultRoute,
    Route,
    from_pico,
    json_texts,
)

from ._models import CHECKED, Batch, Job, Prompt, Result, aware
from ._engine import Sessions

__all__ = [
    "EXPORT_ROW_FIELDS",
    "ExportRow",
    "ExportShape",
    "JobSummary",
    "ReplyLengths",
    "StructuredStats",
    "export_pages",
    "export_rows",
    "export_shape",
    "list_jobs",
    "reply_lengths",
    "route_counts",
    "structured_stats",
]

EXPORT_PAGE = 5000


@dataclass(frozen=True, slots=True)
class JobSummary:
    id: str
    name: str
    created_at: datetime
    status: JobStatus
    prompts: int
    unfinished_batches: int


# Not frozen: a frozen dataclass sets each field through object.__setattr__, and an export makes one per prompt.
@dataclass(slots=True)
class ExportRow:
    """One prompt in input order with its latest outcome."""

    position: int
    custom_id: str
    prompt_id: int
    model: str
    metadata: dict[str, Any] | None
    status: PromptStatus
    planned_route: Route | None
    route_reason: str | None
    route: ResultRoute | None  # how the answer came
    text: str | None
    finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    cached_tokens: int | None
    latency_ms: float | None
    error_class: str | None
    error_message: str | None
    # As stored with the result (see ``Result``): None with no result yet, or a cost unknown.
    cost_pico_usd: int | None = None
    cache_creation_tokens: int | None = None
    cache_creation_extended_tokens: int | None = None
    reasoning_tokens: int | None = None
    service_tier: str | None = None
    discount: str | None = None
    prices_as_of: str | None = None
    cost_basis: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    refusal: str | None = None
    maybe_billed: int | None = None
    raw_body: str | None = None
    # The conversation as sent (a prompt given as ``prompt`` is one user message).
    messages: list[dict[str, Any]] | None = None
    # A structured answer's value, or its first violation; which asking of the prompt the result answers.
    parsed: Any = None
    violation: str | None = None
    reask: int | None = None
    # What all of the prompt's results cost together (its answer, its re-asks, paid failures); None: none priced.
    prompt_cost_pico_usd: int | None = None
    # An embeddings answer's vector as stored: float32 little-endian bytes.
    embedding: bytes | None = None


@dataclass(frozen=True, slots=True)
class ExportShape:
    """What an export's columns depend on: the metadata keys of a job's prompts (in the order first met in input
    order), and whether any prompt is a conversation (more than one message) rather than one question."""

    metadata_keys: list[str]
    conversations: bool
    # The properties of the prompts' answer schemas, in order (name -> its schema), the first schema's first.
    schema_properties: dict[str, Any] = field(default_factory=dict)
    # Whether any prompt went to the embeddings endpoint (its vectors are a default column then).
    embeddings: bool = False


@dataclass(frozen=True, slots=True)
class ReplyLengths:
    """What one model's recent replies were like: how many, their tokens, how many were cut at their cap."""

    replies: int
    tokens: int
    cut: int

    @property
    def typical(self) -> float:
        """The mean reply length before any cap: replies cut at ``max_tokens`` would have run longer.

        The maximum-likelihood mean of exponentially distributed lengths, right-censored at the cap:
        all the tokens seen, over the replies that ended on their own.
        """
        return self.tokens / max(self.replies - self.cut, 1)


# A reply stopped by its cap: OpenAI's finish_reason "length", Anthropic's stop_reason "max_tokens".
CUT_FINISH_REASONS = ("length", "max_tokens")


async def reply_lengths(sessions: Sessions, *, models: list[str], sample: int = 5000) -> dict[str, ReplyLengths]:
    """Per model, its most recent answered requests (up to ``sample``): what replies from it have been like."""
    lengths: dict[str, ReplyLengths] = {}
    async with sessions() as session:
        for model in models:
            recent = (
                select(Result.completion_tokens.label("tokens"), Result.finish_reason.label("finish"))
                .join(Prompt, Prompt.id == Result.prompt_id)
                .where(Prompt.model == model, Result.status == "succeeded", Result.route != "reused",
                       Result.completion_tokens.is_not(None))
                .order_by(Result.id.desc())
                .limit(sample)
                .subquery()
            )
            cut = func.sum(case((recent.c.finish.in_(CUT_FINISH_REASONS), 1), else_=0))
            n, total, n_cut = (await session.execute(
                select(func.count(), func.coalesce(func.sum(recent.c.tokens), 0), func.coalesce(cut, 0)))).one()
            if n:
                lengths[model] = ReplyLengths(replies=int(n), tokens=int(total), cut=int(n_cut))
    return lengths


@dataclass(frozen=True, slots=True)
class StructuredStats:
    """A job's answers checked against their schemas, in prompts: valid at the first answer, valid only after being
    asked again, and still invalid once the re-asks were spent; the re-asks paid for (requests: identical prompts
    share one) and what they cost (picodollars, as stored; None when none was priced)."""

    json_properties: ClassVar = ("reask_cost",)

    prompts: int = 0
    valid_first: int = 0
    valid_after_reasks: int = 0
    still_invalid: int = 0
    reasks: int = 0
    reask_cost_pico_usd: int | None = None

    @property
    def reask_cost(self) -> Decimal | None:
        """What the re-asks cost, in dollars."""
        return None if self.reask_cost_pico_usd is None else from_pico(self.reask_cost_pico_usd)


async def structured_stats(sessions: Sessions, *, job_id: str) -> StructuredStats | None:
    """How the job's structured answers came out (``StructuredStats``); None when no prompt of it has a schema."""
    checked = or_(Result.parsed.isnot(None), Result.violation.isnot(None))
    # Whether any of the job's results was checked at all, from the partial index of those (its condition as written).
    any_checked = select(Result.id).where(Result.job_id == job_id, text(f"({CHECKED})")).limit(1)
    again = Result.reask > 0
    stmt = select(
        func.count(func.distinct(case((checked, Result.prompt_id)))),
        func.count(func.distinct(case((and_(Result.reask == 0, Result.status == "succeeded", checked),
                                         Result.prompt_id)))),
        func.count(func.distinct(case((and_(again, Result.status == "succeeded"), Result.prompt_id)))),
        func.sum(case((and_(again, Result.route != "reused"), 1), else_=0)),
        func.sum(case((again, Result.cost_pico_usd))),
    ).where(Result.job_id == job_id)
    invalid = select(func.count()).where(Prompt.job_id == job_id, Prompt.status == "invalid")
    async with sessions() as session:
        if (await session.execute(any_checked)).first() is None:
            return None
        prompts, first, after, reasks, cost = (await session.execute(stmt)).one()
        if not prompts:
            return None
        still = (await session.execute(invalid)).scalar_one()
    return StructuredStats(prompts=int(prompts), valid_first=int(first), valid_after_reasks=int(after),
                           still_invalid=int(still), reasks=int(reasks or 0),
                           reask_cost_pico_usd=None if cost is None else int(cost))


async def route_counts(sessions: Sessions, *, job_id: str) -> dict[str, dict[str, int]]:
    """Prompts per planned route (``realtime``/``batch``; unrouted ones count as real-time) and status."""
    # Grouped by the columns themselves, which the covering index (job_id, status, planned_route) gives in order;
    # a GROUP BY expression would sort every prompt of the job first.
    stmt = (select(Prompt.planned_route, Prompt.status, func.count()).where(Prompt.job_id == job_id)
            .group_by(Prompt.status, Prompt.planned_route))
    counts: dict[str, dict[str, int]] = {}
    async with sessions() as session:
        for route, status, n in await session.execute(stmt):
            by_status = counts.setdefault(route or "realtime", {})
            by_status[status] = by_status.get(status, 0) + int(n)
    return counts


async def list_jobs(sessions: Sessions, *, limit: int = 20) -> list[JobSummary]:
    """The newest jobs first, with their prompt counts and open batches."""
    prompts = select(Prompt.job_id, func.count().label("n")).group_by(Prompt.job_id).subquery()
    batches = (
        select(Batch.job_id, func.count().label("n")).where(Batch.status.not_in(CLOSED_BATCH_STATUSES)).group_by(Batch.job_id).subquery()
    )
    stmt = (
        select(Job.id, Job.name, Job.created_at, Job.status, func.coalesce(prompts.c.n, 0), func.coalesce(batches.c.n, 0))
        .outerjoin(prompts, prompts.c.job_id == Job.id)
        .outerjoin(batches, batches.c.job_id == Job.id)
        .order_by(Job.created_at.desc())
        .limit(limit)
    )
    async with sessions() as session:
        return [JobSummary(id_, name, aware(created), status, int(n), int(b))
                for id_, name, created, status, n, b in await session.execute(stmt)]


# What an export row takes from the prompt's newest result, column for column (None while it has none).
_EXPORTED_RESULT_FIELDS = ("route", "text", "finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens",
                           "cache_creation_tokens", "cache_creation_extended_tokens", "reasoning_tokens",
                           "service_tier", "latency_ms", "error_class", "error_message", "cost_pico_usd",
                           "discount", "prices_as_of", "cost_basis", "tool_calls", "refusal", "maybe_billed",
                           "raw_body", "parsed", "violation", "reask", "embedding")


# What an export reads of a prompt, under ExportRow's names: columns, not ORM objects (no identity map, no
# columns nobody writes out: a page of plain rows).
_EXPORTED_PROMPT_COLUMNS = {
    "position": Prompt.position, "custom_id": Prompt.custom_id, "prompt_id": Prompt.id, "model": Prompt.model,
    "metadata": Prompt.metadata_, "status": Prompt.status, "planned_route": Prompt.planned_route,
    "route_reason": Prompt.route_reason, "messages": Prompt.messages,
}
# ExportRow's fields in order: the columns of each row ``export_pages`` yields.
EXPORT_ROW_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(ExportRow))


async def export_rows(sessions: Sessions, *, job_id: str,
                      fields: Collection[str] | None = None) -> AsyncIterator[ExportRow]:
    """Every prompt of the job in input order, with its latest result (or none yet), a page at a time. A re-ask whose
    call failed is not its outcome (the invalid answer before it stays that), only part of its cost. ``fields``: the
    ``ExportRow`` fields to read (the others are None); default all of them."""
    pages = export_pages(sessions, job_id=job_id, fields=fields)
    try:
        async for page in pages:
            for values in zip(*page):
                yield ExportRow(*values)
    finally:  # the consumer stopped early (or failed): the page being read is not wanted
        await pages.aclose()


# Fields stored as JSON: read as their text and decoded a column at a time (``json.loads`` of each value).
_JSON_FIELDS = frozenset({"metadata", "messages", "tool_calls", "parsed"})


async def export_pages(sessions: Sessions, *, job_id: str, fields: Collection[str] | None = None,
                       size: int | None = None) -> AsyncGenerator[Sequence[Sequence[Any]], None]:
    """``export_rows``' prompts a page of up to ``size`` at a time, as columns: one sequence per ``ExportRow`` field in
    their order (``EXPORT_ROW_FIELDS``; a field not among ``fields`` all None), what a writer of whole columns reads.
    Only the fields asked for are selected; ``size`` defaults to ``EXPORT_PAGE``."""
    size = size or EXPORT_PAGE
    wanted = set(EXPORT_ROW_FIELDS if fields is None else fields) | {"position"}  # position: where a page ends
    unknown = wanted.difference(EXPORT_ROW_FIELDS)
    if unknown:
        raise ValueError(f"ExportRow has no field {', '.join(sorted(unknown))}")
    # Each prompt's latest result by the index on results.prompt_id, a lookup per row of the page: a page costs
    # its own rows, never the whole job's results again.
    earlier = aliased(Result)
    outcome = or_(earlier.reask == 0, earlier.status != "failed")
    latest = (select(func.max(earlier.id)).where(earlier.prompt_id == Prompt.id, outcome).correlate(Prompt)
              .scalar_subquery())
    every = aliased(Result)
    paid = (select(func.sum(every.cost_pico_usd)).where(every.prompt_id == Prompt.id).correlate(Prompt)
            .scalar_subquery())
    read = {**_EXPORTED_PROMPT_COLUMNS, **{name: getattr(Result, name) for name in _EXPORTED_RESULT_FIELDS},
            "prompt_cost_pico_usd": paid}
    names = [name for name in EXPORT_ROW_FIELDS if name in wanted]
    # JSON as its text on both databases (asyncpg would decode a json column itself): one decoder, a column at a time.
    query = select(*((cast(read[name], Text) if name in _JSON_FIELDS else read[name]).label(name) for name in names))
    if wanted.intersection(_EXPORTED_RESULT_FIELDS):
        query = query.outerjoin(Result, Result.id == latest)
    at = names.index("position")

    async def page_after(position: int) -> Sequence[Row[Unpack[tuple[Any, ...]]]]:
        stmt = (query.where(Prompt.job_id == job_id, Prompt.position > position)
                .order_by(Prompt.position).limit(size))
        async with sessions() as session:
            # On the connection: plain rows, without the ORM's loading machinery.
            return (await (await session.connection()).execute(stmt)).all()

    def columns(rows: Sequence[Row[Unpack[tuple[Any, ...]]]]) -> list[Sequence[Any]]:
        got = dict(zip(names, zip(*rows)))
        nothing = (None,) * len(rows)
        return [nothing if name not in got else
                json_texts(got[name]) if name in _JSON_FIELDS else got[name]
                for name in EXPORT_ROW_FIELDS]

    page = await page_after(-1)
    while page:
        # The next page is read (by the driver's thread, or the server) while this one is consumed.
        following = asyncio.ensure_future(page_after(page[-1][at]))
        try:
            yield columns(page)
        except BaseException:  # the consumer stopped early (or failed): the next page is not wanted
            following.cancel()
            raise
        page = await following


async def export_shape(sessions: Sessions, *, job_id: str) -> ExportShape:
    """The job's ``ExportShape``: its prompts' metadata read as a stream in input order (only that column), and
    one count of conversations."""
    from llm_dispatch.core import answer_schema  # the wire's schema rules: an export's, not status's

    keys: dict[str, None] = {}
    # Prompts with metadata only: none stored is JSON null, not SQL NULL.
    stmt = (select(Prompt.metadata_).where(Prompt.job_id == job_id, Prompt.metadata_.is_not(None),
                                           cast(Prompt.metadata_, Text) != "null")
            .order_by(Prompt.position).execution_options(yield_per=EXPORT_PAGE))
    # json_array_length reads a JSON array on SQLite (JSON1) and PostgreSQL (json) alike.
    multi = select(func.count()).where(Prompt.job_id == job_id, func.json_array_length(Prompt.messages) > 1)
    embedded = select(Prompt.id).where(Prompt.job_id == job_id, Prompt.endpoint == "embeddings").limit(1)
    # A job's prompts mostly share their parameters: their distinct texts are few, whatever the job's size.
    params = (select(cast(Prompt.params, Text)).where(Prompt.job_id == job_id).distinct()
              .execution_options(yield_per=EXPORT_PAGE))
    properties: dict[str, Any] = {}
    async with sessions() as session:
        async for page in (await session.stream_scalars(stmt)).partitions():
            for metadata in page:
                if isinstance(metadata, dict):
                    keys.update(dict.fromkeys(metadata))
        conversations = bool((await session.execute(multi)).scalar_one())
        embeddings = (await session.execute(embedded)).first() is not None
        async for page in (await session.stream_scalars(params)).partitions():
            for text in page:
                schema = answer_schema(json.loads(text) if text else {})
                if schema is not None and isinstance(schema.get("properties"), dict):
                    for name, spec in schema["properties"].items():
                        properties.setdefault(name, spec)
    return ExportShape(metadata_keys=list(keys), conversations=conversations, schema_properties=properties,
                       embeddings=embeddings)
