"""Make a large database quickly: one finished job of N prompts, each with its result, written in bulk.

    python bench/bigdb.py --prompts 1000000 --database-url sqlite+aiosqlite:////tmp/big.db
    python bench/bigdb.py --prompts 1000000 --database-url postgresql+asyncpg://postgres@127.0.0.1:5432/bigdb

The schema is made by the installed ``llm_dispatch`` (``storage.open_database``: the newest migration of the tree
whose interpreter runs this script, so ``/work/main/.venv/bin/python bench/bigdb.py`` makes main's schema). The
rows go in straight through the driver (sqlite3 ``executemany``, asyncpg ``COPY``): the benches that use it
measure reading such a job (``status``, ``cost``, ``export``), not sending it. The job looks like a real mixed one:
80% of prompts answered real-time, 20% through the Batch API (20 batches), 2% failed, every fifth prompt with
metadata; each answer has tokens and a stored cost. Prints the job's id. Run again on the same database, it adds
another job beside the first (status and cost must stay fast with other jobs there).

``--open`` makes instead a job about to be sent: every prompt pending and routed real-time, no results and no
batches (what a real-time run or its shards page through: ``bench/shard_pages.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import time
import uuid
from datetime import UTC, datetime
from typing import Any

MODEL = "gpt-4o-mini"
PARAMS = {"max_tokens": 64}
STEP = 50_000
BATCHES = 20
PRICES_AS_OF = "2026-11-01"

PROMPT_COLUMNS = ("id", "job_id", "custom_id", "position", "model", "endpoint", "background_creates", "messages",
                  "params", "metadata", "dedupe_key", "status", "attempts", "last_error_class", "failed_retryable",
                  "planned_route", "route_reason", "created_at", "updated_at")
RESULT_COLUMNS = ("id", "prompt_id", "job_id", "created_at", "route", "status", "text", "finish_reason",
                  "prompt_tokens", "completion_tokens", "cached_tokens", "latency_ms", "attempts", "response_model",
                  "response_id", "http_status", "error_class", "error_message", "cost_pico_usd",
                  "list_cost_pico_usd", "discount", "prices_as_of", "cost_basis", "reask", "maybe_billed")
BATCH_COLUMNS = ("id", "job_id", "model", "provider", "endpoint", "status", "provider_batch_id", "input_file_id",
                 "output_file_id", "request_total", "request_completed", "request_failed", "cancel_requested",
                 "error_count", "submitted_at", "finished_at", "created_at", "updated_at")


def _rows(job_id: str, start: int, stop: int, *, first_id: int, now: Any, dumps: Any, open_: bool = False
          ) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Prompts ``start..stop`` of the job (ids from ``first_id``) and a result each (``open_``: pending, none)."""
    prompts, results = [], []
    params = dumps(PARAMS)
    for n in range(start, stop):
        pid = first_id + n
        if open_:
            messages = dumps([{"role": "user", "content": f"Question {n}: what is {n} squared, and why?"}])
            prompts.append((pid, job_id, f"c-{n}", n, MODEL, "chat", 0, messages, params, None, f"{n:064x}",
                            "pending", 0, None, None, "realtime", "bench", now, now))
            continue
        batch = n % 5 == 4
        failed = n % 50 == 7
        route = "batch" if batch else "realtime"
        messages = dumps([{"role": "user", "content": f"Question {n}: what is {n} squared, and why?"}])
        metadata = dumps({"split": "test" if n % 2 else "train", "source": f"s{n % 7}"}) if n % 5 == 0 else None
        prompts.append((pid, job_id, f"c-{n}", n, MODEL, "chat", 0, messages, params, metadata, f"{n:064x}",
                        "failed" if failed else "succeeded", 1, "RateLimitError" if failed else None,
                        True if failed else None, route, "bench", now, now))
        if failed:
            results.append((pid, pid, job_id, now, route, "failed", None, None, None, None, None, 812.0, 3, None,
                            None, 429, "RateLimitError", "rate limited", 0, 0, None, PRICES_AS_OF, "answer", 0, 0))
            continue
        prompt_tokens, completion_tokens = 20 + n % 13, 40 + n % 29
        list_cost = prompt_tokens * 150_000 + completion_tokens * 600_000
        cost = list_cost // 2 if batch else list_cost
        results.append((pid, pid, job_id, now, route, "succeeded", f"The answer to question {n} is {n * n}.",
                        "stop", prompt_tokens, completion_tokens, 0, 640.0 + n % 100, 1, MODEL + "-2024-07-18",
                        f"chatcmpl-{n}", 200, None, None, cost, list_cost, "0.5" if batch else "0", PRICES_AS_OF,
                        "answer", 0, 1))
    return prompts, results


