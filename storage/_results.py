"""The one writer of ``results`` rows: an answer or a failure for a group of prompt ids becomes a row per
prompt, inserted together with the prompts' new state. The real-time ``ResultWriter`` and the bulk
batch ingest (``store_batch_answers``) both write through here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from operator import itemgetter
from typing import Any, Final, Literal, NamedTuple

from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncConnection

from llm_dispatch.core import (
    PROMPT_STATUSES,
    RESULT_ROUTES,
    ChatResult,
    PriceTable,
    PromptStatus,
    ResultRoute,
    ResultStatus,
    Route,
)

from ._bulk import bind_processor, bind_value, placeholders
from ._ledger import write_ledger_deltas
from ._models import Prompt, Result

__all__ = [
    "MAX_ERROR_MESSAGE",
    "NO_PRICES",
    "RESULT_COLUMNS",
    "ResultRow",
    "RowLedger",
    "answer_rows",
    "failure_rows",
    "prompt_states",
    "result_params",
    "shares",
    "write_results",
]

MAX_ERROR_MESSAGE: Final = 2_000
# When a result's stored cost was worked out: as the answer was stored, or back-filled from its tokens
# by migration 0004 (with the bundled prices of its ``prices_as_of``, not those it was paid at).
CostBasis = Literal["answer", "backfill"]


class ResultRow(NamedTuple):
    """One ``results`` row, and the state it leaves its prompt in.

    Every field is a column of the same name but those in ``_NOT_COLUMNS`` (``job_id`` is added when the
    row is written). A new column is a field here, ``None`` unless the builder that knows it sets it.
    """

    prompt_id: int
    route: ResultRoute
    status: ResultStatus
    attempts: int
    created_at: datetime
    # The prompt's new status (not a column): succeeded; refused; failed; pending after a failure that is not final.
    prompt_status: PromptStatus
    text: str | None = None
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    cache_creation_tokens: int | None = None
    latency_ms: float | None = None
    response_model: str | None = None
    response_id: str | None = None
    cache_creation_extended_tokens: int | None = None
    reasoning_tokens: int | None = None
    service_tier: str | None = None
    http_status: int | None = None
    error_class: str | None = None
    error_message: str | None = None
    # The cost ledger (see ``Result``): set by ``_Ledger`` from the run's price table.
    cost_pico_usd: int | None = None
    list_cost_pico_usd: int | None = None
    discount: str | None = None
    prices_as_of: str | None = None
    prices_file: str | None = None
    cost_basis: CostBasis | None = None
    tool_calls: list[dict[str, Any]] | None = None
    refusal: str | None = None
    maybe_billed: int | None = None
    raw_body: str | None = None
    parsed: Any = None
    violation: str | None = None
    reask: int = 0
    embedding: bytes | None = None
    # For a final failure (not a column): whether another try could succeed.
    retryable: bool | None = None


_NOT_COLUMNS: Final = ("prompt_status", "retryable")
LEDGER_FIELDS: Final = ("cost_pico_usd", "list_cost_pico_usd", "discount", "prices_as_of", "prices_file", "cost_basis")
# The INSERT's columns: created_at (converted once per call's rows) and job_id go last.
_PLAIN_COLUMNS: Final = tuple(name for name in ResultRow._fields if name not in (*_NOT_COLUMNS, "created_at"))
RESULT_COLUMNS: Final[tuple[str, ...]] = (*_PLAIN_COLUMNS, "created_at", "job_id")
_plain_values = itemgetter(*(ResultRow._fields.index(name) for name in _PLAIN_COLUMNS))
_TOOL_CALLS: Final = _PLAIN_COLUMNS.index("tool_calls")
_PARSED: Final = _PLAIN_COLUMNS.index("parsed")


def shares(prompt_ids: Sequence[int], route: ResultRoute,
           row: Callable[[int, ResultRoute, bool], ResultRow]) -> list[ResultRow]:
    """The rows of one call that answered (or failed) these identical prompts: ``row(prompt_id, route, paid)``
    for each.

    The first id gets ``route`` and is the one that paid; the others get ``reused``, since the call was
    made (and paid) once. With ``route="reused"`` (an answer stored earlier) none paid.
    """
    if route not in RESULT_ROUTES:
        raise ValueError(f"route must be one of {RESULT_ROUTES}, got {route!r}")
    if not prompt_ids:
        return []
    if len(prompt_ids) == 1:
        return [row(prompt_ids[0], route, route != "reused")]
    return [row(prompt_ids[0], route, route != "reused"), *(row(pid, "reused", False) for pid in prompt_ids[1:])]


# ``ResultRow``'s ledger fields (``LEDGER_FIELDS``), in that order.
LedgerValues = tuple[int | None, int | None, str | None, str | None, str | None, CostBasis | None]
# Distinct usages priced per writer before the memo starts again: a batch's answers repeat a few hundred.
_PRICED_MEMO = 4096


class RowLedger:
    """The cost fields of a writer's rows, from its price table (None: costs unknown); made once per writer.

    Each is a ``LedgerValues``, which the row builders put into a row as they are. Only the row that paid
    (``shares``) costs anything; a reused answer or a failed call costs 0 whatever the prices, so those rows
    are priced without a table too. A paid row's values depend on its model, route and usage alone, so each
    such usage is priced once (``PriceTable.price``, the one formula).
    """

    __slots__ = ("_priced", "free", "prices", "stamp", "unknown")

    def __init__(self, prices: PriceTable | None) -> None:
        self.prices = prices
        self.stamp: tuple[str | None, str | None, CostBasis] = (
            (None, None, "answer") if prices is None else (prices.prices_as_of, prices.prices_file, "answer"))
        self.free: LedgerValues = (0, 0, None, *self.stamp)
        # No table: the cost is unknown, and so is when it would have been worked out.
        self.unknown: LedgerValues = (None, None, None, *self.stamp) if prices is not None else (None,) * 6
        self._priced: dict[tuple[str, str, int, int, int, int, int, str | None], LedgerValues] = {}

    def paid(self, result: ChatResult, *, model: str | None, route: Route) -> LedgerValues:
        if self.prices is None:
            return self.unknown
        usage = (model or result.model or "", route, result.prompt_tokens, result.completion_tokens,
                 result.cached_tokens, result.cache_creation_tokens, result.cache_creation_extended_tokens,
                 result.service_tier)
        values = self._priced.get(usage)
        if values is None:
            charge = self.prices.price(model=usage[0], route=route, prompt_tokens=usage[2],
                                       completion_tokens=usage[3], cached_tokens=usage[4],
                                       cache_creation_tokens=usage[5], cache_creation_extended_tokens=usage[6],
                                       service_tier=usage[7])
            # A model with no price: unknown, never 0. Else cost, list cost, discount (Charge's order), the stamp.
            values = self.unknown if charge is None else (*charge, *self.stamp)
            if len(self._priced) >= _PRICED_MEMO:
                self._priced.clear()
            self._priced[usage] = values
        return values


NO_PRICES: Final = RowLedger(None)


def answer_rows(
    answers: Iterable[tuple[Sequence[int], ChatResult]],
    *,
    route: ResultRoute,
    now: datetime,
    latency_s: float | None = None,
    ledger: RowLedger = NO_PRICES,
    model: str | None = None,
    reask: int = 0,
) -> list[ResultRow]:
    """The rows of these answers, each ``(prompt_ids, result)``, in order; their prompts become ``succeeded``, or
    ``refused`` when the model refused (a refusal's rows are ``refused`` too, priced as any answer: it was paid), or
    ``invalid`` when the answer broke its schema (``result.violation``: paid too). ``reask``: which asking of the
    prompts these answer (0: their own request).

    Each answer's rows follow ``shares``' rule: its first prompt gets ``route`` and paid (unless the route is
    ``reused``), the others sharing it get ``reused``. Only the paid row counts attempts and the HTTP status, and
    costs anything: priced by ``ledger`` as a request to ``model`` (the model asked for; else the answer's).
    ``latency_s`` replaces each call's own (a batch's time to answer). The rule is written out here, not run
    through ``shares`` and a row function per answer: a batch's ingest builds a row per answered line.
    """
    if route not in RESULT_ROUTES:
        raise ValueError(f"route must be one of {RESULT_ROUTES}, got {route!r}")
    paid_route: Route | None = None if route == "reused" else route
    free = ledger.free
    rows: list[ResultRow] = []
    for prompt_ids, result in answers:
        if not prompt_ids:
            continue
        latency_ms = (result.latency_s if latency_s is None else latency_s) * 1000
        # Positional, in ResultRow's field order: text .. service_tier, then http_status, error_class, error_message.
        answer = (result.text, result.finish_reason, result.prompt_tokens, result.completion_tokens,
                  result.cached_tokens, result.cache_creation_tokens or None, latency_ms, result.model,
                  result.response_id, result.cache_creation_extended_tokens or None, result.reasoning_tokens or None,
                  result.service_tier)
        # After the ledger's fields, in ResultRow's order; the paid row counts the attempts that may have been billed.
        kind = (result.tool_calls, result.refusal)
        # Passed one by one, not as a third starred tuple: mypy cannot place one after another's fields.
        parsed, violation = result.parsed, result.violation
        status: ResultStatus = ("invalid" if result.violation is not None else "succeeded" if result.refusal is None
                                else "refused")
        if paid_route is not None:
            # A call its provider did not bill (Anthropic's refusal before any output) costs 0, its usage kept.
            cost = ledger.paid(result, model=model, route=paid_route) if result.maybe_billed else free
            rows.append(ResultRow(prompt_ids[0], route, status, result.attempts, now, status, *answer,
                                  200, None, None, *cost, *kind, result.maybe_billed, None, parsed, violation,
                                  reask))
        else:
            rows.append(ResultRow(prompt_ids[0], route, status, 0, now, status, *answer, None, None, None,
                                  *free, *kind, 0, None, parsed, violation, reask))
        if len(prompt_ids) > 1:
            rows.extend(ResultRow(pid, "reused", status, 0, now, status, *answer, None, None, None, *free, *kind, 0,
                                  None, parsed, violation, reask) for pid in prompt_ids[1:])
        if result.embedding is not None:
            # Only an embeddings answer has one: set after the fact, so the chat rows' building is as it was.
            rows[-len(prompt_ids):] = [row._replace(embedding=result.embedding) for row in rows[-len(prompt_ids):]]
    return rows


def failure_rows(
    prompt_ids: Sequence[int],
    error: BaseException,
    *,
    route: ResultRoute,
    now: datetime,
    final: bool,
    ledger: RowLedger = NO_PRICES,
    model: str | None = None,
    reask: int = 0,
) -> list[ResultRow]:
    """The rows of one failed call for these prompts: error class, HTTP status, message, attempts; cost 0, unless
    the call was answered with a 2xx that carried no usable answer but said what it used (``error.usage``): that
    usage is stored and priced on the row that paid, as a request to ``model``.

    ``final`` fails the prompts (retryable or not, from ``error.retryable``); otherwise the failure is
    kept as history and the prompts go back to ``pending``. ``reask`` n > 0: the call asked the prompts again (their
    n-th re-ask) after an invalid answer, which stays their outcome: they stay ``invalid``.
    """
    error_class = type(error).__name__
    message = str(error)[:MAX_ERROR_MESSAGE] or None
    status_code = getattr(error, "status_code", None)
    attempts = int(getattr(error, "attempts", 1) or 1)
    retryable = bool(getattr(error, "retryable", False)) if final and not reask else None
    settled: PromptStatus = "invalid" if reask else "failed" if final else "pending"
    usage: ChatResult | None = getattr(error, "usage", None)
    free = dict(zip(LEDGER_FIELDS, ledger.free))

    def row(prompt_id: int, route: ResultRoute, paid: bool) -> ResultRow:
        billed: dict[str, Any] = {}
        if paid and route != "reused" and usage is not None:  # the one row that paid took a Route
            billed = {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
                      "cached_tokens": usage.cached_tokens, "cache_creation_tokens": usage.cache_creation_tokens or None,
                      "cache_creation_extended_tokens": usage.cache_creation_extended_tokens or None,
                      "reasoning_tokens": usage.reasoning_tokens or None, "service_tier": usage.service_tier,
                      "response_model": usage.model, "response_id": usage.response_id,
                      **dict(zip(LEDGER_FIELDS, ledger.paid(usage, model=model, route=route)))}
        return ResultRow(
            prompt_id=prompt_id,
            route=route,
            status="failed",
            attempts=attempts if paid else 0,
            created_at=now,
            prompt_status=settled,
            http_status=status_code if isinstance(status_code, int) else None,
            error_class=error_class,
            error_message=message,
            retryable=retryable,
            maybe_billed=int(getattr(error, "maybe_billed", 0) or 0) if paid else 0,
            raw_body=getattr(error, "raw_body", None) if paid else None,
            reask=reask,
            **{**free, **billed},
        )

    return shares(prompt_ids, route, row)


async def write_results(
    conn: AsyncConnection,
    rows: Sequence[ResultRow],
    *,
    job_ids: str | Mapping[int, str],
    now: datetime,
    prices: PriceTable | None,
    only_if: PromptStatus | None = None,
) -> None:
    """Insert ``rows`` (and what they add to their jobs' ledgers; ``prices``: the table they were priced with) and
    settle their prompts, in the caller's transaction on ``conn``.

    ``job_ids`` is the job of every row, or each prompt id's. ``only_if`` settles only prompts still in
    that status (a batch's members still ``batched``): a prompt another ingest settled first keeps its
    state and its attempts are not counted twice.
    """
    if not rows:
        return
    dialect = conn.dialect
    await conn.exec_driver_sql(_insert_sql(dialect), result_params(rows, job_ids=job_ids, dialect=dialect))
    await write_ledger_deltas(conn, rows, job_ids=job_ids, prices=prices)
    updated = bind_value(Prompt.__table__.c.updated_at, now, dialect)
    states = prompt_states(rows)
    if all(state[0] == "succeeded" for state in states.values()):
        # Every prompt answered (a batch's output, most real-time flushes): no error to keep, fewer bindings.
        settled = [(attempts, updated, prompt_id) for prompt_id, (_, attempts, _, _) in states.items()]
        await conn.exec_driver_sql(_succeeded_sql(dialect, only_if=only_if), settled)
        return
    settle = [(*state, updated, prompt_id) for prompt_id, state in states.items()]
    await conn.exec_driver_sql(_settle_sql(dialect, only_if=only_if), settle)


def result_params(rows: Sequence[ResultRow], *, job_ids: str | Mapping[int, str],
                  dialect: Dialect) -> list[tuple[Any, ...]]:
    """Each row's values in ``RESULT_COLUMNS`` order, as the driver takes them (each JSON column and timestamp
    through its type's bind processor)."""
    # Plain tuples through the driver's executemany (see storage._bulk): at thousands of rows a second,
    # SQLAlchemy's per-row parameter handling costs more than the database does.
    to_time = bind_processor(Result.__table__.c.created_at, dialect)
    to_json = bind_processor(Result.__table__.c.tool_calls, dialect)
    # The type for this dialect (JSONB on PostgreSQL), as SQLAlchemy's own statements would bind it.
    parsed_type = Result.__table__.c.parsed.type.dialect_impl(dialect)
    to_parsed: Callable[[Any], Any] = parsed_type.bind_processor(dialect) or (lambda value: value)
    stamp: datetime | None = None
    bound = None
    one_job = job_ids if isinstance(job_ids, str) else None
    params = []
    for row in rows:
        if row.created_at is not stamp:  # the rows of one call share their timestamp: convert it once
            stamp = row.created_at
            bound = to_time(stamp)
        job_id = one_job if one_job is not None else job_ids[row.prompt_id]
        values = _plain_values(row)
        if row.tool_calls is not None:  # the JSON columns: as their types write them
            values = (*values[:_TOOL_CALLS], to_json(row.tool_calls), *values[_TOOL_CALLS + 1:])
        if row.parsed is not None:
            values = (*values[:_PARSED], to_parsed(row.parsed), *values[_PARSED + 1:])
        params.append((*values, bound, job_id))
    return params


def prompt_states(rows: Sequence[ResultRow]) -> dict[int, tuple[str, int, str | None, bool | None]]:
    """Per prompt: (new status, attempts to add, last error class, retryable), its rows merged in order.

    One UPDATE row per prompt, so the executemany has no order to get wrong when a prompt has several
    rows in one write (say, a failure that is not final and then its success).
    """
    states: dict[int, tuple[str, int, str | None, bool | None]] = {
        row.prompt_id: (row.prompt_status, row.attempts, row.error_class, row.retryable) for row in rows
    }
    if len(states) == len(rows):  # one row per prompt, the usual case: nothing to merge
        return states
    states.clear()
    for row in rows:
        was = states.get(row.prompt_id)
        if was is None:
            states[row.prompt_id] = (row.prompt_status, row.attempts, row.error_class, row.retryable)
            continue
        status, attempts, error_class, retryable = was
        if status != "succeeded":
            status, retryable = row.prompt_status, row.retryable
        states[row.prompt_id] = (status, attempts + row.attempts, row.error_class or error_class, retryable)
    return states


def _insert_sql(dialect: Dialect) -> str:
    marks = placeholders(dialect, len(RESULT_COLUMNS))
    return f"INSERT INTO results ({', '.join(RESULT_COLUMNS)}) VALUES ({', '.join(marks)})"


def _guard(only_if: PromptStatus | None) -> str:
    if only_if is not None and only_if not in PROMPT_STATUSES:
        raise ValueError(f"unknown prompt status {only_if!r}; expected one of {PROMPT_STATUSES}")
    return f" AND status = '{only_if}'" if only_if is not None else ""


def _succeeded_sql(dialect: Dialect, *, only_if: PromptStatus | None) -> str:
    """``_settle_sql`` when every row succeeded: (attempts to add, now, id); the error class is kept."""
    attempts, now, pid = placeholders(dialect, 3)
    return (
        f"UPDATE prompts SET status = 'succeeded', attempts = attempts + {attempts}, "
        f"failed_retryable = CASE WHEN status = 'succeeded' THEN failed_retryable END, "
        f"updated_at = {now} WHERE id = {pid}{_guard(only_if)}"
    )


def _settle_sql(dialect: Dialect, *, only_if: PromptStatus | None) -> str:
    """The prompt's new state after its results: (status, attempts to add, error class, retryable, now, id).

    A success is final: a late failure of the same prompt (another run, a duplicate send) must not make
    it look unpaid and send it a third time. Every SET expression sees the row as it was. An error class
    stays as history until a later error replaces it.
    """
    status, attempts, error_class, retryable, now, pid = placeholders(dialect, 6)
    guard = _guard(only_if)
    return (
        f"UPDATE prompts SET status = CASE WHEN status = 'succeeded' THEN status ELSE {status} END, "
        f"attempts = attempts + {attempts}, last_error_class = COALESCE({error_class}, last_error_class), "
        f"failed_retryable = CASE WHEN status = 'succeeded' THEN failed_retryable ELSE {retryable} END, "
        f"updated_at = {now} WHERE id = {pid}{guard}"
    )
