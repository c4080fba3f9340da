"""The read-only commands: ``status``, ``cost``, ``reprice``, ``export`` and ``models``. They change nothing and
load neither Prefect nor the send path (a test runs each in a fresh interpreter): each imports what it reads when
it runs."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from llm_dispatch.core import LLMDispatchError

from ._common import AsJson, DatabaseUrl, _fail, _settings, err, out

NewestJob = Annotated[Optional[str], typer.Argument(help="a job id (default: the newest job)")]


def status(
    job: Annotated[Optional[str], typer.Argument(help="a job id (default: the newest jobs)")] = None,
    database_url: DatabaseUrl = None,
    cache: Annotated[bool, typer.Option(
        "--cache", help="also each shared prefix's cache hit rate and saving (reads every stored request: about "
                        "a second per 5,000 answers)")] = False,
    as_json: AsJson = False,
) -> None:
    """Jobs, their prompts per route and status, and their batches."""
    _report("status", job=job, database_url=database_url, as_json=as_json, cache=cache)


def models(
    prices_file: Annotated[Optional[Path], typer.Option(help="your own price table (JSON), over the bundled one")] = None,
    provider: Annotated[Optional[str], typer.Option(help="only this provider's models: openai|anthropic|gemini")] = None,
    as_json: AsJson = False,
) -> None:
    """The model catalog: each model's prices, context window, maximum output, shutdown date and where its figures
    come from, as a run prices them today."""
    from llm_dispatch.core import PROVIDERS, PriceTable

    from .catalog import catalog, print_catalog

    if provider is not None and provider not in PROVIDERS:
        raise _fail(f"--provider must be one of {', '.join(PROVIDERS)}, not {provider!r}")
    prices = prices_file if prices_file is not None else _settings().prices_file
    try:
        table = PriceTable.load(path=Path(prices) if prices else None)
    except LLMDispatchError as exc:
        raise _fail(str(exc)) from None
    data = catalog(table, provider=provider)
    if as_json:
        print(json.dumps(data, indent=2))
    else:
        print_catalog(out, data)


def cost(
    job: NewestJob = None,
    database_url: DatabaseUrl = None,
    prices_file: Annotated[Optional[Path], typer.Option(hidden=True)] = None,
    as_json: AsJson = False,
) -> None:
    """What a job cost per route, as stored with each answer when it came, and what the Batch API saved."""
    if prices_file is not None:
        raise _fail("cost shows what each answer cost when it was stored; to see a job under other prices, "
                    f"run `llm-dispatch reprice {job or ''} --prices-file {prices_file}`".replace("  ", " "))
    _report("cost", job=job, database_url=database_url, as_json=as_json)


def reprice(
    job: NewestJob = None,
    prices_file: Annotated[Optional[Path], typer.Option(help="the price table (JSON) to try, over the bundled one")] = None,
    tier: Annotated[Optional[str], typer.Option(
        help="what if every real-time answer had been served at this service tier (standard, flex, priority...)")] = None,
    route: Annotated[Optional[str], typer.Option(help="what if every answer had been sent this way: realtime|batch")] = None,
    database_url: DatabaseUrl = None,
    as_json: AsJson = False,
) -> None:
    """What a job would cost under another price table, service tier or route, beside its stored cost; changes
    nothing."""
    if prices_file is None and tier is None and route is None:
        raise _fail("give --prices-file FILE (a price table), --tier TIER or --route ROUTE: what to reprice the job with")
    if route not in (None, "realtime", "batch"):
        raise _fail(f"--route must be realtime or batch, not {route!r}")
    _report("reprice", job=job, database_url=database_url, as_json=as_json, prices_file=prices_file, tier=tier,
            route=route)


def _report(name: str, *, job: str | None, database_url: str | None, as_json: bool, **options: Any) -> None:
    """Run the report ``reports.<name>``; print it as a table (``reports.print_<name>``) or JSON."""
    from . import reports

    settings = _settings(database_url=database_url)
    query, show = getattr(reports, name), getattr(reports, f"print_{name}")
    data = asyncio.run(query(settings=settings, job_id=job, **options))
    if data is None:
        where = settings.public_dict()["database_url"]
        raise _fail(f"no job {job or ''!r} in {where}; `llm-dispatch status` lists jobs")
    if as_json:
        out.print_json(json.dumps(data, default=str))
    else:
        show(out, data)


def export(
    job: Annotated[str, typer.Argument(help="the job to export: its id (or the id's first characters) or its name")],
    fmt: Annotated[Optional[str], typer.Option(
        "--format", help="jsonl (default), csv, parquet, or npy (the embedding vectors alone, float32)")] = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="file to write (default: stdout)")] = None,
    fields: Annotated[Optional[str], typer.Option(
        "--fields", help="columns, comma-separated: built-in names, metadata keys, or all (default: id, prompt, "
                         "answer, status, error, model, tokens, cost_usd, latency_ms, then each metadata key)")] = None,
    database_url: DatabaseUrl = None,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON array of the rows (instead of --format)")] = False,
) -> None:
    """Every prompt of JOB in input order, ready for scoring: the user's id, the prompt, the answer, status, error,
    tokens, cost, latency and the prompt's metadata as columns; for a job with a schema, each field of the parsed
    answer as a column of its own (typed in Parquet), its violation, re-asks and cost with them."""
    from . import reports

    if as_json and fmt is not None:
        raise _fail("give --json or --format, not both")
    if fmt not in (None, "jsonl", "csv", "parquet", "npy"):
        raise _fail(f"--format must be jsonl, csv, parquet or npy, not {fmt!r}")
    if fmt in ("parquet", "npy") and output is None:
        raise _fail(f"--format {fmt} writes a file: give --output FILE.{fmt}")
    fmt = "json" if as_json else fmt or "jsonl"
    chosen = [name.strip() for name in fields.split(",") if name.strip()] if fields is not None else None
    if chosen == []:
        raise _fail("--fields names no column; give names separated by commas, or leave it out for the default ones")
    settings = _settings(database_url=database_url)
    written = asyncio.run(reports.export(settings=settings, job_id=job, fmt=fmt, output=output, fields=chosen))
    if output is not None:
        err.print(f"wrote {written} rows to {output}", highlight=False)
