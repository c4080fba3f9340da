"""Flow ``dispatch``, the main one: record and route the prompts, send the urgent ones now and the rest
through the Batch API at the same time, and report counts, cost, the estimate and the savings."""

from __future__ import annotations

import asyncio
import time
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal

from prefect import flow, get_run_logger
from prefect.artifacts import acreate_markdown_artifact, acreate_table_artifact
from prefect.utilities.annotations import quote
from pydantic import SecretStr

import storage
from llm_dispatch import ConfigError, Settings
from llm_dispatch._dispatch import current_progress
from llm_dispatch._pricing import PriceTable
from tasks import record_prompts, routing_rules
from tasks.costs import JobCost, actual_cost, estimate_cost, money

from .batch import dispatch_batches
from ._setup import with_api_key
from .realtime import build_settings, dispatch_realtime


class BudgetExceededError(ConfigError):
    """The pre-run estimate is above ``max_cost``: nothing was sent."""


@flow(name="dispatch", log_prints=False)
async def dispatch(
    prompts: str | list[dict[str, Any]] | None = None,
    job_id: str | None = None,
    model: str | None = None,
    route_policy: Literal["length", "all-realtime", "all-batch"] | None = None,
    urgent_below_chars: int | None = None,
    wait: bool = False,
    max_cost: float | None = None,
    concurrency: int | None = None,
    chunk_size: int | None = None,
    chunk_concurrency: int | None = None,
    concurrency_tag: str | None = None,
    dedupe: bool | None = None,
    retry_failed: Literal["retryable", "all", "none"] = "retryable",
    base_url: str | None = None,
    database_url: SecretStr | None = None,
    prices_file: str | None = None,
    batch_poll_interval: float | None = None,
    shards: int = 1,
    realtime_deployment: str = "realtime-dispatch/realtime",
) -> dict[str, Any]:
    """Send a mixed set of prompts: urgent ones as concurrent real-time calls, the rest to the Batch API
    at half price, both at once. Each prompt is routed by its ``urgency``, else its ``deadline``, else
    ``route_policy``; the decision and its reason are stored with it.

    ``wait`` follows the batches to the end in this run; otherwise the run ends once they are
    submitted, and the ``collect-batches`` flow (on a schedule) finishes them. ``max_cost`` refuses a run
    whose estimate is higher, before any request. Re-running the same input resumes its job.

    ``shards`` > 1 splits the real-time half into that many runs of ``realtime_deployment`` on the work
    pool, so several workers share the job; they must reach the same database (Postgres by
    ``LLM_DISPATCH_DATABASE_URL`` in the workers' environment) and the tag limit bounds them together.
    """
    if shards < 1:
        raise ConfigError(f"shards must be at least 1, got {shards}")
    settings = build_settings(
        model=model, route_policy=route_policy, urgent_below_chars=urgent_below_chars, concurrency=concurrency,
        chunk_size=chunk_size, chunk_concurrency=chunk_concurrency, concurrency_tag=concurrency_tag, dedupe=dedupe,
        base_url=base_url, prices_file=prices_file, batch_poll_interval=batch_poll_interval,
        database_url=database_url.get_secret_value() if database_url is not None else None,
    )
    return await run_dispatch(source=prompts, job_id=job_id, settings=settings, wait=wait, max_cost=max_cost,
                              retry_failed=retry_failed, shards=shards, realtime_deployment=realtime_deployment)


async def run_dispatch(
    *,
    source: Any,
    job_id: str | None,
    settings: Settings,
    wait: bool,
    max_cost: float | None = None,
    retry_failed: Literal["retryable", "all", "none"] = "retryable",
    shards: int = 1,
    realtime_deployment: str = "realtime-dispatch/realtime",
) -> dict[str, Any]:
    logger = get_run_logger()
    started = time.monotonic()
    settings = await with_api_key(settings)
    table = PriceTable.load(path=Path(settings.prices_file) if settings.prices_file else None)
    engine = storage.create_engine(settings.database_url)
    try:
        await storage.migrate(engine)
        sessions = storage.session_factory(engine)
        job = await record_prompts(source=quote(source), job_id=job_id, settings=settings, sessions=sessions,
                                   rules=routing_rules(settings))
        estimate = await estimate_cost(sessions=sessions, job_id=job.job_id, table=table,
                                       typical_completion_tokens=settings.typical_completion_tokens,
                                       retry_failed=retry_failed, dedupe=settings.dedupe)
        described = describe_estimate(estimate)
        logger.info("job %s: estimate %s", job.job_id, described)
        progress = current_progress.get()
        if progress is not None:
            progress.notes.append(f"estimate: {described}")
        _check_budget(estimate, max_cost=max_cost)
        await storage.set_job_status(sessions, job_id=job.job_id, status="running")

        realtime_done = asyncio.Event()

        async def realtime_half() -> dict[str, Any]:
            try:
                if shards > 1:
                    return await run_shards(job_id=job.job_id, settings=settings, shards=shards,
                                            deployment=realtime_deployment, retry_failed=retry_failed)
                return await dispatch_realtime(source=None, job_id=job.job_id, settings=settings,
                                               retry_failed=retry_failed, planned_route="realtime")
            finally:
                realtime_done.set()

        async with asyncio.TaskGroup() as group:
            realtime = group.create_task(realtime_half())
            batch = group.create_task(dispatch_batches(job_id=job.job_id, settings=settings, wait=wait,
                                                       retry_failed=retry_failed, realtime_done=realtime_done))
        summary = await job_summary(sessions, job_id=job.job_id, table=table, estimate=estimate)
        summary.update(
            resumed=job.resumed, prompts=job.total, wait=wait, wall_s=round(time.monotonic() - started, 3),
            realtime=_realtime_part(realtime.result()), batch=batch.result(),
        )
        await storage.set_job_status(sessions, job_id=job.job_id,
                                     status="finished" if summary["unfinished"] == 0 else "running")
        await publish_artifacts(summary)
        logger.info("job %s: %s", job.job_id, {k: summary[k] for k in ("counts", "cost", "unfinished")})
        return summary
    finally:
        await engine.dispose()