def _batches(job_id: str, count: int, *, first_id: int, now: Any) -> list[tuple[Any, ...]]:
    per = -(-count // 5 // BATCHES)
    return [(first_id + i, job_id, MODEL, "openai", "chat", "ingested", f"batch_{job_id}_{i}", f"file-in-{i}",
             f"file-out-{i}", per, per, 0, False, 0, now, now, now, now) for i in range(BATCHES)]


def _deltas_sql() -> str | None:
    """How the newest migration that fills ``ledger_deltas`` (storage._ledger) from the results stored does it, in the
    tree whose interpreter runs this script; None before the first."""
    import importlib.util
    from pathlib import Path

    from llm_dispatch import storage

    for path in sorted((Path(storage.__file__).parent / "migrations" / "versions").glob("*_ledger_*.py"), reverse=True):
        spec = importlib.util.spec_from_file_location("ledger_deltas_migration", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        if hasattr(module, "BACKFILL"):
            return str(module.BACKFILL)
    return None


def _insert(table: str, columns: tuple[str, ...]) -> str:
    return f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"


def fill_sqlite(path: str, *, job_id: str, count: int, open_: bool = False) -> None:
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")  # as SQLAlchemy stores a DateTime on SQLite
    with sqlite3.connect(path) as con:
        con.execute("PRAGMA synchronous=OFF")
        first = con.execute("SELECT coalesce(max(id), 0) + 1 FROM prompts").fetchone()[0]
        first_batch = con.execute("SELECT coalesce(max(id), 0) + 1 FROM batches").fetchone()[0]
        con.execute("INSERT INTO jobs (id, name, created_at, updated_at, fingerprint, model, settings, status) "
                    "VALUES (?, ?, ?, ?, ?, ?, '{}', ?)",
                    (job_id, f"big-{count}", now, now, job_id[:8], MODEL, "running" if open_ else "finished"))
        if not open_:
            con.executemany(_insert("batches", BATCH_COLUMNS), _batches(job_id, count, first_id=first_batch, now=now))
        for start in range(0, count, STEP):
            prompts, results = _rows(job_id, start, min(count, start + STEP), first_id=first, now=now,
                                     dumps=json.dumps, open_=open_)
            con.executemany(_insert("prompts", PROMPT_COLUMNS), prompts)
            con.executemany(_insert("results", RESULT_COLUMNS), results)
        deltas = _deltas_sql()
        if deltas is not None:  # what the application's writers would have appended, for every job's results
            con.execute("DELETE FROM ledger_deltas")
            con.execute(deltas)


async def fill_postgres(url: str, *, job_id: str, count: int, open_: bool = False) -> None:
    import asyncpg

    con = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        now = datetime.now(UTC)
        first = await con.fetchval("SELECT coalesce(max(id), 0) + 1 FROM prompts")
        first_batch = await con.fetchval("SELECT coalesce(max(id), 0) + 1 FROM batches")
        async with con.transaction():
            await con.execute("INSERT INTO jobs (id, name, created_at, updated_at, fingerprint, model, settings, "
                              "status) VALUES ($1, $2, $3, $3, $4, $5, '{}', $6)",
                              job_id, f"big-{count}", now, job_id[:8], MODEL, "running" if open_ else "finished")
            if not open_:
                await con.copy_records_to_table("batches", columns=BATCH_COLUMNS,
                                                records=_batches(job_id, count, first_id=first_batch, now=now))
            for start in range(0, count, STEP):
                prompts, results = _rows(job_id, start, min(count, start + STEP), first_id=first, now=now,
                                         dumps=json.dumps, open_=open_)
                await con.copy_records_to_table("prompts", records=prompts, columns=PROMPT_COLUMNS)
                await con.copy_records_to_table("results", records=results, columns=RESULT_COLUMNS)
            deltas = _deltas_sql()
            if deltas is not None:  # what the application's writers would have appended, for every job's results
                await con.execute("DELETE FROM ledger_deltas")
                await con.execute(deltas)
        # The sequences past the ids written, so the next row the application writes gets a new one.
        for table in ("prompts", "results", "batches"):
            await con.execute(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), (SELECT max(id) FROM {table}))")
        # What autovacuum does soon after a bulk load (PostgreSQL 13 on, past its insert threshold): the planner's
        # statistics, and the visibility map without which an index-only scan reads every row's heap page too.
        await con.execute("VACUUM ANALYZE")
    finally:
        await con.close()


async def migrate(url: str) -> None:
    from llm_dispatch import storage

    async with storage.open_database(url):
        pass


def make(url: str, *, count: int, job_id: str | None = None, open_: bool = False) -> str:
    """Make (or extend) the database at ``url`` with one job of ``count`` prompts; returns its id."""
    job_id = job_id or str(uuid.uuid4())
    asyncio.run(migrate(url))
    if url.startswith("sqlite"):
        fill_sqlite(url.split(":///", 1)[1], job_id=job_id, count=count, open_=open_)
    else:
        asyncio.run(fill_postgres(url, job_id=job_id, count=count, open_=open_))
    return job_id


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=1_000_000)
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--job-id", help="the new job's id (default: a new uuid)")
    parser.add_argument("--open", action="store_true", help="a job about to be sent: every prompt pending, no results")
    args = parser.parse_args()
    started = time.perf_counter()
    job_id = make(args.database_url, count=args.prompts, job_id=args.job_id, open_=args.open)
    print(f"job {job_id}: {args.prompts:,} prompts and results in {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
