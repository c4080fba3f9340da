"""A job's paid usage kept as its results are written (table ``ledger_deltas``): each write of result rows appends,
in its own transaction, one row per ledger key with what those rows added; reports sum a job's few delta rows
instead of every result, and ``compact_ledger`` folds them into one row per key.

The invariant: for every job and key, the deltas' sums are what ``usage_by_route`` would sum from the job's results
(answers and failures that reported usage, none reused), each result counted under its prompt's model, endpoint and
provider as stored on the prompt. Every INSERT into ``results`` goes through ``write_results`` or
``write_batch_rows``, and both call ``write_ledger_deltas`` with the same rows and the price table that priced them.

The long-prompt split: a delta says the threshold (prompt tokens) its rows were split at, ``long_above``, the one the
writer's price table gives the prompt's model (NULL: no table, or no long-prompt price), and ``long_prompt``, whether
they were longer. A read split by another threshold (the price table changed since) cannot use those rows: it sums
the results instead (``storage._usage``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any, Final

from sqlalchemy import delete, func, insert, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection

from llm_dispatch.core import PAID_RESULT_STATUSES, PriceTable

from ._bulk import IDS_CHUNK, chunks, placeholders
from ._engine import Sessions
from ._models import LedgerDelta

__all__ = ["LEDGER_KEY", "LEDGER_SUMS", "compact_ledger", "ledger_sums", "write_ledger_deltas"]

# What a delta row is per: its job, then these. The first three are the prompt's, as stored.
LEDGER_KEY: Final = ("model", "endpoint", "provider", "long_above", "long_prompt", "route", "service_tier",
                     "prices_as_of", "prices_file", "cost_basis")
# What it adds up, in this order.
LEDGER_SUMS: Final = ("requests", "prompt_tokens", "completion_tokens", "cached_tokens", "cache_creation_tokens",
                      "cache_creation_extended_tokens", "cost_pico_usd", "list_cost_pico_usd", "unpriced")
_COLUMNS: Final = ("job_id", *LEDGER_KEY, *LEDGER_SUMS)

# A prompt's model, endpoint and provider: what its results' deltas are kept under.
Attribution = tuple[str, str, str | None]

logger = logging.getLogger(__name__)


def _paid(rows: Sequence[Any]) -> list[Any]:
    """Paid usage as usage_by_route reads it: answers (refusals and invalid ones are billed) and failures whose
    2xx reported usage; a reused answer was paid once, by its first prompt."""
    return [row for row in rows
            if row.route != "reused" and (row.status in PAID_RESULT_STATUSES or row.prompt_tokens is not None)]


async def _attributions(conn: AsyncConnection, prompt_ids: Sequence[int]) -> Attribution | dict[int, Attribution]:
    """The prompts' model, endpoint and provider: one for all (most writes: a job of one model), else each's."""
    # The ids as one value the driver encodes itself (a PostgreSQL array, a JSON text for SQLite's json_each).
    postgres = conn.dialect.name == "postgresql"
    mark = placeholders(conn.dialect, 1)[0]
    among = f"id = ANY({mark}::bigint[])" if postgres else f"id IN (SELECT value FROM json_each({mark}))"
    parts = [(part if postgres else json.dumps(part),) for part in chunks(prompt_ids, IDS_CHUNK)]
    found: set[Attribution] = set()
    for part in parts:
        kinds: Any = await conn.exec_driver_sql(f"SELECT DISTINCT model, endpoint, provider FROM prompts WHERE {among}",
                                                part)
        found.update((model, endpoint, provider) for model, endpoint, provider in kinds)
    if len(found) <= 1:
        # None found: the prompts are not in the database, and inserting their results fails on the foreign key.
        return found.pop() if found else ("", "", None)
    each: dict[int, Attribution] = {}
    for part in parts:
        rows: Any = await conn.exec_driver_sql(f"SELECT id, model, endpoint, provider FROM prompts WHERE {among}", part)
        each.update((pid, (model, endpoint, provider)) for pid, model, endpoint, provider in rows)
    return each


def _deltas(rows: Sequence[Any], *, job_ids: str | Mapping[int, str],
            attributions: Attribution | dict[int, Attribution], prices: PriceTable | None) -> list[tuple[Any, ...]]:
    """One delta per job and ledger key among ``rows`` (paid ``ResultRow``s), in ``_COLUMNS`` order."""
    one_job = job_ids if isinstance(job_ids, str) else None
    one: Attribution | None = None
    each: Mapping[int, Attribution] = {}
    if isinstance(attributions, tuple):
        one = attributions
    else:
        each = attributions
    thresholds: dict[str, int | None] = {}
    sums: dict[tuple[Any, ...], list[int]] = {}
    for row in rows:
        job = one_job if one_job is not None else job_ids[row.prompt_id]
        model, endpoint, provider = one if one is not None else each[row.prompt_id]
        if model not in thresholds:
            thresholds[model] = None if prices is None else prices.long_above(model)
        above = thresholds[model]
        is_long = above is not None and (row.prompt_tokens or 0) > above
        key = (job, model, endpoint, provider, above, is_long, row.route, row.service_tier, row.prices_as_of,
               row.prices_file, row.cost_basis)
        added = sums.get(key)
        if added is None:
            added = sums[key] = [0] * len(LEDGER_SUMS)
        added[0] += 1
        added[1] += row.prompt_tokens or 0
        added[2] += row.completion_tokens or 0
        added[3] += row.cached_tokens or 0
        added[4] += row.cache_creation_tokens or 0
        added[5] += row.cache_creation_extended_tokens or 0
        if row.cost_pico_usd is None:
            added[8] += 1
        else:
            added[6] += row.cost_pico_usd
        added[7] += row.list_cost_pico_usd or 0
    return [(*key, *added) for key, added in sums.items()]


async def write_ledger_deltas(conn: AsyncConnection, rows: Sequence[Any], *,
                              job_ids: str | Mapping[int, str], prices: PriceTable | None) -> None:
    """Append what ``rows`` (``ResultRow``s about to be inserted, priced with ``prices``) add to their jobs' ledgers,
    in the caller's transaction on ``conn``: the one that inserts them."""
    paid = _paid(rows)
    if not paid:
        return
    attributions = await _attributions(conn, list(dict.fromkeys(row.prompt_id for row in paid)))
    deltas = _deltas(paid, job_ids=job_ids, attributions=attributions, prices=prices)
    marks = ", ".join(placeholders(conn.dialect, len(_COLUMNS)))
    await conn.exec_driver_sql(f"INSERT INTO ledger_deltas ({', '.join(_COLUMNS)}) VALUES ({marks})", deltas)


