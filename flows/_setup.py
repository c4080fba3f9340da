"""What a flow does before its work: the API key from a Secret block, the concurrency limit on the
real-time tag, the process's garbage collector; and the names its runs get in the Prefect UI."""

from __future__ import annotations

import gc
import logging
from datetime import UTC, datetime
from pathlib import Path

from typing import Any

from pydantic import SecretStr

from llm_dispatch.core import ConfigError, Settings, counted

Logger = logging.Logger | logging.LoggerAdapter  # type: ignore[type-arg]

# Allocations between young-generation collections (CPython's default: 700).
GC_THRESHOLD = 10_000


# (setting naming a Secret block, the key it holds, the variable that sets the name)
_KEY_BLOCKS = (("api_key_block", "api_key", "LLM_DISPATCH_API_KEY_BLOCK"),
               ("anthropic_api_key_block", "anthropic_api_key", "LLM_DISPATCH_ANTHROPIC_API_KEY_BLOCK"),
               ("gemini_api_key_block", "gemini_api_key", "LLM_DISPATCH_GEMINI_API_KEY_BLOCK"))


async def with_api_key(settings: Settings) -> Settings:
    """``settings`` with each key read from the Prefect Secret block named for it (``api_key_block``,
    ``anthropic_api_key_block``, ``gemini_api_key_block``), when one is.

    A key goes into a ``SecretStr`` and from there only into request headers: never into a log,
    the database, an artifact or an exception.
    """
    update: dict[str, object] = {}
    for block_field, key_field, variable in _KEY_BLOCKS:
        name = getattr(settings, block_field)
        if name is not None:
            update[key_field] = SecretStr(await _secret(name, variable=variable))
            update[block_field] = None  # resolved: the recipes handed these settings do not read the block again
    return settings.model_copy(update=update) if update else settings


async def _secret(name: str, *, variable: str) -> str:
    from prefect.blocks.system import Secret

    try:
        block: Secret[Any] = await Secret.aload(name)
    except ValueError as exc:
        raise ConfigError(
            f"no Prefect Secret block named {name!r}: create it (`prefect block create secret` or "
            f"Secret(value=...).save({name!r})) or unset {variable}"
        ) from None
    value: object = block.get()
    if not isinstance(value, str) or not value:
        raise ConfigError(f"the Secret block {name!r} holds no API key string")
    return value


async def ensure_tag_limit(settings: Settings, *, logger: Logger) -> int | None:
    """The concurrency limit on ``concurrency_tag``, created with ``tag_limit`` when missing; None if there is none.

    An existing limit is left as it is (adjust it with ``prefect concurrency-limit``).
    """
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    tag = settings.concurrency_tag
    async with get_client() as client:
        try:
            found = await client.read_concurrency_limit_by_tag(tag)
            return found.concurrency_limit
        except ObjectNotFound:
            pass
        if settings.tag_limit is None:
            logger.info("no concurrency limit on tag %r: each run is bounded by its own concurrency only; "
                        "set LLM_DISPATCH_TAG_LIMIT or `prefect concurrency-limit create %s N`", tag, tag)
            return None
        await client.create_concurrency_limit(tag=tag, concurrency_limit=settings.tag_limit)
    logger.info("created concurrency limit %d on tag %r (change it with `prefect concurrency-limit`)",
                settings.tag_limit, tag)
    return settings.tag_limit


def tune_gc() -> bool:
    """Make garbage collection cheap in a flow process; once per process. Returns whether it acted.

    A flow process holds Prefect, SQLAlchemy, pydantic and aiohttp: a few hundred thousand long-lived
    objects that every full collection would walk again, while a sender allocates fast. What exists
    at start-up stays alive anyway (reference counting still frees it), so it is frozen out of the
    collector's view, and the young generation is collected less often.
    """
    threshold, *older = gc.get_threshold()
    if threshold >= GC_THRESHOLD:
        return False
    # Young generations only: older garbage, if any, is frozen with the rest, a one-time cost.
    gc.collect(1)
    gc.freeze()
    gc.set_threshold(GC_THRESHOLD, *older)
    return True


async def prepare(settings: Settings, *, logger: Logger, tag_limit: bool = False) -> Settings:
    """Everything a flow does before its recipe: the key resolved, the tag limit ensured (``tag_limit``), cheap GC."""
    settings = await with_api_key(settings)
    if tag_limit:
        await ensure_tag_limit(settings, logger=logger)
    tune_gc()
    return settings


def input_run_name() -> str:
    """A flow run named after what it works on: the input file, the prompts given, or the job."""
    from prefect.runtime import flow_run

    parameters = flow_run.parameters
    source, job_id, shard, shards = (parameters.get(name) for name in ("prompts", "job_id", "shard", "shards"))
    if isinstance(shard, int) and isinstance(shards, int):
        # A shard of a job a dispatch run recorded: named for its share and the job (its name, passed along).
        return f"shard {shard + 1}/{shards} of {parameters.get('job_name') or f'job {short_id(str(job_id))}'}"
    if isinstance(source, str):
        return Path(source).name
    if isinstance(source, list):
        return counted(len(source), "prompt")
    return f"resume job {short_id(str(job_id))}" if job_id else "no input"


def short_id(job_id: str) -> str:
    """A job id as a person types it: a whole UUID's first 8 characters (``llm-dispatch status`` shows those)."""
    return job_id[:8] if len(job_id) == 36 and job_id.count("-") == 4 else job_id


def collect_run_name() -> str:
    """A ``collect-batches`` run's name as it starts; ``rename_run`` adds what it found once it has swept."""
    from prefect.runtime import flow_run

    job_id = flow_run.parameters.get("job_id")
    return f"collect the batches of job {job_id}" if job_id else "collect open batches"


def wait_run_name() -> str:
    """A ``wait-for-batches`` run named for what it follows: ``wait for 20 batches of job 0eea949d``."""
    from prefect.runtime import flow_run

    parameters = flow_run.parameters
    batch_ids, job_id = parameters.get("batch_ids") or [], str(parameters.get("job_id"))
    return f"wait for {len(batch_ids)} batch{'es' if len(batch_ids) != 1 else ''} of job {short_id(job_id)}"


async def rename_run(name: str, *, logger: Logger) -> None:
    """Give the running flow run ``name``, once it knows what it did; best effort (the name is a display)."""
    from prefect.client.orchestration import get_client
    from prefect.context import FlowRunContext

    context = FlowRunContext.get()
    if context is None or context.flow_run is None:
        return
    try:
        async with get_client() as client:
            await client.update_flow_run(context.flow_run.id, name=name)
    except Exception as exc:  # noqa: BLE001 - a run's name must not fail the work it names
        logger.warning("flow run not renamed to %r: %s", name, exc)


def scheduled_job_name(source: object) -> str | None:
    """The name a job gets when a deployment's schedule started its run and none was given: its input's
    name and the day the run was scheduled for (``questions-2026-11-26``, UTC), so that each night's run
    of a fixed file is a job of its own and a retry of the same night's run resumes it. None otherwise."""
    from prefect.context import FlowRunContext

    context = FlowRunContext.get()
    run = context.flow_run if context is not None else None
    if run is None or not run.auto_scheduled:
        return None
    when = run.expected_start_time or run.created
    day = (when.astimezone(UTC) if when is not None else datetime.now(UTC)).date().isoformat()
    stem = Path(source).stem if isinstance(source, (str, Path)) else "prompts"
    return f"{stem}-{day}"
