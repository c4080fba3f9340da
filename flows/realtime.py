"""Flow ``realtime-dispatch``: a file or list of prompts out as concurrent chat completions, into SQL."""

from __future__ import annotations

import time
from typing import Any

from prefect import flow, get_run_logger
from prefect.utilities.annotations import quote
from pydantic import SecretStr

from llm_dispatch import storage
from llm_dispatch.jobs import Selection, open_run, run_budget
from llm_dispatch.core import ConfigError, Endpoint, RetryFailed, Route, Settings, setting_overrides
from llm_dispatch.tasks import record_prompts

from ._realtime_half import lane_count, send_realtime
from ._setup import input_run_name, prepare, scheduled_job_name
from ._states import final_state


@flow(name="realtime-dispatch", flow_run_name=input_run_name, log_prints=False)
async def realtime_dispatch(
    prompts: str | list[dict[str, Any]] | None = None,
    job_id: str | None = None,
    model: str | None = None,
    allow_unknown_model: bool | None = None,
    endpoint: Endpoint | None = None,
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
    planned_route: Route | None = None,
    shard: int | None = None,
    shards: int | None = None,
    new_job: bool = False,
    job_name: str | None = None,
    answer_schema: str | dict[str, Any] | None = None,
    max_reasks: int | None = None,
    cache_plan: bool | None = None,
    budget: float | None = None,
    budget_name: str | None = None,
    fail_above: float = 0.0,
) -> Any:
    """Send every unfinished prompt of the input (or of job ``job_id``) as real-time calls.

    Re-running the same input, or passing ``job_id``, resumes: a prompt that succeeded is never
    sent again, and an identical request already answered is reused unless ``dedupe`` is False; a refused one
    is asked again only with ``retry_refused``. ``new_job`` starts a new job instead; ``job_name`` names it (see
    ``dispatch``). ``endpoint`` is the endpoint of prompts that name none; ``prices_file`` a price table over the
    bundled one, for the costs stored, the budget's reservations and the input's checks (both as ``dispatch``'s).
    Every prompt it records is routed real-time, so it takes no route policy.
    ``planned_route`` sends only prompts routed there; ``shard``/``shards`` only one share of them
    (the ``dispatch`` flow's scale-out across workers runs one shard per deployment run). ``answer_schema`` and
    ``max_reasks``: as ``dispatch``'s. ``budget`` (dollars, the job's own) or ``budget_name`` (a shared budget) caps
    what is spent: each request's worst case is reserved before it is sent, and a run whose next one does not fit
    ends in the state ``BudgetReached`` with the rest pending. Failed prompts make the run ``Failed`` unless they
    are no more than ``fail_above`` of the job's (see ``dispatch``).
    """
    started = time.monotonic()
    if (shard is None) != (shards is None):
        raise ConfigError("give both shard and shards, or neither")
    part = (shard, shards) if shard is not None and shards is not None else None
    # A SecretStr parameter reaches the Prefect API as '**********': a password in the URL stays here.
    settings = Settings.with_overrides(**setting_overrides(locals(), door="realtime"))
    settings = await prepare(settings, logger=get_run_logger(), tag_limit=True)
    # A new job's first chunk per lane goes out while the rest of it is stored; a shard's job is stored already.
    head = None if part else settings.chunk_size * lane_count(settings)
    async with open_run(settings) as run:
        name = job_name if job_name is not None or job_id is not None else scheduled_job_name(prompts)
        job = await record_prompts(source=quote(prompts), job_id=job_id, settings=settings, sessions=run.sessions,
                                   name=name, new_job=new_job, retry_failed=retry_failed, head=head)
        run.clients.require(job.providers)  # a missing key stops the run here, before anything is sent
        if not job.rest:
            await storage.set_job_status(run.sessions, job_id=job.job_id, status="running")
        if retry_refused and part is None:  # the dispatch flow reopens them for its shards
            await storage.reopen_refused(run.sessions, job_id=job.job_id)
        selection = Selection(retry_failed=retry_failed, planned_route=planned_route, shard=part)
        held = await run_budget(settings, sessions=run.sessions, job_id=job.job_id)
        summary = await send_realtime(run=run, job=job, selection=selection, started=started, budget=held)
    return final_state(summary, budget=summary.budget, fail_above=fail_above)

