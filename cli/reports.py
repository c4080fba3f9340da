"""Reports for the CLI: ``status``, ``cost``, ``export`` and the table a run ends with. Read-only, no Prefect."""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TextIO

from rich.console import Console
from rich.table import Table
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

import storage
from jobs import actual_cost
from llm_dispatch import ConfigError, PriceTable, Settings

Sessions = async_sessionmaker[AsyncSession]

EXPORT_FIELDS = (
    "position", "custom_id", "prompt_id", "model", "status", "planned_route", "route_reason", "route", "text",
    "finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens", "cost_usd", "latency_ms",
    "error_class", "error_message", "metadata",
)


def require_database(settings: Settings) -> None:
    """A SQLite file that is not there is a mistake (a wrong directory or URL), not a new empty database."""
    url = make_url(settings.database_url)
    if url.get_backend_name() == "sqlite" and url.database and not Path(url.database).exists():
        raise ConfigError(f"no database at {url.database}: run `llm-dispatch run FILE` first, or pass --database-url")


@asynccontextmanager
async def _database(settings: Settings) -> AsyncIterator[Sessions]:
    require_database(settings)
    # An older database is brought up to date, as a run would.
    async with storage.open_database(settings.database_url) as sessions:
        yield sessions


async def _job_id(sessions: Sessions, job_id: str | None) -> str | None:
    if job_id is not None:
        return job_id if await storage.get_job(sessions, job_id=job_id) is not None else None
    jobs = await storage.list_jobs(sessions, limit=1)
    return jobs[0].id if jobs else None


async def status(*, settings: Settings, job_id: str | None) -> dict[str, Any] | None:
    async with _database(settings) as sessions:
        if job_id is None:
            jobs = await storage.list_jobs(sessions)
            return {"jobs": [
                {"job_id": j.id, "name": j.name, "created_at": j.created_at.isoformat(timespec="seconds"),
                 "status": j.status, "prompts": j.prompts, "open_batches": j.open_batches} for j in jobs]}
        job = await storage.get_job(sessions, job_id=job_id)
        if job is None:
            return None
        batches = await storage.job_batches(sessions, job_id=job_id)
        return {
            "job_id": job.id, "name": job.name, "status": job.status, "counts": job.counts,
            "routes": await storage.route_counts(sessions, job_id=job_id),
            "batches": [
                {"id": b.id, "provider_batch_id": b.provider_batch_id, "status": b.status, "model": b.model,
                 "total": b.request_total, "completed": b.request_completed, "failed": b.request_failed,
                 "expires_at": b.expires_at.isoformat(timespec="seconds") if b.expires_at else None,
                 "cancel_requested": b.cancel_requested}
                for b in batches
            ],
        }


def print_status(console: Console, data: dict[str, Any]) -> None:
    if "jobs" in data:
        table = Table(title="jobs (newest first)")
        for column in ("job", "name", "created", "status", "prompts", "open batches"):
            table.add_column(column)
        for job in data["jobs"]:
            table.add_row(job["job_id"], job["name"], job["created_at"], job["status"], str(job["prompts"]),
                          str(job["open_batches"]))
        console.print(table)
        return
    table = Table(title=f"job {data['job_id']} ({data['name']}): {data['status']}")
    statuses = ("succeeded", "failed", *storage.UNFINISHED_PROMPT_STATUSES)
    table.add_column("route")
    for name in statuses:
        table.add_column(name, justify="right")
    for route, counts in sorted(data["routes"].items()):
        table.add_row(route, *(str(counts.get(name, 0)) for name in statuses))
    console.print(table)
    if data["batches"]:
        batches = Table(title="batches")
        for column in ("id", "provider id", "model", "status", "completed", "failed", "total", "expires"):
            batches.add_column(column)
        for b in data["batches"]:
            batches.add_row(str(b["id"]), b["provider_batch_id"] or "-", b["model"],
                            b["status"] + (" (cancel requested)" if b["cancel_requested"] else ""),
                            str(b["completed"]), str(b["failed"]), str(b["total"]), b["expires_at"] or "-")
        console.print(batches)


async def cost(*, settings: Settings, job_id: str | None) -> dict[str, Any] | None:
    table = PriceTable.load(path=Path(settings.prices_file) if settings.prices_file else None)
    async with _database(settings) as sessions:
        found = await _job_id(sessions, job_id)
        if found is None:
            return None
        ledger = await actual_cost(sessions=sessions, job_id=found, table=table)
    return {"job_id": found, **ledger.as_dict(), "currency": table.currency, "source": table.source}


