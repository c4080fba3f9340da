"""A batch's result rows written in bulk: set-based statements for the thousands of rows of an ingest slice.

The rows are those ``_results`` builds, and they leave the database (their ledger deltas included) as
``write_results`` would leave it with ``only_if="batched"``; only the statements differ. PostgreSQL takes the rows
by ``COPY`` and settles their prompts in one ``UPDATE ... FROM unnest(...)``; SQLite settles them in one ``UPDATE``
per prompt state, the ids handed over as one JSON array (``json_each``), and inserts the rows by the driver's
``executemany``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Final

from sqlalchemy.ext.asyncio import AsyncConnection

from llm_dispatch.core import PriceTable

from ._bulk import bind_value, chunks, placeholders
from ._ledger import write_ledger_deltas
from ._models import Prompt
from ._results import RESULT_COLUMNS, ResultRow, prompt_states, result_params

__all__ = ["write_batch_rows"]

# Prompt ids per SQLite UPDATE: one JSON text each, so one bound parameter whatever the count.
SETTLE_IDS: Final = 10_000

# A prompt still in its batch takes its new state; anything else (settled by an ingest before) keeps its own.
_POSTGRES_SETTLE: Final = (
    "UPDATE prompts SET status = v.status, attempts = prompts.attempts + v.attempts, "
    "last_error_class = COALESCE(v.error_class, prompts.last_error_class), failed_retryable = v.retryable, "
    "updated_at = $6 FROM unnest($1::bigint[], $2::varchar[], $3::integer[], $4::varchar[], $5::boolean[]) "
    "AS v(id, status, attempts, error_class, retryable) WHERE prompts.id = v.id AND prompts.status = 'batched'"
)


async def write_batch_rows(conn: AsyncConnection, rows: Sequence[ResultRow], *, job_id: str, now: datetime,
                           prices: PriceTable | None) -> None:
    """Insert a batch's ``rows`` (all of job ``job_id``, priced with ``prices``) and settle their prompts still
    ``batched``, in the caller's transaction on ``conn``: a prompt another ingest settled first keeps its state, and
    its attempts are not counted twice."""
    if not rows:
        return
    dialect = conn.dialect
    states = prompt_states(rows)
    updated = bind_value(Prompt.__table__.c.updated_at, now, dialect)
    await write_ledger_deltas(conn, rows, job_ids=job_id, prices=prices)
    params = result_params(rows, job_ids=job_id, dialect=dialect)
    if dialect.name == "postgresql":
        ids = list(states)
        columns = list(zip(*states.values()))
        # First, through SQLAlchemy: it opens the transaction the COPY then runs in.
        await conn.exec_driver_sql(_POSTGRES_SETTLE, (ids, *columns, updated))
        driver: Any = (await conn.get_raw_connection()).driver_connection
        if not driver.is_in_transaction():
            raise RuntimeError("the result rows' COPY must run in the ingest's transaction")
        await driver.copy_records_to_table("results", records=params, columns=RESULT_COLUMNS)
        return
    by_state: dict[tuple[Any, ...], list[int]] = {}
    for prompt_id, state in states.items():
        by_state.setdefault(state, []).append(prompt_id)
    status, attempts, error_class, retryable, stamp, ids_json = placeholders(dialect, 6)
    settle = (f"UPDATE prompts SET status = {status}, attempts = attempts + {attempts}, "
              f"last_error_class = COALESCE({error_class}, last_error_class), failed_retryable = {retryable}, "
              f"updated_at = {stamp} WHERE id IN (SELECT value FROM json_each({ids_json})) AND status = 'batched'")
    for state, ids in by_state.items():
        for part in chunks(ids, SETTLE_IDS):
            await conn.exec_driver_sql(settle, (*state, updated, json.dumps(part)))
    marks = placeholders(dialect, len(RESULT_COLUMNS))
    await conn.exec_driver_sql(f"INSERT INTO results ({', '.join(RESULT_COLUMNS)}) VALUES ({', '.join(marks)})",
                               params)
