"""What a flow does before its work: the API key from a Secret block, the concurrency limit on the
real-time tag, the process's garbage collector; and the names its runs get in the Prefect UI."""

from __future__ import annotations

import gc
import logging
from pathlib import Path

from pydantic import SecretStr

from llm_dispatch.core import ConfigError, Settings

Logger = logging.Logger | logging.LoggerAdapter  # type: ignore[type-arg]

# Allocations between young-generation collections (CPython's default: 700).
GC_THRESHOLD = 10_000


# (setting naming a Secret block, the key it holds, the variable that sets the name)
_KEY_BLOCKS = (("api_key_block", "api_key", "LLM_DISPATCH_API_KEY_BLOCK"),
               ("anthropic_api_key_block", "anthropic_api_key", "LLM_DISPATCH_ANTHROPIC_API_KEY_BLOCK"))


async def with_api_key(settings: Settings) -> Settings:
    """``settings`` with each key read from the Prefect Secret block named for it (``api_key_block``,
    ``anthropic_api_key_block``), when one is.

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
        block = await Secret.aload(name)
    except ValueError as exc:
        raise ConfigError(
            f"no Prefect Secret block named {name!r}: create it (`prefect block create secret` or "
            f"Secret(value=...).save({name!r})) or unset {variable}"
        ) from None
    value = block.get()
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
    source, job_id = parameters.get("prompts"), parameters.get("job_id")
    if isinstance(source, str):
        return Path(source).name
    if isinstance(source, list):
        return f"{len(source)} prompts"
    return f"job {job_id}" if job_id else "no input"