async def run_shards(
    *, job_id: str, settings: Settings, shards: int, deployment: str, retry_failed: str
) -> dict[str, Any]:
    """The real-time half as ``shards`` deployment runs (one per shard of the prompts), awaited together."""
    from prefect.deployments import run_deployment

    logger = get_run_logger()
    parameters = {
        "job_id": job_id, "planned_route": "realtime", "shards": shards, "retry_failed": retry_failed,
        "model": settings.model, "concurrency": settings.concurrency, "chunk_size": settings.chunk_size,
        "chunk_concurrency": settings.chunk_concurrency, "concurrency_tag": settings.concurrency_tag,
        "dedupe": settings.dedupe, "base_url": settings.base_url,
    }
    runs = await asyncio.gather(*(
        run_deployment(deployment, parameters={**parameters, "shard": index}, timeout=None)  # type: ignore[misc]
        for index in range(shards)
    ))
    failed = [run.name for run in runs if run.state is None or not run.state.is_completed()]
    if failed:
        raise RuntimeError(f"real-time shard runs {failed} did not complete; see them in the Prefect UI, "
                           "then run the job again to send what they left")
    logger.info("job %s: %d real-time shard runs completed", job_id, shards)
    return {"sent_prompts": None, "reused": None, "failed_by_class": {}, "send_s": None, "phases_s": None,
            "shards": [str(run.id) for run in runs]}


def _check_budget(estimate: JobCost, *, max_cost: float | None) -> None:
    if max_cost is None:
        return
    if not estimate.complete:
        models = ", ".join(sorted(estimate.totals.unpriced_models))
        raise BudgetExceededError(
            f"cannot check --max-cost {max_cost}: no price for {models}; add it to a price file "
            "(LLM_DISPATCH_PRICES_FILE) or drop --max-cost. Nothing was sent"
        )
    if estimate.total > Decimal(str(max_cost)):
        raise BudgetExceededError(
            f"estimated cost ${money(estimate.total):.6f} is above --max-cost ${max_cost}; nothing was sent. "
            "Raise the limit, route more prompts to the Batch API, or send fewer prompts"
        )


def describe_estimate(estimate: JobCost) -> str:
    parts = [
        f"{route} {cost.prompts} requests ~${money(cost.cost):.6f}"
        for route, cost in (("realtime", estimate.totals.realtime), ("batch", estimate.totals.batch)) if cost.prompts
    ]
    text = ", ".join(parts) or "nothing to send"
    text += f"; total ~${money(estimate.total):.6f} (at most ${money(estimate.max_total):.6f})"
    if not estimate.complete:
        text += f"; NO PRICE for {', '.join(sorted(estimate.totals.unpriced_models))}: their cost is unknown"
    return text


def _realtime_part(summary: dict[str, Any]) -> dict[str, Any]:
    return {key: summary.get(key) for key in ("sent_prompts", "reused", "failed_by_class", "send_s", "phases_s",
                                              "shards")}


async def job_summary(sessions: Any, *, job_id: str, table: PriceTable, estimate: JobCost | None = None) -> dict[str, Any]:
    """Counts per route and status, failures by class, latency, tokens, cost and savings of a job."""
    counts = await storage.job_counts(sessions, job_id=job_id)
    by_route = await storage.route_counts(sessions, job_id=job_id)
    stats = await storage.result_stats(sessions, job_id=job_id)
    cost = await actual_cost(sessions=sessions, job_id=job_id, table=table)
    summary: dict[str, Any] = {
        "job_id": job_id,
        "counts": counts,
        "routes": by_route,
        "unfinished": sum(counts.get(s, 0) for s in ("pending", "in_flight", "batched")),
        "failed_by_class": dict(stats.failed_by_class),
        "stats": stats.as_dict(),
        "cost": cost.as_dict(),
    }
    if estimate is not None:
        summary["estimate"] = estimate.as_dict()
    return summary


