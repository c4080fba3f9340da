"""Task: record the input as a job, one row per prompt with its route (or find the job again)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from llm_dispatch import storage
from llm_dispatch.jobs import RecordedJob, record_job
from llm_dispatch.core import RetryFailed, RoutingRules, Settings, counted

from ._names import parameter, prompts


def _run_name() -> str:
    source = parameter("source")
    if isinstance(source, str):
        return f"record {Path(source).name}"
    if source is None:
        return f"record the rest of job {parameter('job_id')}"
    return f"record {prompts(len(source))}"


@task(name="record-prompts", task_run_name=_run_name, cache_policy=NO_CACHE)
async def record_prompts(
    *,
    source: str | Sequence[Mapping[str, Any]] | None,
    job_id: str | None,
    settings: Settings,
    sessions: storage.Sessions,
    name: str | None = None,
    new_job: bool = False,
    retry_failed: RetryFailed = "retryable",
    rules: RoutingRules | None = None,
    head: int | None = None,
    estimate: bool = False,
) -> RecordedJob:
    """Validate the whole input and store it as a job, or resume the job it already is (``record_job`` says which).

    ``head``: store only the first ``head`` prompts of a new job now, the rest as it is sent. ``estimate``: a new
    job comes back with its cost estimate's sums, made while it was stored.
    """
    job = await record_job(source=source, job_id=job_id, settings=settings, sessions=sessions, name=name,
                           new_job=new_job, retry_failed=retry_failed, rules=rules, head=head,
                           estimate=estimate)
    logger = get_run_logger()
    if job.resumed:
        logger.info("Resuming job %s (%s): %d of its %s answered before; only the unfinished ones are sent "
                    "(a new job: new_job / --new-job).", job.job_id, job.name, job.answered, counted(job.total, "prompt"))
    elif job.started_over_from:
        logger.info("Job %s (the same input) has answered every prompt and dedupe is off: new job %s (%s) sends all "
                    "%s again.", job.started_over_from, job.job_id, job.name, counted(job.total, "prompt"))
    elif job.rest:
        logger.info("New job %s (%s): %s checked; the first %d stored, the rest is stored as they are sent.",
                    job.job_id, job.name, counted(job.total, "prompt"), job.stored)
    else:
        logger.info("New job %s (%s): %s checked and stored.", job.job_id, job.name, counted(job.total, "prompt"))
    return job
