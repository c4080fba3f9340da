"""Reports for the CLI: ``status``, ``cost``, ``reprice``, ``export`` and the table a run ends with. Read-only,
no Prefect: costs are the ones stored with each answer; only ``reprice`` prices with another table."""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from sqlalchemy.engine import make_url

from llm_dispatch import storage
# Each command imports the rest of what it reads (cache planning, exports, repricing) when it runs.
from llm_dispatch.jobs import actual_cost, job_budget_standings, money
from llm_dispatch.core import (
    DatabaseError,
    PriceTable,
    Route,
    RouteTotals,
    Settings,
    counted,
    dollars,
    ProviderTable,
    provider_lookup,
    ROUTES,
    UNFINISHED_PROMPT_STATUSES,
    to_json,
    unfinished,
)

if TYPE_CHECKING:
    from llm_dispatch.jobs import CacheGroupReport, DispatchSummary


def require_database(settings: Settings) -> None:
    """A SQLite file that is not there is a mistake (a wrong directory or URL), not a new empty database."""
    url = make_url(settings.database_url)
    if url.get_backend_name() == "sqlite" and url.database and not Path(url.database).exists():
        raise DatabaseError(f"no database at {url.database}: run `llm-dispatch run FILE` first, or pass --database-url")


@asynccontextmanager
async def _database(settings: Settings, *, migrate: bool = True) -> AsyncIterator[storage.Sessions]:
    require_database(settings)
    # An older database is brought up to date, as a run would (its past costs back-filled, and marked so).
    async with storage.open_database(settings.database_url, migrate=migrate) as sessions:
        yield sessions


async def _job_id(sessions: storage.Sessions, job_id: str | None) -> str | None:
    """The job a report is about: the one ``job_id`` names (an id, its first characters, or a name), else the newest."""
    if job_id is not None:
        return await storage.resolve_job(sessions, reference=job_id)
    jobs = await storage.list_jobs(sessions, limit=1)
    return jobs[0].id if jobs else None


# How a run left a budget (whether it stopped on it), not where the budget stands: left out of reports.
_RUN_ONLY = frozenset({"over_budget", "stopped"})


async def _budgets(sessions: storage.Sessions, *, job_id: str) -> list[dict[str, Any]]:
    """Where each budget holding the job stands: its own (``--budget``), the named one its latest run held."""
    return [{key: value for key, value in to_json(standing).items() if key not in _RUN_ONLY}
            for standing in await job_budget_standings(sessions, job_id=job_id)]


def budget_figures(budget: dict[str, Any]) -> str:
    """Where a budget stands, in one line: its limit, spent, reserved and left (this period's, for a named one)."""
    period = "" if budget["per"] == "total" else f" this {budget['per']} ({budget['period']})"
    return (f"budget {budget['label']}{period}: limit ${budget['limit']:.6f}, spent ${budget['spent']:.6f}, "
            f"reserved ${budget['reserved']:.6f}, left ${budget['left']:.6f}")


# The largest shared prefixes ``status`` names (the rest counted).
STATUS_CACHE_GROUPS = 5


async def _no_groups() -> list[Any]:
    return []


