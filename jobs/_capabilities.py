"""What an endpoint can do, learnt rather than assumed: a base URL whose files or batches route answers 404 (vLLM,
Ollama and most local servers have no Batch API) is remembered in the database, and a job's prompts there go
real-time instead, with one warning, on this run and every later one. Plain async code (no Prefect)."""

from __future__ import annotations

import logging
import re

import httpx

from llm_dispatch import storage
from llm_dispatch.core import BACKENDS, HALF_SUBMITTED_BATCH_STATUSES, NotFoundError

from ._batch_trouble import lose_batch
from ._prompt_rows import batchless_providers
from ._run import JobRun

__all__ = ["endpoint_of", "first_error", "is_missing_batch_api", "known_without_batch_api", "learn_no_batch_api",
           "learning_batches", "without_batches"]

logger = logging.getLogger(__name__)

# The paths of a Batch API: a 404 on one of them means the endpoint has none (not that an object is gone).
# Gemini's: its Files API upload and its batches list (a 404 on a create names a model it does not know).
_BATCH_PATHS = re.compile(r" (?:POST|GET) /(?:v1/)?(files|batches|messages/batches|upload/v1beta/files|v1beta/batches)"
                          r"(?:[ ?]|$)")
_PROVIDER_OF_PATH = {"messages/batches": "anthropic", "upload/v1beta/files": "gemini", "v1beta/batches": "gemini"}


def endpoint_of(run: JobRun, *, provider: str) -> str:
    """The base URL a provider's calls go to, as remembered: no credentials, no query."""
    settings = run.settings
    declared = run.clients.providers.declared.get(provider)
    raw = declared.base_url if declared is not None and declared.base_url else {
        "anthropic": settings.anthropic_base_url, "gemini": settings.gemini_base_url}.get(provider, settings.base_url)
    return str(httpx.URL(raw.rstrip("/")).copy_with(userinfo=b"", query=None))


def without_batches(run: JobRun) -> dict[str, str]:
    """The run's providers whose prompts never go in batches, each with why: a wire llm-dispatch has no batch
    backend for (``core.BACKENDS``), or a declared provider whose providers file says ``batch_api = false``."""
    return batchless_providers(run.clients.providers)


def learning_batches(run: JobRun) -> frozenset[str]:
    """The run's providers whose Batch API is learnt (``batch_api = "learn"``, the built-in ones'): an endpoint
    remembered without one sends their batch-routed prompts real-time."""
    table = run.clients.providers
    return frozenset(name for name in table.names
                     if table.get(name).wire in BACKENDS and table.get(name).batch_api == "learn")


def is_missing_batch_api(error: BaseException) -> bool:
    """Whether ``error`` is a 404 from a create or an upload (or a group of nothing else: files uploaded at once):
    the endpoint has no Batch API."""
    if isinstance(error, BaseExceptionGroup):
        return all(is_missing_batch_api(inner) for inner in error.exceptions)
    return _batch_path_of(error) is not None


def missing_for(error: BaseException) -> frozenset[str]:
    """The providers whose Batch API answered ``error``'s 404s (Message Batches: Anthropic's; ``/v1beta`` uploads and
    batches: Gemini's; files and batches: OpenAI's)."""
    if isinstance(error, BaseExceptionGroup):
        return frozenset().union(*(missing_for(inner) for inner in error.exceptions))
    path = _batch_path_of(error)
    if path is None:
        return frozenset()
    # The client that gave up names its provider; else the path says whose API it is.
    named = getattr(error, "provider", None)
    return frozenset({named or _PROVIDER_OF_PATH.get(path, "openai")})


def _batch_path_of(error: BaseException) -> str | None:
    """The Batch API path a 404 came from (``files``, ``batches``, ``messages/batches``), or None."""
    if not isinstance(error, NotFoundError):
        return None
    found = _BATCH_PATHS.search(str(error).split(" after ", 1)[0])
    return None if found is None else found.group(1)


def first_error(error: BaseException) -> BaseException:
    """The first error of a group (the one a message names), or ``error`` itself."""
    return first_error(error.exceptions[0]) if isinstance(error, BaseExceptionGroup) else error


async def known_without_batch_api(run: JobRun, *, providers: frozenset[str]) -> dict[str, str]:
    """Which of these providers' endpoints are known to have no Batch API, each with why (empty: none)."""
    known: dict[str, str] = {}
    for provider in sorted(providers):
        url = endpoint_of(run, provider=provider)
        reason = await storage.no_batch_api(run.sessions, base_url=url)
        if reason is not None:
            known[provider] = f"{url} has no Batch API ({reason})"
    return known


async def learn_no_batch_api(
    run: JobRun, *, job_id: str, error: BaseException | None, because: str, providers: frozenset[str] | None = None
) -> int:
    """An endpoint of the job has no Batch API: remember it when ``error`` is the 404 that says so, close the job's
    half-made batches there (``lost``: never created, nothing billed), and route real-time every batch-routed pending
    prompt of the providers whose endpoint has none (``providers``, else those whose paths answered ``error``'s 404s);
    returns how many were re-routed. The prompts of a provider whose endpoint has a Batch API keep their route."""
    lacking = providers if providers is not None else missing_for(error) if error is not None else frozenset()
    half_made = [record for record in await storage.unfinished_batches(run.sessions, job_id=job_id)
                 if record.status in HALF_SUBMITTED_BATCH_STATUSES and record.provider_batch_id is None]
    if error is not None:
        error = first_error(error)
        for provider in lacking:
            await storage.remember_no_batch_api(run.sessions, base_url=endpoint_of(run, provider=provider),
                                                reason=f"{' '.join(str(error).split())[:200]}")
    for record in half_made:
        if record.provider in lacking:
            await lose_batch(run=run, record=record, reason=because)
    models = [model for model in await storage.job_models(run.sessions, job_id=job_id)
              if run.clients.provider_of(model) in lacking]
    return await storage.reroute_pending(run.sessions, job_id=job_id, route="realtime", reason=because,
                                         from_routes=["batch"], models=models)
