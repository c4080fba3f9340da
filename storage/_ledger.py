"""A job's paid usage kept as its results are written (table ``ledger_deltas``): each write of result rows appends,
in its own transaction, one row per ledger key (route, service tier, price stamp) with what those rows added;
reports sum a job's few delta rows instead of every result, and ``compact_ledger`` folds them into one row per key.

The invariant: for every job and key, the deltas' sums are what ``usage_by_route`` would sum from the job's results
(answers and failures that reported usage, none reused). Every INSERT into ``results`` goes through
``write_results`` or ``write_batch_rows``, and both call ``write_ledger_deltas`` with the same rows.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, Final

from sqlalchemy import delete, func, insert, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection

from llm_dispatch.core import PAID_RESULT_STATUSES

from ._bulk import placeholders
from ._engine import Sessions
from ._models import LedgerDelta

__all__ = ["LEDGER_KEY", "LEDGER_SUMS", "compact_ledger", "ledger_sums", "write_ledger_deltas"]

# What a delta row is per: its job, then these (the results' ledger index's grouping, in its order).
LEDGER_KEY: Final = ("route", "service_tier", "prices_as_of", "prices_file", "cost_basis")
# What it adds up, in this order.
LEDGER_SUMS: Final = ("requests", "prompt_tokens", "completion_tokens", "cached_tokens", "cache_creation_tokens",
                      "cache_creation_extended_tokens", "cost_pico_usd", "list_cost_pico_usd", "unpriced")
_COLUMNS: Final = ("job_id", *LEDGER_KEY, *LEDGER_SUMS)

logger = logging.getLogger(__name__)


def _deltas(rows: Sequence[Any], *, job_ids: str | Mapping[int, str]) -> list[tuple[Any, ...]]:
    """One delta per job and ledger key among ``rows`` (``ResultRow``s), in ``_COLUMNS`` order."""
    one_job = job_ids if isinstance(job_ids, str) else None
    sums: dict[tuple[Any, ...], list[int]] = {}
    for row in rows:
        # Paid usage as usage_by_route reads it: answers (refusals and invalid ones are billed) and failures whose
        # 2xx reported usage; a reused answer was paid once, by its first prompt.
        if row.route == "reused" or (row.status not in PAID_RESULT_STATUSES and row.prompt_tokens is None):
            continue
        job = one_job if one_job is not None else job_ids[row.prompt_id]
        key = (job, row.route, row.service_tier, row.prices_as_of, row.prices_file, row.cost_basis)
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
                              job_ids: str | Mapping[int, str]) -> None:
    """Append what ``rows`` (``ResultRow``s about to be inserted) add to their jobs' ledgers, in the caller's
    transaction on ``conn``: the one that inserts them."""
    deltas = _deltas(rows, job_ids=job_ids)
    if deltas:
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