async def status(*, settings: Settings, job_id: str | None, cache: bool = False) -> dict[str, Any] | None:
    async with _database(settings) as sessions:
        if job_id is None:
            jobs = await storage.list_jobs(sessions)
            return {"jobs": [
                {"job_id": j.id, "name": j.name, "created_at": j.created_at.isoformat(timespec="seconds"),
                 "status": j.status, "prompts": j.prompts, "unfinished_batches": j.unfinished_batches} for j in jobs]}
        job_id = await storage.resolve_job(sessions, reference=job_id)
        # Its prompts by status are summed from those by route and status, one pass over them, not two.
        job = await storage.get_job(sessions, job_id=job_id, counts=False)
        if job is None:
            return None
        # Independent reads, each in a session (a connection) of its own: they run at once, the database's work
        # for one overlapping the others'.
        providers = ProviderTable.from_settings(settings)
        provider_of = provider_lookup(providers)
        batches, ledger, routes, structured, budgets, groups = await asyncio.gather(
            storage.job_batches(sessions, job_id=job_id),
            actual_cost(sessions=sessions, job_id=job_id, provider_of=provider_of),
            storage.route_counts(sessions, job_id=job_id),
            storage.structured_stats(sessions, job_id=job_id),
            _budgets(sessions, job_id=job_id),
            # Asked for (``--cache``): it reads and hashes every stored request, which a job of millions should not
            # pay for.
            _cache_report(sessions, job_id=job_id, settings=settings, providers=providers) if cache else _no_groups(),
        )
        # The groups its recording found and the plan priced then: a few rows of the job's, never its prompts.
        planned = await storage.job_cache_groups(sessions, job_id=job_id, limit=STATUS_CACHE_GROUPS)
        return {
            "job_id": job.id, "name": job.name, "status": job.status, "counts": _by_status(routes),
            "routes": routes,
            "cost": money(ledger.total), "cost_complete": ledger.complete,
            "cost_per_endpoint": {endpoint: {route: money(paid.cost) for route, paid in by_route.items()}
                                  for endpoint, by_route in ledger.endpoints.items()},
            "unpriced_models": dict(ledger.totals.unpriced_models),
            "structured": to_json(structured),
            "cache": to_json(groups) if cache else None,
            "cache_plan": _stored_plan(planned),
            "budgets": budgets,
            "batches": [
                {"id": b.id, "provider": b.provider, "provider_batch_id": b.provider_batch_id, "status": b.status,
                 "model": b.model,
                 "total": b.request_total, "completed": b.request_completed, "failed": b.request_failed,
                 "expires_at": b.expires_at.isoformat(timespec="seconds") if b.expires_at else None,
                 "cancel_requested": b.cancel_requested, "errors_in_a_row": b.error_count,
                 "last_error": b.last_error,
                 "last_error_at": b.last_error_at.isoformat(timespec="seconds") if b.last_error_at else None,
                 "retry_after": b.retry_after.isoformat(timespec="seconds") if b.retry_after else None}
                for b in batches
            ],
        }


async def _cache_report(sessions: storage.Sessions, *, job_id: str, settings: Settings,
                        providers: ProviderTable) -> list[CacheGroupReport]:
    """Each shared prefix's hit rate and saving (``jobs.cache_report``), priced as a run would price them
    (``jobs.load_prices``, whose module loads the send path)."""
    from llm_dispatch.jobs import cache_report

    return await cache_report(sessions, job_id=job_id, provider_of=providers.cache_rules_of,
                              prices=PriceTable.load(path=Path(settings.prices_file) if settings.prices_file else None,
                                                     providers=providers if settings.providers_file else None))


def _stored_plan(planned: storage.StoredCacheGroups) -> dict[str, Any] | None:
    """The cache plan the job's recording priced (None: it found no shared prefix), as JSON."""
    if not planned.total:
        return None
    from llm_dispatch.jobs import CacheEstimate

    plan: dict[str, Any] = to_json(CacheEstimate.stored(planned, enabled=True))
    return plan


def _by_status(routes: Mapping[str, Mapping[str, int]]) -> dict[str, int]:
    """A job's prompts by status (statuses in order, as the database groups them) from those by route and status."""
    counts: dict[str, int] = {}
    for by_status in routes.values():
        for status, n in by_status.items():
            counts[status] = counts.get(status, 0) + n
    return dict(sorted(counts.items()))