def print_cost(console: Console, data: dict[str, Any]) -> None:
    table = Table(title=f"job {data['job_id']}: cost in {data['currency']} (prices as of {data['prices_as_of']})")
    for column in ("route", "requests", "input tokens", "cached", "output tokens", "cost"):
        table.add_column(column, justify="right" if column != "route" else "left")
    for route, r in data["routes"].items():
        unknown = f" + {r['unpriced']} unpriced" if r["unpriced"] else ""
        table.add_row(route, str(r["requests"]), str(r["prompt_tokens"]), str(r["cached_tokens"]),
                      str(r["completion_tokens"]), f"${r['cost']:.6f}{unknown}")
    table.add_row("total", "", "", "", "", f"${data['total']:.6f}")
    table.add_row("saved by batch", "", "", "", "", f"${data['savings']:.6f}")
    console.print(table)
    if not data["complete"]:
        console.print(f"[yellow]warning:[/] no price for {', '.join(sorted(data['unpriced_models']))}: their cost is "
                      "unknown and not in the total; add them with --prices-file", highlight=False)


async def export(*, settings: Settings, job_id: str, fmt: str, output: Path | None) -> int:
    """Write the job's rows as ``jsonl`` (one object a line), ``json`` (one array) or ``csv``; returns how many."""
    table = PriceTable.load(path=Path(settings.prices_file) if settings.prices_file else None)
    async with _database(settings) as sessions:
        if await storage.get_job(sessions, job_id=job_id) is None:
            raise ConfigError(f"no job {job_id!r}; `llm-dispatch status` lists jobs")
        handle: TextIO = output.open("w", encoding="utf-8", newline="") if output else sys.stdout
        try:
            writer = csv.DictWriter(handle, fieldnames=EXPORT_FIELDS) if fmt == "csv" else None
            if writer is not None:
                writer.writeheader()
            elif fmt == "json":
                handle.write("[")
            count = 0
            async for row in storage.export_rows(sessions, job_id=job_id):
                record = _export_record(row, table)
                if writer is not None:
                    writer.writerow({**record, "metadata": json.dumps(record["metadata"]) if record["metadata"] else ""})
                elif fmt == "json":
                    # Written row by row like the others, so a large job is never held in memory whole.
                    handle.write(("," if count else "") + "\n" + json.dumps(record, ensure_ascii=False))
                else:
                    handle.write(json.dumps(record, ensure_ascii=False) + "\n")
                count += 1
            if fmt == "json":
                handle.write("\n]\n")
        finally:
            if output is not None:
                handle.close()
    return count


def _export_record(row: storage.ExportRow, table: PriceTable) -> dict[str, Any]:
    cost: float | None = None
    if row.route in storage.SEND_ROUTES and row.status == "succeeded" and row.prompt_tokens is not None:
        value = table.cost(model=row.model, route=row.route, prompt_tokens=row.prompt_tokens,  # type: ignore[arg-type]
                           completion_tokens=row.completion_tokens or 0, cached_tokens=row.cached_tokens or 0)
        cost = None if value is None else float(value)
    elif row.route == "reused":
        cost = 0.0  # answered by a request paid for once, elsewhere
    record = {name: getattr(row, name) for name in EXPORT_FIELDS if name not in ("cost_usd",)}
    record["cost_usd"] = cost
    return {name: record[name] for name in EXPORT_FIELDS}


def job_table(summary: dict[str, Any], *, title: str) -> Table:
    """The table a run ends with: per route, prompts by outcome, tokens, cost and the estimate."""
    table = Table(title=title)
    for column in ("route", "prompts", "succeeded", "failed", "unfinished", "tokens in/out", "cost", "estimate"):
        table.add_column(column, justify="left" if column == "route" else "right")
    estimate = summary.get("estimate") or {"routes": {}}
    for route in storage.SEND_ROUTES:
        statuses = summary["routes"].get(route, {})
        actual = summary["cost"]["routes"].get(route, {})
        guess = estimate["routes"].get(route, {})
        table.add_row(
            route, str(sum(statuses.values())), str(statuses.get("succeeded", 0)), str(statuses.get("failed", 0)),
            str(storage.unfinished(statuses)),
            f"{actual.get('prompt_tokens', 0)}/{actual.get('completion_tokens', 0)}",
            f"${actual.get('cost', 0.0):.6f}", f"${guess.get('cost', 0.0):.6f}" if guess else "-",
        )
    cost = summary["cost"]
    table.add_section()
    table.add_row("total", str(sum(summary["counts"].values())), str(summary["counts"].get("succeeded", 0)),
                  str(summary["counts"].get("failed", 0)), str(summary["unfinished"]), "",
                  f"${cost['total']:.6f}" + ("" if cost["complete"] else " + unknown"),
                  f"${estimate['total']:.6f}" if "total" in estimate else "-")
    table.caption = (
        f"saved by the Batch API: ${cost['savings']:.6f}   prices as of {cost['prices_as_of']}"
        + ("" if cost["complete"] else f"   NO PRICE for {', '.join(sorted(cost['unpriced_models']))}")
    )
    for name, count in sorted(summary["failed_by_class"].items()):
        table.add_row(f"  failed: {name}", "", "", str(count), "", "", "", "")
    stats = summary.get("stats") or {}
    if stats.get("p50_latency_ms") is not None:
        table.caption += f"\nreal-time latency p50 / p95: {stats['p50_latency_ms']:.0f} / {stats['p95_latency_ms']:.0f} ms"
    return table