async def ledger_sums(sessions: Sessions, *, job_id: str) -> list[tuple[Any, ...]]:
    """The job's paid usage per ledger key: ``LEDGER_KEY``'s values, then ``LEDGER_SUMS``' totals, a row per key."""
    key = [getattr(LedgerDelta, name) for name in LEDGER_KEY]
    stmt = (select(*key, *(func.sum(getattr(LedgerDelta, name)) for name in LEDGER_SUMS))
            .where(LedgerDelta.job_id == job_id).group_by(*key))
    async with sessions() as session:
        return [(*row[:len(LEDGER_KEY)], *(int(n) for n in row[len(LEDGER_KEY):]))
                for row in await (await session.connection()).execute(stmt)]


async def compact_ledger(sessions: Sessions, *, job_id: str) -> bool:
    """Fold the job's delta rows into one per ledger key; False (logged) where the database refused, and the rows
    stay to be folded next time: reads are right either way. The rows folded are those the DELETE removed
    (RETURNING), so a delta another writer commits meanwhile is neither lost nor counted twice."""
    try:
        await _fold(sessions, job_id=job_id)
    except SQLAlchemyError as error:
        logger.warning("could not fold job %s's ledger deltas (they are folded next time): %s", job_id,
                       getattr(error, "orig", None) or error)
        return False
    return True


async def _fold(sessions: Sessions, *, job_id: str) -> None:
    key = [getattr(LedgerDelta, name) for name in LEDGER_KEY]
    sums = [getattr(LedgerDelta, name) for name in LEDGER_SUMS]
    async with sessions.begin() as session:
        conn = await session.connection()
        gone = (await conn.execute(delete(LedgerDelta).where(LedgerDelta.job_id == job_id)
                                   .returning(*key, *sums))).all()
        folded: dict[tuple[Any, ...], list[int]] = {}
        for row in gone:
            added = folded.setdefault(tuple(row[:len(LEDGER_KEY)]), [0] * len(LEDGER_SUMS))
            for index, value in enumerate(row[len(LEDGER_KEY):]):
                added[index] += value
        if folded:
            await conn.execute(insert(LedgerDelta), [
                {"job_id": job_id, **dict(zip(LEDGER_KEY, k)), **dict(zip(LEDGER_SUMS, added))}
                for k, added in folded.items()])