def print_status(console: Console, data: dict[str, Any]) -> None:
    if "jobs" in data:
        table = Table(title="jobs (newest first)")
        for column in ("job", "name", "created", "status", "prompts", "open batches"):
            table.add_column(column)
        for job in data["jobs"]:
            table.add_row(job["job_id"][:8], job["name"], job["created_at"], job["status"], str(job["prompts"]),
                          str(job["unfinished_batches"]))
        console.print(table)
        return
    table = Table(title=f"job {data['job_id'][:8]} ({data['name']}): {data['status']}")
    statuses = ("succeeded", "refused", "invalid", "failed", *UNFINISHED_PROMPT_STATUSES)
    table.add_column("route")
    for name in statuses:
        table.add_column(name, justify="right")
    for route, counts in sorted(data["routes"].items()):
        table.add_row(route, *(str(counts.get(name, 0)) for name in statuses))
    unknown = "" if data["cost_complete"] else f" (no price for {', '.join(sorted(data['unpriced_models']))})"
    so_far = dollars(Decimal(str(data["cost"])), unpriced=not data["cost_complete"])
    table.caption = f"cost so far {so_far}{unknown}; `llm-dispatch cost {data['job_id'][:8]}` for details"
    if data.get("structured"):
        table.caption += "\n" + structured_line(data["structured"])
    for budget in data["budgets"]:
        table.caption += "\n" + budget_figures(budget)
    for line in cache_lines(data["cache"] or []):
        table.caption += "\n" + line
    console.print(table)
    plan = data.get("cache_plan")
    if plan:
        from llm_dispatch.jobs import CacheEstimate, describe_cache_estimate

        lines = describe_cache_estimate(CacheEstimate(
            groups=[storage.CacheGroupRow(**row) for row in plan["groups"]], total=plan["total"],
            planned_cost=Decimal(str(plan["planned_cost"])), uncached_cost=Decimal(str(plan["uncached_cost"]))))
        for line in [lines[0] + " (as recorded)", *lines[1:]]:
            console.print(line, highlight=False, soft_wrap=True)
    if data["cost_per_endpoint"]:
        costs = Table(title="cost so far per endpoint and lane")
        for column in ("endpoint", "lane", "cost"):
            costs.add_column(column, justify="right" if column == "cost" else "left")
        for endpoint, by_route in data["cost_per_endpoint"].items():
            for route, paid in by_route.items():
                costs.add_row(endpoint, route, f"${paid:.6f}")
        console.print(costs)
    if data["batches"]:
        batches = Table(title="batches")
        for column in ("id", "provider", "provider id", "model", "status", "completed", "failed", "total", "expires"):
            batches.add_column(column)
        for b in data["batches"]:
            batches.add_row(str(b["id"]), b["provider"], b["provider_batch_id"] or "-", b["model"],
                            b["status"] + (" (cancel requested)" if b["cancel_requested"] else ""),
                            str(b["completed"]), str(b["failed"]), str(b["total"]), b["expires_at"] or "-")
        console.print(batches)
        for b in data["batches"]:
            if b["errors_in_a_row"] or b["status"] == "lost":
                tries = f" ({b['errors_in_a_row']} in a row)" if b["errors_in_a_row"] else ""
                console.print(f"batch {b['id']}: {b['last_error']}{tries}, at {b['last_error_at']}", highlight=False,
                              soft_wrap=True)


async def cost(*, settings: Settings, job_id: str | None) -> dict[str, Any] | None:
    async with _database(settings) as sessions:
        found = await _job_id(sessions, job_id)
        if found is None:
            return None
        # Independent reads, each on a connection of its own: at once.
        ledger, budgets = await asyncio.gather(
            actual_cost(sessions=sessions, job_id=found, provider_of=provider_lookup(ProviderTable.from_settings(settings))),
            _budgets(sessions, job_id=found))
    return {"job_id": found, **to_json(ledger), "currency": "USD", "budgets": budgets}


def print_cost(console: Console, data: dict[str, Any]) -> None:
    table = Table(title=f"job {data['job_id']}: cost in {data['currency']} as stored (prices as of {data['prices_as_of']})")
    for column in ("route", "requests", "input tokens", "cached", "output tokens", "cost"):
        table.add_column(column, justify="right" if column != "route" else "left")
    rows = [(route, r) for route, r in data["routes"].items()]
    for split in ("providers", "endpoints"):  # a job that spans providers or endpoints: a row per each and route
        by_key = data.get(split) or {}
        if len(by_key) > 1:
            rows += [(f"{key} {route}", r) for key, by_route in by_key.items() for route, r in by_route.items()]
    for label, r in rows:
        cost = (f"${r['cost']:.6f} + {r['unpriced']} unpriced" if r["cost"] else "unknown") if r["unpriced"] else \
            f"${r['cost']:.6f}"
        table.add_row(label, str(r["requests"]), str(r["prompt_tokens"]), str(r["cached_tokens"]),
                      str(r["completion_tokens"]), cost)
    table.add_row("total", "", "", "", "", dollars(Decimal(str(data["total"])), unpriced=not data["complete"]))
    table.add_row("saved by discounted lanes", "", "", "", "", f"${data['savings']:.6f}")
    console.print(table)
    for budget in data["budgets"]:
        console.print(budget_figures(budget), highlight=False)
    _print_bases(console, data)
    if not data["complete"]:
        console.print(f"[yellow]warning:[/] no price for {', '.join(sorted(data['unpriced_models']))}: their cost is "
                      "unknown and not in the total; `llm-dispatch reprice --prices-file` shows them under "
                      "your prices", highlight=False)


