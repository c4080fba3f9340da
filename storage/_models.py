"""The schema: jobs, their prompts, one result row per answer or failure, and Batch API batches.

Migrations in ``storage/migrations/versions`` must describe exactly these tables; a test
compares them, so change both together (new tables and columns go in a new migration).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from collections.abc import Callable
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    false as sql_false,
    text as sql_text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# Read by SQLAlchemy when it maps the classes: imported, not only for the type checker.
from llm_dispatch.core import JobStatus, PromptStatus, ResultRoute, ResultStatus, Route

__all__ = ["CHECKED", "PARSED_JSON", "Base", "Batch", "BatchMember", "Budget", "BudgetSpend", "CacheGroup", "Job",
           "LedgerDelta", "Prompt", "Reservation", "Result", "aware", "new_job_id", "utcnow"]

# Stable constraint names, so a later migration can drop or alter them by name on both
# databases (and SQLite batch mode can recreate tables).
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# SQLite only autoincrements an "INTEGER PRIMARY KEY" (the rowid); BIGINT there would need
# explicit ids. PostgreSQL gets BIGSERIAL, since a long-lived database passes 2**31 rows.
BigInt = BigInteger().with_variant(Integer(), "sqlite")


# A structured answer's value: JSONB on PostgreSQL, so SQL can index and query its fields (parsed->>'label').
PARSED_JSON = JSON().with_variant(JSONB(), "postgresql")


# A result checked against its answer schema: the partial index's condition, which a query repeats word for word
# for the database to use it.
CHECKED = "parsed IS NOT NULL OR violation IS NOT NULL"


def utcnow() -> datetime:
    return datetime.now(UTC)


def aware(value: datetime) -> datetime:
    """A stored timestamp as written: SQLite keeps no time zone, and everything is written in UTC."""
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def built_on(dialect: str) -> Callable[[Any, str | None, str, bool, Any], bool]:
    """An Alembic ``include_object`` that leaves out what the models create on other dialects only (an index with
    ``ddl_if(dialect=...)``), so a comparison with a database of ``dialect`` sees what ``create_all`` makes there."""

    def include(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
        condition = getattr(obj, "_ddl_if", None)
        return condition is None or condition.dialect is None or condition.dialect == dialect

    return include


def new_job_id() -> str:
    return str(uuid.uuid4())


class Base(DeclarativeBase):
    # Each model maps one table (DeclarativeBase types it as any FromClause).
    __table__: ClassVar[Table]

    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {
        datetime: DateTime(timezone=True),
        dict[str, Any]: JSON(),
        list[dict[str, Any]]: JSON(),
    }


class Job(Base):
    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_job_id)
    name: Mapped[str] = mapped_column(String())
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    input_path: Mapped[str | None] = mapped_column(String())
    # sha256 of the whole prompt set: running the same input again finds this job.
    fingerprint: Mapped[str] = mapped_column(String(64), index=True)
    model: Mapped[str] = mapped_column(String())
    settings: Mapped[dict[str, Any]] = mapped_column()  # public settings only, never secrets
    status: Mapped[JobStatus] = mapped_column(String(16))
    # The named budget (--budget-name) the job's latest run held; its own (--budget) is the budget "job:<id>".
    budget_name: Mapped[str | None] = mapped_column(String())


# Percent of each prompts page PostgreSQL fills on insert (see Prompt).
PROMPTS_FILLFACTOR = 50


class Prompt(Base):
    __tablename__ = "prompts"
    # job_id has no index of its own: the composite indexes below lead with it. A job's prompts are
    # read a keyset page at a time by input position (planning) and by request (the estimate).
    # PostgreSQL: no index holds a column a prompt's settling changes (status, attempts, errors, updated_at), and each
    # page is kept half free, so a status change is a heap-only (HOT) update: the new row version goes on the old
    # one's page and no index is written (with the status indexed, every change wrote an entry in each index). Half,
    # because a batch changes every prompt of a page in one statement. A job's counts by status read its rows.
    # SQLite rewrites a changed row in place whatever its indexes, and keeps the covering status index.
    __table_args__ = (
        UniqueConstraint("job_id", "custom_id"),
        # Covering for a job's counts by status, and by route and status (``status``): SQLite only.
        Index("ix_prompts_job_id_status_route", "job_id", "status", "planned_route").ddl_if(dialect="sqlite"),
        Index("ix_prompts_job_id_position", "job_id", "position"),
        Index("ix_prompts_job_id_dedupe_key", "job_id", "dedupe_key"),
        # A job's models and endpoints, found by seeking from one pair to the next (``storage.job_models``):
        # never changed by a result, so settling prompts never writes it.
        Index("ix_prompts_job_id_model_endpoint", "job_id", "model", "endpoint"),
        # The prompts that have a deadline, by it: an ingest re-routes the late ones (``reroute_late_prompts``)
        # reading only those, not the job. A deadline never changes as a prompt settles, so updates stay HOT.
        Index("ix_prompts_job_id_deadline", "job_id", "deadline", sqlite_where=sql_text("deadline IS NOT NULL"),
              postgresql_where=sql_text("deadline IS NOT NULL")),
        {"postgresql_with": {"fillfactor": PROMPTS_FILLFACTOR}},
    )

    id: Mapped[int] = mapped_column(BigInt, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"))
    custom_id: Mapped[str] = mapped_column(String())
    position: Mapped[int] = mapped_column(Integer())
    model: Mapped[str] = mapped_column(String())
    # The provider endpoint it goes to (core.ENDPOINTS): chat, responses or embeddings.
    endpoint: Mapped[str] = mapped_column(String(16), server_default="chat")
    # The provider that serves it (core.ProviderTable: a built-in one's name, or a declared one's), fixed when it is
    # recorded, so every result of the prompt is that provider's; NULL (stored before it was kept): the built-in
    # rule's for its model.
    provider: Mapped[str | None] = mapped_column(String(16))
    # The background response created for it (core ChatRequest.background_id): polled by a later run, never
    # created again; NULL when none was.
    background_id: Mapped[str | None] = mapped_column(String())
    # Background creates sent for it, each counted before it is sent: more than the one whose id is stored (if
    # any) were answered, or lost, without their ids being stored, and may be running and billed.
    background_creates: Mapped[int] = mapped_column(Integer(), default=0, server_default=sql_text("0"))
    messages: Mapped[list[dict[str, Any]]] = mapped_column()
    params: Mapped[dict[str, Any]] = mapped_column()
    metadata_: Mapped[dict[str, Any] | None] = mapped_column("metadata")
    dedupe_key: Mapped[str] = mapped_column(String(64), index=True)
    status: Mapped[PromptStatus] = mapped_column(String(16), default="pending", server_default="pending")
    attempts: Mapped[int] = mapped_column(Integer(), default=0, server_default=sql_text("0"))
    last_error_class: Mapped[str | None] = mapped_column(String())
    # Set when the prompt is failed: whether sending it again could succeed (429, 5xx, timeouts).
    failed_retryable: Mapped[bool | None] = mapped_column(Boolean())
    # Where the router sent the prompt (realtime or batch), why, and by when it must be answered.
    planned_route: Mapped[Route | None] = mapped_column(String(16))
    route_reason: Mapped[str | None] = mapped_column(String())
    deadline: Mapped[datetime | None] = mapped_column()
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class Result(Base):
    __tablename__ = "results"
    # A job's results by job_id: ``status`` (its counts, latencies and failures), structured statistics and the cache
    # report read them. A job's paid usage and stored cost (``status``, ``cost``, ``reprice``) are read from its
    # ledger deltas (``LedgerDelta``), not from here; the rows checked against a schema have a partial index.
    __table_args__ = (
        Index("ix_results_job_id", "job_id"),
        Index("ix_results_job_id_checked", "job_id", sqlite_where=sql_text(CHECKED),
              postgresql_where=sql_text(CHECKED)),
    )

    id: Mapped[int] = mapped_column(BigInt, primary_key=True, autoincrement=True)
    prompt_id: Mapped[int] = mapped_column(BigInt, ForeignKey("prompts.id"), index=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    route: Mapped[ResultRoute] = mapped_column(String(16))
    status: Mapped[ResultStatus] = mapped_column(String(16))
    text: Mapped[str | None] = mapped_column(Text())
    finish_reason: Mapped[str | None] = mapped_column(String())
    prompt_tokens: Mapped[int | None] = mapped_column(Integer())
    completion_tokens: Mapped[int | None] = mapped_column(Integer())
    cached_tokens: Mapped[int | None] = mapped_column(Integer())
    # Prompt-cache writes, part of prompt_tokens like cached_tokens; NULL where none were reported.
    cache_creation_tokens: Mapped[int | None] = mapped_column(Integer())
    # Of those, the writes for the longer duration (Anthropic's 1 hour), priced apart; NULL where none.
    cache_creation_extended_tokens: Mapped[int | None] = mapped_column(Integer())
    # Output tokens spent reasoning, part of completion_tokens; NULL where none were reported.
    reasoning_tokens: Mapped[int | None] = mapped_column(Integer())
    # The service tier the answer says served it ("default", "flex", "priority", Anthropic's "standard" or
    # "fast"...): the price follows it; NULL where the answer did not say.
    service_tier: Mapped[str | None] = mapped_column(String(16))
    # The answer's tool calls in OpenAI's assistant-message shape (core.ChatResult.tool_calls); NULL: none.
    tool_calls: Mapped[list[dict[str, Any]] | None] = mapped_column()
    # What the model said when it refused (status "refused"); NULL otherwise.
    refusal: Mapped[str | None] = mapped_column(Text())
    # Attempts of this call the provider may have billed (core.ChatResult.maybe_billed, APIError.maybe_billed): 1
    # for an answer, more when a generation was lost before it; 0 for an error status; NULL before it was kept.
    maybe_billed: Mapped[int | None] = mapped_column(Integer())
    # The start of a 2xx body that was no answer (core.RAW_BODY_CHARS), for inspection; NULL otherwise.
    raw_body: Mapped[str | None] = mapped_column(Text())
    # For a prompt with a schema: the answer's value when it follows it (status succeeded), else the first
    # violation in words (status "invalid"); ``reask``: 0 for the prompt's own request, n for its n-th asking again.
    parsed: Mapped[Any] = mapped_column(PARSED_JSON, nullable=True)
    violation: Mapped[str | None] = mapped_column(Text())
    reask: Mapped[int] = mapped_column(Integer(), default=0, server_default=sql_text("0"))
    # An embeddings answer's vector: float32 little-endian, 4 bytes a dimension; NULL for any other answer.
    embedding: Mapped[bytes | None] = mapped_column(LargeBinary())
    latency_ms: Mapped[float | None] = mapped_column(Float())
    attempts: Mapped[int] = mapped_column(Integer())
    response_model: Mapped[str | None] = mapped_column(String())
    response_id: Mapped[str | None] = mapped_column(String())
    http_status: Mapped[int | None] = mapped_column(Integer())
    error_class: Mapped[str | None] = mapped_column(String())
    error_message: Mapped[str | None] = mapped_column(Text())
    # The cost ledger, written with the row and never changed: what this row cost in picodollars
    # (10**-12 USD, see llm_dispatch.PICO_PER_USD), NULL when its model had no price (unknown, not 0);
    # 0 for a failure or a reused answer.
    cost_pico_usd: Mapped[int | None] = mapped_column(BigInteger())
    # The same usage at the real-time price: the Batch API saved list_cost - cost.
    list_cost_pico_usd: Mapped[int | None] = mapped_column(BigInteger())
    # The fraction taken off the list price, as a decimal ("0.5" on the Batch API, "0" real-time); NULL unpaid.
    discount: Mapped[str | None] = mapped_column(String(16))
    # The price table's date, and the user's price file merged over the bundled table (NULL: bundled only).
    prices_as_of: Mapped[str | None] = mapped_column(String(10))
    prices_file: Mapped[str | None] = mapped_column(String())
    # When the cost was worked out: "answer" (as the row was stored) or "backfill" (migration 0004, from
    # the tokens, with the then bundled prices of ``prices_as_of``); NULL when no price table was given.
    cost_basis: Mapped[str | None] = mapped_column(String(16))


class LedgerDelta(Base):
    """What one write of results added to its job's paid usage, per ledger key (the prompts' model, endpoint and
    provider, the long-prompt split, route, service tier, price stamp): appended in the transaction that inserts those
    results (``storage._ledger``), never updated; a job's rows are folded into one per key by ``compact_ledger``.
    Their sums are what ``usage_by_route`` would sum from the job's results (answers and failures that reported usage,
    none reused), read from a few rows instead of one per result. Append-only, so writers of one job (shards on
    PostgreSQL) never wait on each other's row."""

    __tablename__ = "ledger_deltas"
    __table_args__ = (Index("ix_ledger_deltas_job_id", "job_id"),)

    id: Mapped[int] = mapped_column(BigInt, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"))
    # The prompts' own, as stored with them (``Prompt``).
    model: Mapped[str] = mapped_column(String())
    endpoint: Mapped[str] = mapped_column(String(16))
    provider: Mapped[str | None] = mapped_column(String(16))
    # The prompt tokens the writer's price table prices the model's longer prompts above (NULL: one price at any
    # length, or no table), and whether these requests' prompts were longer.
    long_above: Mapped[int | None] = mapped_column(Integer())
    long_prompt: Mapped[bool] = mapped_column(Boolean())
    route: Mapped[ResultRoute] = mapped_column(String(16))
    service_tier: Mapped[str | None] = mapped_column(String(16))
    prices_as_of: Mapped[str | None] = mapped_column(String(10))
    prices_file: Mapped[str | None] = mapped_column(String())
    cost_basis: Mapped[str | None] = mapped_column(String(16))
    requests: Mapped[int] = mapped_column(BigInteger())
    prompt_tokens: Mapped[int] = mapped_column(BigInteger())
    completion_tokens: Mapped[int] = mapped_column(BigInteger())
    cached_tokens: Mapped[int] = mapped_column(BigInteger())
    cache_creation_tokens: Mapped[int] = mapped_column(BigInteger())
    cache_creation_extended_tokens: Mapped[int] = mapped_column(BigInteger())
    # Over the requests whose cost is known; ``unpriced`` of them had none.
    cost_pico_usd: Mapped[int] = mapped_column(BigInteger())
    list_cost_pico_usd: Mapped[int] = mapped_column(BigInteger())
    unpriced: Mapped[int] = mapped_column(BigInteger())


class Batch(Base):
    """One file of prompts sent to a provider's Batch API; ``id`` is ours, assigned before upload."""

    __tablename__ = "batches"

    id: Mapped[int] = mapped_column(BigInt, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    model: Mapped[str] = mapped_column(String())
    # llm_dispatch.PROVIDERS: whose Batch API holds it (OpenAI's files and batches, or Anthropic's Message Batches).
    provider: Mapped[str] = mapped_column(String(16), default="openai", server_default="openai")
    # The endpoint of all its lines (core.ENDPOINTS): how its output lines are read.
    endpoint: Mapped[str] = mapped_column(String(16), server_default="chat")
    status: Mapped[str] = mapped_column(String(20), index=True)  # a core BatchStatus
    # NULL until the provider creates the batch; unique, so one provider batch is never ingested twice.
    provider_batch_id: Mapped[str | None] = mapped_column(String(), unique=True)
    input_file_id: Mapped[str | None] = mapped_column(String())
    output_file_id: Mapped[str | None] = mapped_column(String())
    error_file_id: Mapped[str | None] = mapped_column(String())
    file_path: Mapped[str | None] = mapped_column(String())
    request_total: Mapped[int] = mapped_column(Integer(), default=0, server_default=sql_text("0"))
    request_completed: Mapped[int] = mapped_column(Integer(), default=0, server_default=sql_text("0"))
    request_failed: Mapped[int] = mapped_column(Integer(), default=0, server_default=sql_text("0"))
    submitted_at: Mapped[datetime | None] = mapped_column()
    expires_at: Mapped[datetime | None] = mapped_column()
    finished_at: Mapped[datetime | None] = mapped_column()
    last_polled_at: Mapped[datetime | None] = mapped_column()
    # Batch-level errors as the provider reported them (say, a file that failed validation).
    errors: Mapped[list[dict[str, Any]] | None] = mapped_column()
    # The batch whose unanswered prompts this one sends again (after it expired, failed...).
    resubmission_of: Mapped[int | None] = mapped_column(BigInt, ForeignKey("batches.id"))
    # Set by `llm-dispatch cancel`: what the batch did not answer is not sent again.
    cancel_requested: Mapped[bool] = mapped_column(Boolean(), default=False, server_default=sql_false())
    # The last error a step met on this batch (poll, ingest, cancel...), when, how many in a row (0 once a step
    # works again), and the time before which a sweep leaves it alone. One batch's trouble stays on its row.
    last_error: Mapped[str | None] = mapped_column(Text())
    last_error_at: Mapped[datetime | None] = mapped_column()
    error_count: Mapped[int] = mapped_column(Integer(), default=0, server_default=sql_text("0"))
    retry_after: Mapped[datetime | None] = mapped_column()
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class BatchMember(Base):
    """Which prompt each line (``custom_id``) of a batch file stands for."""

    __tablename__ = "batch_members"
    # Foreign keys on SQLite only. On PostgreSQL each would cost a trigger per member (a batch has tens of thousands),
    # and their one writer, storage.create_batch_record, checks what they would in the same transaction: the batch
    # is the row it has just inserted, and every prompt is one of the job's that it marks or finds (the statement's
    # row count, else ``UnknownPromptError``). Nothing deletes a prompt or a batch.
    __table_args__ = (
        ForeignKeyConstraint(["batch_id"], ["batches.id"]).ddl_if(dialect="sqlite"),
        ForeignKeyConstraint(["prompt_id"], ["prompts.id"]).ddl_if(dialect="sqlite"),
    )
    batch_id: Mapped[int] = mapped_column(BigInt, primary_key=True)
    prompt_id: Mapped[int] = mapped_column(BigInt, primary_key=True, index=True)
    # The line's custom_id, unique to one line of this batch; identical prompts share one line.
    custom_id: Mapped[str] = mapped_column(String())


class Budget(Base):
    """A spending cap: at most ``limit_pico_usd`` per ``per`` (core.BUDGET_PERIODS), held by every run that names it."""

    __tablename__ = "budgets"

    name: Mapped[str] = mapped_column(String(), primary_key=True)
    limit_pico_usd: Mapped[int] = mapped_column(BigInteger())
    per: Mapped[str] = mapped_column(String(8))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class BudgetSpend(Base):
    """One period of a budget (core.period_key): what was spent (stored costs) and what is reserved for requests
    sent or about to be. The cap's invariant, kept by conditional updates: spent + reserved <= the budget's limit
    at every reservation."""

    __tablename__ = "budget_periods"

    budget: Mapped[str] = mapped_column(ForeignKey("budgets.name"), primary_key=True)
    period: Mapped[str] = mapped_column(String(10), primary_key=True)
    spent_pico_usd: Mapped[int] = mapped_column(BigInteger(), default=0, server_default=sql_text("0"))
    reserved_pico_usd: Mapped[int] = mapped_column(BigInteger(), default=0, server_default=sql_text("0"))
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class Reservation(Base):
    """Money held on a budget's period: a run's lease for its real-time requests (renewed as it spends, given back
    once it expires), or a submitted batch's worst case (held until its answers are ingested or it ends)."""

    __tablename__ = "budget_reservations"
    __table_args__ = (Index("ix_budget_reservations_budget_period", "budget", "period"),)

    id: Mapped[int] = mapped_column(BigInt, primary_key=True, autoincrement=True)
    budget: Mapped[str] = mapped_column(ForeignKey("budgets.name"))
    period: Mapped[str] = mapped_column(String(10))
    job_id: Mapped[str | None] = mapped_column(String(36))
    batch_id: Mapped[int | None] = mapped_column(BigInt, index=True)
    # Who holds it: "host:pid" of a run, for a person reading the table.
    holder: Mapped[str] = mapped_column(String())
    amount_pico_usd: Mapped[int] = mapped_column(BigInteger())
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # A run's lease is given back to the budget after this (its process died); NULL: a batch's, held until it ends.
    expires_at: Mapped[datetime | None] = mapped_column()


class EndpointCapability(Base):
    """What a base URL can do, learnt from its answers (``batch_api`` False: its files or batches route said 404)."""

    __tablename__ = "endpoint_capabilities"
    base_url: Mapped[str] = mapped_column(String(), primary_key=True)
    batch_api: Mapped[bool] = mapped_column(Boolean())
    reason: Mapped[str | None] = mapped_column(Text())
    learnt_at: Mapped[datetime] = mapped_column(default=utcnow)


class CacheGroup(Base):
    """A group of a job's prompts sharing one cached prefix, found when the job was recorded, with the cache plan
    chosen for it then (``core.plan_caches``): what the estimate showed before anything was sent. One row per
    group and half (``lane``: realtime or batch), written once by the recording."""

    __tablename__ = "cache_groups"

    job_id: Mapped[str] = mapped_column(String(36), ForeignKey("jobs.id"), primary_key=True)
    lane: Mapped[str] = mapped_column(String(16), primary_key=True)
    key: Mapped[str] = mapped_column(String(32), primary_key=True)
    provider: Mapped[str] = mapped_column(String())
    model: Mapped[str] = mapped_column(String())
    endpoint: Mapped[str] = mapped_column(String())
    prompts: Mapped[int] = mapped_column(Integer())
    prefix_tokens: Mapped[int] = mapped_column(Integer())
    prefix_messages: Mapped[int] = mapped_column(Integer())
    own_breakpoints: Mapped[bool] = mapped_column(Boolean())
    action: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(Text())
    keys: Mapped[int] = mapped_column(Integer())
    ttl: Mapped[str | None] = mapped_column(String(8))
    # The prefix's money with the plan and uncached, in picodollars; NULL for a model without a price.
    planned_cost_pico_usd: Mapped[int | None] = mapped_column(BigInteger())
    uncached_cost_pico_usd: Mapped[int | None] = mapped_column(BigInteger())


class CachedContentRecord(Base):
    """A job's explicit cache (Gemini's cached content) of one prefix group: recorded before its create (``name``
    NULL until the create answers; its ``display_name`` finds one whose answer was lost), and its cost, the create and
    the storage until ``expire_at``, kept up to date as it is made, kept longer or deleted."""

    __tablename__ = "cached_contents"
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), primary_key=True)
    group_key: Mapped[str] = mapped_column(String(32), primary_key=True)
    provider: Mapped[str] = mapped_column(String(16))
    model: Mapped[str] = mapped_column(String())
    display_name: Mapped[str] = mapped_column(String())
    name: Mapped[str | None] = mapped_column(String())
    tokens: Mapped[int] = mapped_column(Integer(), default=0)
    ttl_s: Mapped[float] = mapped_column(Float())
    created_at: Mapped[datetime | None] = mapped_column()
    expire_at: Mapped[datetime | None] = mapped_column()
    deleted: Mapped[bool] = mapped_column(Boolean(), default=False)
    # Picodollars, this group's caches so far (an earlier run's expired one's ``carried``); NULL when the model had
    # no price (unknown, not 0).
    cost_pico_usd: Mapped[int | None] = mapped_column(BigInteger())
    carried_pico_usd: Mapped[int] = mapped_column(BigInteger(), default=0)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