async def publish_artifacts(summary: dict[str, Any]) -> None:
    """A table (one row per route) and a markdown report on the flow run, for the Prefect UI."""
    rows = []
    for route in ("realtime", "batch"):
        statuses = summary["routes"].get(route, {})
        cost = summary["cost"]["routes"].get(route, {})
        estimate = (summary.get("estimate") or {}).get("routes", {}).get(route, {})
        rows.append({
            "route": route,
            "prompts": sum(statuses.values()),
            "succeeded": statuses.get("succeeded", 0),
            "failed": statuses.get("failed", 0),
            "unfinished": sum(statuses.get(s, 0) for s in ("pending", "in_flight", "batched")),
            "prompt_tokens": cost.get("prompt_tokens", 0),
            "completion_tokens": cost.get("completion_tokens", 0),
            "cost_usd": cost.get("cost", 0.0),
            "estimate_usd": estimate.get("cost"),
        })
    job = summary["job_id"]
    key = f"dispatch-{job[:8]}"
    await acreate_table_artifact(table=rows, key=f"{key}-routes", description=f"job {job}: per route")
    await acreate_markdown_artifact(markdown=report_markdown(summary), key=f"{key}-report",
                                    description=f"job {job}: report")


def report_markdown(summary: dict[str, Any]) -> str:
    cost, stats = summary["cost"], summary["stats"]
    lines = [
        f"# Job `{summary['job_id']}`",
        "",
        "| | |", "|---|---|",
        f"| prompts | {sum(summary['counts'].values())} |",
        f"| succeeded | {summary['counts'].get('succeeded', 0)} |",
        f"| failed | {summary['counts'].get('failed', 0)} |",
        f"| unfinished | {summary['unfinished']} |",
        f"| latency p50 / p95 (real-time) | {_ms(stats.get('p50_latency_ms'))} / {_ms(stats.get('p95_latency_ms'))} |",
        f"| cost | ${cost['total']:.6f}{'' if cost['complete'] else ' + unknown (no price for some models)'} |",
        f"| saved by the Batch API | ${cost['savings']:.6f} |",
    ]
    if "estimate" in summary:
        lines.append(f"| estimate before sending | ${summary['estimate']['total']:.6f} |")
    lines.append(f"| prices as of | {cost['prices_as_of']} |")
    if summary["failed_by_class"]:
        lines += ["", "## Failures", "", "| class | prompts |", "|---|---|"]
        lines += [f"| {name} | {n} |" for name, n in sorted(summary["failed_by_class"].items())]
    return "\n".join(lines) + "\n"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} ms"


@flow(name="dispatch-directory", log_prints=False)
async def dispatch_directory(
    directory: str,
    pattern: str = "*.jsonl",
    wait: bool = False,
    model: str | None = None,
    route_policy: Literal["length", "all-realtime", "all-batch"] | None = None,
    max_cost: float | None = None,
) -> dict[str, Any]:
    """Dispatch every prompt file in ``directory`` matching ``pattern`` that has not been finished yet,
    oldest name first: meant for a schedule over a drop folder. A file already finished is skipped; one
    recorded but unfinished resumes its job (nothing already answered is paid again)."""
    from llm_dispatch._inputs import fingerprint

    from tasks.record import load_specs

    logger = get_run_logger()
    settings = build_settings(model=model, route_policy=route_policy)
    folder = Path(directory)
    if not folder.is_dir():
        raise ConfigError(f"{directory} is not a directory; give the folder the prompt files are dropped in")
    done: list[str] = []
    skipped: list[str] = []
    for path in sorted(folder.glob(pattern)):
        specs = load_specs(path, settings=settings)
        engine = storage.create_engine(settings.database_url)
        try:
            await storage.migrate(engine)
            sessions = storage.session_factory(engine)
            job_id = await storage.find_job(sessions, fingerprint=fingerprint(specs))
            job = await storage.get_job(sessions, job_id=job_id) if job_id else None
        finally:
            await engine.dispose()
        if job is not None and job.status == "finished":
            skipped.append(path.name)
            continue
        summary = await run_dispatch(source=str(path), job_id=None, settings=settings, wait=wait, max_cost=max_cost)
        done.append(path.name)
        logger.info("%s: job %s, %s", path.name, summary["job_id"], summary["counts"])
    logger.info("dispatched %d files, skipped %d already finished", len(done), len(skipped))
    return {"dispatched": done, "skipped": skipped}