def _print_bases(console: Console, data: dict[str, Any]) -> None:
    """Which prices the stored costs came from, when it is not one table at answer time."""
    bases = data["priced_with"]
    if len(bases) == 1 and bases[0]["cost_basis"] == "answer" and not bases[0]["prices_file"]:
        return
    for basis in bases:
        source = f"{basis['prices_file']} over the bundled prices" if basis["prices_file"] else "the bundled prices"
        if basis["cost_basis"] == "backfill":
            how = (f"back-filled at migration from their tokens with the bundled prices of {basis['prices_as_of']} "
                   "(not recorded when answered)")
        elif basis["cost_basis"] == "answer":
            how = f"priced when answered with {source} as of {basis['prices_as_of']}"
        else:
            how = "stored without a price table: cost unknown"
        console.print(f"  {counted(basis['requests'], 'request')} {how}", highlight=False)


async def reprice(
    *, settings: Settings, job_id: str | None, prices_file: Path | None, tier: str | None = None,
    route: Route | None = None,
) -> dict[str, Any] | None:
    """The job's stored cost beside its cost under ``prices_file`` (else the bundled table), at ``tier`` or by
    ``route`` when given; writes nothing (not even a migration)."""
    # A declared provider's models are priced by its providers file, as a run prices them.
    table = PriceTable.load(path=prices_file, providers=ProviderTable.from_settings(settings)
                            if settings.providers_file else None)
    from llm_dispatch.jobs import reprice as reprice_job

    async with _database(settings, migrate=False) as sessions:
        await storage.require_current_schema(sessions)
        found = await _job_id(sessions, job_id)
        if found is None:
            return None
        what_if = await reprice_job(sessions=sessions, job_id=found, table=table, tier=tier, route=route)
    payload: dict[str, Any] = to_json(what_if)
    return payload


def print_reprice(console: Console, data: dict[str, Any]) -> None:
    what_if = "".join(f", {name} {data[key]}" for name, key in (("at tier", "tier"), ("all by", "route"))
                      if data.get(key))
    table = Table(title=f"job {data['job_id']}: stored cost vs. prices of {data['prices_file'] or 'the bundled table'} "
                        f"(as of {data['prices_as_of']}){what_if}, USD")
    for column in ("route", "model", "requests", "tokens in/out", "stored", "repriced", "difference"):
        table.add_column(column, justify="left" if column in ("route", "model") else "right")
    for row in data["rows"]:
        stored = f"${row['stored']:.6f}" + (f" + {row['stored_unpriced']} unknown" if row["stored_unpriced"] else "")
        table.add_row(row["route"], row["model"], str(row["requests"]),
                      f"{row['prompt_tokens']}/{row['completion_tokens']}", stored, _dollars(row["repriced"]),
                      _signed(row["difference"]))
    stored, repriced = data["stored"], data["repriced"]
    table.add_section()
    table.add_row("total", "", "", "", f"${stored['total']:.6f}" + ("" if stored["complete"] else " + unknown"),
                  f"${repriced['total']:.6f}" + ("" if repriced["complete"] else " + unknown"),
                  _signed(data["difference"]))
    table.add_row("saved by batch", "", "", "", f"${stored['savings']:.6f}", f"${repriced['savings']:.6f}", "")
    table.caption = "a what-if: the stored costs are unchanged"
    console.print(table)


def _dollars(value: float | None) -> str:
    return "unknown" if value is None else f"${value:.6f}"


def _signed(value: float | None) -> str:
    return "-" if value is None else f"{'+' if value >= 0 else '-'}${abs(value):.6f}"


async def export(*, settings: Settings, job_id: str, fmt: str, output: Path | None,
                 fields: list[str] | None = None) -> int:
    """Write the job's rows as ``jsonl`` (one object a line), ``json`` (one array) or ``csv``; returns how many.
    The columns are checked before ``output`` is opened."""
    from llm_dispatch.jobs import BINARY_FORMATS, plan_export

    async with _database(settings) as sessions:
        job_id = await storage.resolve_job(sessions, reference=job_id)
        plan = await plan_export(sessions=sessions, job_id=job_id, fmt=fmt, fields=fields)
        if output is None:
            return await plan.write(sessions=sessions, handle=sys.stdout)
        if fmt in BINARY_FORMATS:
            with output.open("wb") as binary:
                return await plan.write(sessions=sessions, handle=binary)
        with output.open("w", encoding="utf-8", newline="") as handle:
            return await plan.write(sessions=sessions, handle=handle)


