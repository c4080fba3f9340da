"""What an endpoint can do, learnt rather than assumed: a base URL whose files or batches route answers 404 (vLLM,
Ollama and most local servers have no Batch API) is remembered in the database, and a job's prompts there go
real-time instead, with one warning, on this run and every later one. Plain async code (no Prefect)."""

from __future__ import annotations

import logging
import re

import httpx

from llm_dispatch import storage
from llm_dispatch.core import HALF_SUBMITTED_BATCH_STATUSES, NotFoundError

from ._batch_trouble import lose_batch
from ._run import JobRun

__all__ = ["endpoint_of", "first_error", "is_missing_batch_api", "known_without_batch_api", "learn_no_batch_api"]

logger = logging.getLogger(__name__)

# The paths of a Batch API: a 404 on one of them means the endpoint has none (not that an object is gone).
_BATCH_PATHS = re.compile(r" (?:POST|GET) /(?:v1/)?(?:files|batches|messages/batches)(?: |$)")


def endpoint_of(run: JobRun, *, provider: str) -> str:
    """The base URL a provider's calls go to, as remembered: no credentials, no query."""
    settings = run.settings
    raw = settings.anthropic_base_url if provider == "anthropic" else settings.base_url
    return str(httpx.URL(raw.rstrip("/")).copy_with(userinfo=b"", query=None))


def is_missing_batch_api(error: BaseException) -> bool:
    """Whether ``error`` is a 404 from a create or an upload (or a group of nothing else: files uploaded at once):
    the endpoint has no Batch API."""
    if isinstance(error, BaseExceptionGroup):
        return all(is_missing_batch_api(inner) for inner in error.exceptions)
    return isinstance(error, NotFoundError) and bool(_BATCH_PATHS.search(str(error).split(" after ", 1)[0]))


def first_error(error: BaseException) -> BaseException:
    """The first error of a group (the one a message names), or ``error`` itself."""
    return first_error(error.exceptions[0]) if isinstance(error, BaseExceptionGroup) else error


async def known_without_batch_api(run: JobRun, *, providers: frozenset[str]) -> str | None:
    """Why one of these providers' endpoints is known to have no Batch API, or None."""
    for provider in sorted(providers):
        url = endpoint_of(run, provider=provider)
        reason = await storage.no_batch_api(run.sessions, base_url=url)
        if reason is not None:
            return f"{url} has no Batch API ({reason})"
    return None


async def learn_no_batch_api(run: JobRun, *, job_id: str, error: BaseException | None, because: str) -> int:
    """The job's endpoint has no Batch API: remember it (for the providers of the job's half-made batches, when
    ``error`` is the 404 that says so), close those batches (``lost``: never created, nothing billed), and route
    every batch-routed pending prompt of the job real-time; returns how many were re-routed."""
    half_made = [record for record in await storage.unfinished_batches(run.sessions, job_id=job_id)
                 if record.status in HALF_SUBMITTED_BATCH_STATUSES and record.provider_batch_id is None]
    if error is not None:
        error = first_error(error)
        for provider in {record.provider for record in half_made} or {"openai"}:
            await storage.remember_no_batch_api(run.sessions, base_url=endpoint_of(run, provider=provider),
                                                reason=f"{' '.join(str(error).split())[:200]}")
    for record in half_made:
        await lose_batch(run=run, record=record, reason=because)
    return await storage.reroute_pending(run.sessions, job_id=job_id, route="realtime", reason=because,
                                         from_routes=("batch",))
