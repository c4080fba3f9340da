"""Flow ``dispatch``, the main one: record and route the prompts, send the urgent ones now and the rest
through the Batch API at the same time, and report counts, cost, the estimate and the savings."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.utilities.annotations import quote
from pydantic import SecretStr

from llm_dispatch import storage
from llm_dispatch.jobs import (
    CACHE_REPORT_MAX_PROMPTS,
    BatchHalfSummary,
    CachePlanning,
    DirectorySummary,
    DispatchSummary,
    JobCost,
    RealtimeSummary,
    Selection,
    ShardRuns,
    budget_standing,
    check_budget_bounds,
    describe_cache_estimate,
    estimate_cost,
    fingerprint_of,
    job_report,
    money,
    open_run,
    replan_pending,
    routing_rules,
    run_budget,
)
from llm_dispatch.core import (
    counted,
    dollars,
    BudgetExceededError,
    Endpoint,
    ConfigError,
    RetryFailed,
    RoutePolicy,
    Settings,
    ShardRunsFailedError,
    current_progress,
    setting_overrides,
    shard_parameters,
)
from llm_dispatch.tasks import record_prompts, run_state

from ._artifacts import publish_report
from ._setup import input_run_name, prepare, scheduled_job_name
from ._states import BUDGET_REACHED, MAX_COST_REFUSED, failed_prompts, final_state
from ._batch_half import dispatch_batches
from ._realtime_half import lane_count, send_realtime


@flow(name="dispatch", flow_run_name=input_run_name, log_prints=False)
async def dispatch(
    prompts: str | list[dict[str, Any]] | None = None,
    job_id: str | None = None,
    model: str | None = None,
    allow_unknown_model: bool | None = None,
    endpoint: Endpoint | None = None,
    route_policy: RoutePolicy | None = None,
    urgent_below_chars: int | None = None,
    wait: bool = False,
    max_cost: float | None = None,
    concurrency: int | None = None,
    chunk_size: int | None = None,
    chunk_concurrency: int | None = None,
    concurrency_tag: str | None = None,
    dedupe: bool | None = None,
    retry_failed: RetryFailed = "retryable",
    retry_refused: bool = False,
    base_url: str | None = None,
    anthropic_base_url: str | None = None,
    gemini_base_url: str | None = None,
    database_url: SecretStr | None = None,
    prices_file: str | None = None,
    providers_file: str | None = None,
    provider_base_urls: dict[str, str] | None = None,
    batch_poll_interval: float | None = None,
    shards: int = 1,
    realtime_deployment: str = "realtime-dispatch/realtime",
    new_job: bool = False,
    job_name: str | None = None,
    answer_schema: str | dict[str, Any] | None = None,
    max_reasks: int | None = None,
    cache_plan: bool | None = None,
    budget: float | None = None,
    budget_name: str | None = None,
    fail_above: float = 0.0,
) -> Any:
    """Send a mixed set of prompts: urgent ones as concurrent real-time calls, the rest to the Batch API
    at half price, both at once. Each prompt is routed by its ``urgency``, else its ``deadline``, else
    ``route_policy``; the decision and its reason are stored with it.

    ``wait`` follows the batches to the end in this run; otherwise the run ends once they are
    submitted, and the ``collect-batches`` flow (on a schedule) finishes them. ``max_cost`` refuses a run
    whose estimate is higher, before any request. ``budget`` (dollars over the job's life) or ``budget_name`` (a
    budget shared by every run that names it) is a cap that holds: each request's worst case is reserved before
    it is sent; once the next does not fit, the run finishes what is out, leaves the rest pending and ends in the
    state ``BudgetReached`` (the same run with a higher budget continues). A run with failed prompts ends
    ``Failed`` (its result still returned in the state), unless they are no more than ``fail_above`` (a share) of
    the job's: then ``Completed``, the state's message counting them. A run refused by ``max_cost`` ends in the
    ``Failed`` state ``MaxCostRefused``.

    Re-running the same input resumes its job; ``new_job`` starts a new one. ``job_name`` names the job
    (and a re-run with the same name and input resumes it); a run started by a deployment's schedule is
    named after its input and the day it was scheduled for (``questions-2026-11-26``), so each night's
    run of a fixed file is a job of its own. ``answer_schema`` (a JSON Schema file, or ``module:Model`` for a Pydantic
    model, reachable from the worker; or a JSON Schema itself, as ``core.pydantic_schema`` makes one) is every prompt's answer schema unless it gives its own; an invalid answer is
    asked again up to ``max_reasks`` times (default 2). ``retry_refused`` asks the prompts the model refused again (a
    refusal is an answer, so ``retry_failed`` leaves them alone).

    ``shards`` > 1 splits the real-time half into that many runs of ``realtime_deployment`` on the work
    pool, so several workers share the job; they must reach the same database (Postgres by
    ``LLM_DISPATCH_DATABASE_URL`` in the workers' environment) and the tag limit bounds them together.
    """
    if shards < 1:
        raise ConfigError(f"shards must be at least 1, got {shards}")
    settings = Settings.with_overrides(**setting_overrides(locals(), door="dispatch"))
    try:
        summary = await run_dispatch(source=prompts, job_id=job_id, settings=settings, wait=wait, max_cost=max_cost,
                                     retry_failed=retry_failed, retry_refused=retry_refused, shards=shards,
                                     realtime_deployment=realtime_deployment, new_job=new_job, job_name=job_name,
                                     replan=route_policy in REPLANNED)
    except BudgetExceededError as exc:
        # Raised to the caller as before; the UI names why nothing was sent.
        return run_state(exc, failure=str(exc), name=MAX_COST_REFUSED)
    return final_state(summary, budget=summary.budget, fail_above=fail_above)


# Route policies that re-plan a resumed job's pending prompts when given (``jobs.replan_pending``): all-realtime
# moves every one real-time (the way out of an endpoint with no Batch API), all-batch every one a batch can still
# answer by its deadline. ``length`` is decided per prompt when it is recorded (urgency and deadline first), and stays.
REPLANNED = frozenset({"all-realtime", "all-batch"})


async def run_dispatch(
    *,
    source: Any,
    job_id: str | None,
    settings: Settings,
    wait: bool,
    max_cost: float | None = None,
    retry_failed: RetryFailed = "retryable",
    retry_refused: bool = False,
    shards: int = 1,
    realtime_deployment: str = "realtime-dispatch/realtime",
    new_job: bool = False,
    job_name: str | None = None,
    replan: bool = False,
) -> DispatchSummary:
    """The recipe behind ``dispatch``: record and route, estimate, then both halves at once, then report.

    ``replan``: a resumed job's pending prompts are routed by the policy given (``--route all-realtime`` or
    ``all-batch``), whatever route was stored when they were recorded."""
    logger = get_run_logger()
    started = time.monotonic()
    settings = await prepare(settings, logger=logger, tag_limit=True)
    if job_name is None and job_id is None:
        job_name = scheduled_job_name(source)
    async with open_run(settings) as run:
        table = run.prices
        rules = routing_rules(settings)
        # A new job's first chunks per lane go out while the rest of it is stored, routed and priced by its check
        # pass; the batch half starts once it is all stored. Shards read a job stored whole.
        head = settings.chunk_size * lane_count(settings) if shards == 1 else None
        job = await record_prompts(source=quote(source), job_id=job_id, settings=settings, sessions=run.sessions,
                                   name=job_name, new_job=new_job, retry_failed=retry_failed,
                                   rules=rules, estimate=True, head=head)
        run.clients.require(job.providers)  # a missing key stops the run here, before anything is sent
        if replan and job.resumed:
            moved = await replan_pending(run.sessions, job_id=job.job_id, rules=routing_rules(settings),
                                         now=datetime.now(UTC))
            if moved:
                logger.info("Job %s: %d pending prompts re-routed by --route %s.", job.job_id, moved,
                            settings.route_policy)
        if retry_refused:
            # Before the estimate, which then counts them.
            reopened = await storage.reopen_refused(run.sessions, job_id=job.job_id)
            logger.info("Job %s: %d refused prompts are asked again (--retry-refused).", job.job_id, reopened)
        estimate = await estimate_cost(sessions=run.sessions, job_id=job.job_id, table=table,
                                       typical_completion_tokens=settings.typical_completion_tokens,
                                       retry_failed=retry_failed, dedupe=settings.dedupe,
                                       provider_of=run.clients.provider_of,
                                       recorded=None if job.resumed else job.sums,
                                       cache=CachePlanning(provider_of=run.clients.providers.cache_rules_of,
                                                           concurrency=settings.concurrency,
                                                           enabled=settings.cache_plan,
                                                           recorded=None if job.resumed else job.cache))
        described = describe_estimate(estimate)
        logger.info("Job %s: estimated cost %s.", job.job_id, described)
        progress = current_progress.get()
        if progress is not None:
            progress.notes.append(f"estimate: {described}")
        for line in describe_cache_estimate(estimate.cache) if estimate.cache is not None else ():
            logger.info("Job %s: %s", job.job_id, line)
            if progress is not None:
                progress.notes.append(line)
        _check_budget(estimate, max_cost=max_cost)
        held = await run_budget(settings, sessions=run.sessions, job_id=job.job_id)
        if held is not None:
            check_budget_bounds(estimate, budget=held)
        stored = asyncio.Event()
        if not job.rest:
            stored.set()
            await storage.set_job_status(run.sessions, job_id=job.job_id, status="running")
        # Else the job leaves ``recording`` with its last slice, stored by the real-time half as it sends.

        realtime_done = asyncio.Event()

        async def realtime_half() -> RealtimeSummary | ShardRuns:
            try:
                if shards > 1:
                    return await run_shards(job_id=job.job_id, settings=settings, shards=shards,
                                            deployment=realtime_deployment, retry_failed=retry_failed,
                                            label=job.name)
                selection = Selection(retry_failed=retry_failed, planned_route="realtime")
                return await send_realtime(run=run, job=job, selection=selection, budget=held, job_stats=False,
                                           rules=rules, on_stored=stored.set)
            finally:
                stored.set()  # never leave the batch half waiting, whatever became of this half
                realtime_done.set()

        async def batch_half() -> BatchHalfSummary:
            try:
                await stored.wait()
                return await dispatch_batches(run=run, job_id=job.job_id, wait=wait, retry_failed=retry_failed,
                                              realtime_done=realtime_done)
            except Exception:
                # The batch half's failure does not cancel the real-time half: it ends first, its answers stored.
                await realtime_done.wait()
                raise

        async with asyncio.TaskGroup() as group:
            realtime = group.create_task(realtime_half())
            batch = group.create_task(batch_half())
        # Each shared prefix's caching, read back from every stored request: for a job of at most
        # CACHE_REPORT_MAX_PROMPTS (past it, `llm-dispatch status JOB --cache` reads it when asked).
        report = await job_report(run.sessions, job_id=job.job_id, estimate=estimate,
                                  provider_of=run.clients.provider_of, prices=run.prices,
                                  cache_rules_of=(run.clients.providers.cache_rules_of
                                                  if job.total <= CACHE_REPORT_MAX_PROMPTS else None))
        standing = None
        if held is not None:
            half = realtime.result()
            reached = batch.result().budget_reached or (
                half.budget is not None and half.budget.stopped if isinstance(half, RealtimeSummary)
                else half.budget_reached > 0)
            # What the budget left pending, whichever half (or shard) it stopped.
            over = report.counts.get("pending", 0) if reached else 0
            standing = await budget_standing(run.sessions, budget=held, over_budget=over)
        await storage.set_job_status(run.sessions, job_id=job.job_id,
                                     status="running" if report.unfinished else "finished")
    half = realtime.result()
    if isinstance(half, RealtimeSummary):
        # The job's statistics once both halves are done: the report's (the half left them out).
        half = replace(half, stats=report.stats)
    summary = DispatchSummary(report=report, resumed=job.resumed, prompts=job.total, wait=wait,
                              realtime=half, batch=batch.result(), wall_s=time.monotonic() - started,
                              job_name=job.name, answered_before=job.answered,
                              started_over_from=job.started_over_from, budget=standing)
    await publish_report(summary, logger=logger)
    counts = report.counts
    logger.info("Job %s: %d succeeded, %d failed, %d unfinished; cost %s.", job.job_id, counts.get("succeeded", 0),
                counts.get("failed", 0), report.unfinished, dollars(report.cost.total, unpriced=not report.cost.complete))
    return summary


async def run_shards(
    *, job_id: str, settings: Settings, shards: int, deployment: str, retry_failed: str, label: str
) -> ShardRuns:
    """The real-time half as ``shards`` deployment runs (one per shard of the prompts), awaited together;
    each named for its share of the job ``label`` names (``shard 2/4 of questions.jsonl``, by ``input_run_name``) and
    given every setting this run has but the database URL (``shard_parameters``), so that it sends as this run would."""
    from prefect.deployments import run_deployment

    logger = get_run_logger()
    # run_deployment is typed as FlowRun or its coroutine (it is sync-compatible); called here it is the coroutine.
    runs = await asyncio.gather(*(  # type: ignore[arg-type]
        run_deployment(deployment, timeout=None,
                       parameters=shard_parameters(settings, job_id=job_id, job_name=label, planned_route="realtime",
                                                   shards=shards, shard=index, retry_failed=retry_failed))
        for index in range(shards)
    ))
    # A shard Failed for its failed prompts did its work (stored); the job's own state counts them.
    failed = [run.name for run in runs
              if run.state is None or not (run.state.is_completed() or failed_prompts(run.state))]
    if failed:
        raise ShardRunsFailedError(f"real-time shard runs {failed} did not complete; see them in the Prefect UI, "
                                   "then run the job again to send what they left")
    reached = sum(1 for run in runs if run.state is not None and run.state.name == BUDGET_REACHED)
    logger.info("Job %s: all %d real-time shard runs completed%s.", job_id, shards,
                f", {reached} of them stopped by the budget" if reached else "")
    return ShardRuns(flow_run_ids=[str(run.id) for run in runs], budget_reached=reached)


def _check_budget(estimate: JobCost, *, max_cost: float | None) -> None:
    if max_cost is None:
        return
    if not estimate.complete:
        models = ", ".join(sorted(estimate.totals.unpriced_models))
        raise BudgetExceededError(
            f"cannot check --max-cost {max_cost}: no price for {models}; add it to a price file "
            "(LLM_DISPATCH_PRICES_FILE) or drop --max-cost. Nothing was sent"
        )
    # The plan's price where it has one: a shared prefix is paid as the plan sends it, writes at their premium.
    if estimate.planned_total > Decimal(str(max_cost)):
        planned = ("" if estimate.planned_total == estimate.total else
                   f" with the cache plan (${money(estimate.total):.6f} without)")
        raise BudgetExceededError(
            f"estimated cost ${money(estimate.planned_total):.6f}{planned} is above --max-cost ${max_cost}; nothing "
            "was sent. Raise the limit, route more prompts to the Batch API, or send fewer prompts"
        )


def describe_estimate(estimate: JobCost) -> str:
    parts = [
        f"{route} {counted(cost.prompts, 'request')} "
        + ("~" + dollars(cost.cost, unpriced=cost.unpriced) if cost.cost or not cost.unpriced else "cost unknown")
        for route, cost in estimate.routes.items() if cost.prompts
    ]
    text = ", ".join(parts) or "nothing to send"
    # What has no price is unknown, never counted as $0.
    unknown = not estimate.complete
    total = dollars(estimate.total, unpriced=unknown)
    total = total if total == "unknown" else "~" + total
    if estimate.max_total is not None:
        text += f"; total {total} (at most {dollars(estimate.max_total, unpriced=unknown)})"
    else:
        models = ", ".join(sorted(estimate.unbounded_models))
        text += (f"; total {total} (at most: unbounded, no max_tokens and no maximum "
                 f"output known for {models})")
    cache = estimate.cache
    if cache is not None and cache.total and cache.enabled and cache.saved:
        planned = dollars(estimate.planned_total, unpriced=unknown)
        text += (f"; with the cache plan {planned if planned == 'unknown' else '~' + planned} "
                 f"({counted(cache.total, 'shared prefix', many='shared prefixes')}, ~{dollars(cache.saved)} saved)")
    if not estimate.complete:
        text += f"; NO PRICE for {', '.join(sorted(estimate.totals.unpriced_models))}: their cost is unknown"
    return text


@flow(name="dispatch-directory", flow_run_name="dispatch the files of {directory}", log_prints=False)
async def dispatch_directory(
    directory: str,
    pattern: str = "*.jsonl",
    wait: bool = False,
    model: str | None = None,
    route_policy: RoutePolicy | None = None,
    max_cost: float | None = None,
    new_job: bool = False,
) -> DirectorySummary:
    """Dispatch every prompt file in ``directory`` matching ``pattern`` that has not been finished yet,
    oldest name first: meant for a schedule over a drop folder. A file already finished is skipped; one
    recorded but unfinished resumes its job (nothing already answered is paid again). ``new_job``: every
    file is sent again, each as a new job. A new job from a scheduled run is named after its file and
    the day (``questions-2026-11-26``)."""
    logger = get_run_logger()
    settings = Settings.with_overrides(**setting_overrides(locals(), door="directory"))
    folder = Path(directory)
    if not folder.is_dir():
        raise ConfigError(f"{directory} is not a directory; give the folder the prompt files are dropped in")
    done: list[str] = []
    skipped: list[str] = []
    for path in sorted(folder.glob(pattern)):
        found = None if new_job else await _recorded(path, settings=settings)
        if found is not None and found.status == "finished":
            skipped.append(path.name)
            continue
        resume = found.id if found is not None else None
        summary = await run_dispatch(source=str(path), job_id=resume, new_job=resume is None, settings=settings,
                                     wait=wait, max_cost=max_cost)
        done.append(path.name)
        logger.info("%s: job %s (%s), %d succeeded, %d failed, %d unfinished.", path.name, summary.report.job_id,
                    summary.job_name, summary.report.counts.get("succeeded", 0),
                    summary.report.counts.get("failed", 0), summary.report.unfinished)
    logger.info("Dispatched %d files; skipped %d already finished.", len(done), len(skipped))
    return DirectorySummary(dispatched=done, skipped=skipped)


async def _recorded(path: Path, *, settings: Settings) -> storage.JobInfo | None:
    """The newest job of the prompts of ``path`` in this database, if any."""
    digest = fingerprint_of(path, settings=settings)
    async with storage.open_database(settings.database_url) as sessions:
        job_id = await storage.find_job(sessions, fingerprint=digest)
        return await storage.get_job(sessions, job_id=job_id) if job_id else None