def _split_rows(table: Table, *, actual: Mapping[str, Mapping[str, RouteTotals]],
               estimated: Mapping[str, Mapping[str, RouteTotals]]) -> None:
    """A row per key (a provider, an endpoint) and route: requests answered, tokens, cost and estimate, when the
    job spans more than one key."""
    keys = sorted({*actual, *estimated})
    if len(keys) < 2:
        return
    table.add_section()
    for key in keys:
        for route in ROUTES:
            paid = actual.get(key, {}).get(route)
            guess = estimated.get(key, {}).get(route)
            if paid is None and guess is None:
                continue
            paid = paid or RouteTotals()  # answered nothing yet: estimated only
            table.add_row(
                f"{key} {route}", f"{paid.prompts} req", "", "", "", "", f"{paid.prompt_tokens}/{paid.completion_tokens}",
                _cost(paid), _cost(guess) if guess is not None else "-",
            )


# Groups a report lists one a line; the rest are counted (``--json`` has them all).
CACHE_LINES = 20


def cache_lines(groups: list[dict[str, Any]]) -> list[str]:
    """A line per group of prompts sharing a prefix (the ``cache`` list of the JSON): prompts, estimated prefix
    tokens, cached tokens, hit rate, and the answers' cost paid, uncached and saved."""
    lines = []
    for group in groups[:CACHE_LINES]:
        unpriced = f" ({counted(group['unpriced'], 'answer')} with no price left out)" if group["unpriced"] else ""
        lines.append(f"cache {group['key']} {group['model']}: {group['prompts']:,} prompts, ~{group['prefix_tokens']:,} "
                     f"prefix tokens, {group['cached_tokens']:,} cached, hit rate {group['hit_rate']:.1%}; "
                     f"paid ${group['cost']:.6f}, uncached ${group['uncached_cost']:.6f}, saved ${group['saved']:.6f}"
                     f"{unpriced}")
    if len(groups) > CACHE_LINES:
        lines.append(f"cache: ... and {len(groups) - CACHE_LINES} more groups (--json lists them all)")
    return lines


def structured_line(structured: dict[str, Any]) -> str:
    """One line on a job's answers checked against their schemas (the ``structured`` object of the JSON)."""
    cost = structured.get("reask_cost")
    return (f"structured answers: {structured['valid_first']} valid at first, {structured['valid_after_reasks']} "
            f"valid after re-asks, {structured['still_invalid']} still invalid; "
            f"{counted(structured['reasks'], 're-ask')} cost "
            + ("unknown" if cost is None else f"${cost:.6f}"))


def _cost(totals: RouteTotals) -> str:
    """A route's cost or estimate: "unknown" where none of its prompts' models has a price, never $0."""
    return dollars(totals.cost, unpriced=totals.unpriced)


# A failure's line under the run's table: its kind, its status, and what the provider said, this long at most.
FAILURE_CHARS = 70
_STATUS = re.compile(r"\bHTTP (\d{3})\b")
_SAID = re.compile(r'"message"\s*:\s*"((?:[^"\\]|\\.)*)"')
_AFTER_TRIES = re.compile(r"\bafter \d+ attempts?: ")
# What llm-dispatch adds after the provider's words (the request id, what to do): in the export, not this line.
_ADDED = re.compile(r"\.? Request id \S+.*$")


def failure_line(name: str, message: str) -> str:
    """One line for a kind of failure (its newest stored message): the error class, the HTTP status, and the
    provider's own message (the ``message`` of a JSON error body, else the stored text), cut to ``FAILURE_CHARS``."""
    text = " ".join(message.split())
    status = _STATUS.search(text)
    said = _SAID.search(text)
    if said is not None:
        told = said.group(1).replace('\\"', '"')
    else:
        after = _AFTER_TRIES.search(text)
        told = _ADDED.sub("", text[after.end():]) if after is not None else text
    told = told if len(told) <= FAILURE_CHARS else told[:FAILURE_CHARS - 3].rstrip() + "..."
    return f"{name}" + (f" (HTTP {status.group(1)})" if status else "") + f": {told}"


def job_table(summary: DispatchSummary, *, title: str) -> Table:
    """The table a run ends with: per route, prompts by outcome, tokens, cost and the estimate. A resumed job's
    cost is the whole job's, its estimate this run's (the prompts it had left): the headers say so."""
    # Left-aligned: its lines (failures, notes) are read, not admired.
    table = Table(title=title, caption_justify="left")
    cost_header, estimate_header = ("cost (whole job)", "estimate (this run)") if summary.resumed else (
        "cost", "estimate")
    for column in ("route", "prompts", "succeeded", "refused", "failed", "unfinished", "tokens in/out", cost_header,
                   estimate_header):
        table.add_column(column, justify="left" if column == "route" else "right")
    report = summary.report
    cost, estimate, stats = report.cost, report.estimate, report.stats
    for route in ROUTES:
        statuses = report.routes.get(route, {})
        if not statuses and route not in ("realtime", "batch"):
            continue  # a lane no prompt took
        actual = cost.routes.get(route) or RouteTotals()
        guess = estimate.routes.get(route) if estimate is not None else None
        table.add_row(
            route, str(sum(statuses.values())), str(statuses.get("succeeded", 0)), str(statuses.get("refused", 0)),
            str(statuses.get("failed", 0)), str(unfinished(statuses)),
            f"{actual.prompt_tokens}/{actual.completion_tokens}",
            _cost(actual), _cost(guess) if guess is not None else "-",
        )
    # A job that spans providers or endpoints: a row per provider and route, and per endpoint and lane.
    _split_rows(table, actual=cost.providers, estimated=estimate.providers if estimate is not None else {})
    _split_rows(table, actual=cost.endpoints, estimated=estimate.endpoints if estimate is not None else {})
    table.add_section()
    table.add_row("total", str(sum(report.counts.values())), str(report.counts.get("succeeded", 0)),
                  str(report.counts.get("refused", 0)), str(report.counts.get("failed", 0)),
                  str(report.unfinished), "",
                  dollars(cost.total, unpriced=not cost.complete),
                  dollars(estimate.total, unpriced=not estimate.complete) if estimate is not None else "-")
    table.caption = (
        f"saved by the Batch API and discounted lanes: ${money(cost.savings):.6f}   prices as of {cost.prices_as_of}"
        + (f" ({cost.backfilled} back-filled at migration)" if cost.backfilled else "")
        + ("" if cost.complete else f"   NO PRICE for {', '.join(sorted(cost.unpriced_models))}")
    )
    for name, count in sorted(report.failed_by_class.items()):
        table.add_row(f"  failed: {name}", "", "", "", str(count), "", "", "", "")
    # What each kind of failure was, as stored with it: the provider's words and what to change.
    for name, message in sorted(stats.failure_messages.items()):
        table.caption += "\n" + escape(failure_line(name, message))  # the provider's words, never markup
    kinds = [f"{getattr(stats, key)} {label}" for key, label in (
        ("refused", "refused (sent again only with --retry-refused)"),
        ("truncated", "truncated (cut at max_tokens or the context window: raise max_tokens to get all of them)"),
        ("tool_calls", "with tool calls (in the export's tool_calls)")) if getattr(stats, key)]
    if kinds:
        table.caption += "\nanswers: " + "; ".join(kinds)
    if report.structured is not None:
        table.caption += "\n" + structured_line(to_json(report.structured))
    for line in cache_lines(to_json(report.cache)):
        table.caption += "\n" + line
    if stats.billed_unanswered:
        table.caption += (f"\n{counted(stats.billed_unanswered, 'attempt')} may have been billed with no answer kept (a "
                          "generation timed out or cut off, a 2xx that was no answer): see maybe_billed in the export")
    if stats.reasoning_tokens:
        table.caption += f"\nreasoning tokens (in the output tokens): {stats.reasoning_tokens}"
    if summary.budget is not None:
        table.caption += "\n" + budget_figures(to_json(summary.budget))
    if stats.p50_latency_ms is not None:
        table.caption += f"\nreal-time latency p50 / p95: {stats.p50_latency_ms:.0f} / {stats.p95_latency_ms:.0f} ms"
    return table
