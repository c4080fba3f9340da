"""Task: validate the input and record it as a job with one row per prompt (or find the job again)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

import storage
from llm_dispatch import ConfigError, Settings
from llm_dispatch._inputs import PromptSpec, fingerprint, parse_prompt_dicts, read_prompts
from llm_dispatch._routing import RoutingRules, decide_route, parse_deadline, prompt_chars


@dataclass(frozen=True, slots=True)
class RecordedJob:
    job_id: str
    total: int
    resumed: bool


def routing_rules(settings: Settings) -> RoutingRules:
    return RoutingRules(policy=settings.route_policy, urgent_below_chars=settings.urgent_below_chars,
                        margin=timedelta(seconds=settings.deadline_margin))


def new_prompts(specs: Sequence[PromptSpec], *, rules: RoutingRules | None, now: datetime) -> list[storage.NewPrompt]:
    """Rows for the specs, each routed by ``rules`` (None: all real-time) with its reason and deadline."""
    prompts = []
    for spec in specs:
        deadline = parse_deadline(spec.deadline, now=now) if spec.deadline else None
        if rules is None:
            route, reason = "realtime", "sent by the realtime-dispatch flow"
        else:
            decision = decide_route(urgency=spec.urgency, deadline=deadline, prompt_chars=prompt_chars(spec.messages),
                                    now=now, rules=rules)
            route, reason = decision.route, decision.reason
        prompts.append(storage.NewPrompt(
            custom_id=spec.custom_id, position=spec.position, model=spec.model, messages=spec.messages,
            params=spec.params, metadata=spec.metadata, dedupe_key=spec.dedupe_key,
            planned_route=route, route_reason=reason, deadline=deadline,
        ))
    return prompts


def load_specs(source: str | Path | Sequence[Mapping[str, Any]], *, settings: Settings) -> list[PromptSpec]:
    """Parse and validate prompts from a path or a list of dicts; raises ``InputError``."""
    if isinstance(source, (str, Path)):
        return read_prompts(source, default_model=settings.model)
    return parse_prompt_dicts(source, default_model=settings.model)


@task(name="record-prompts", cache_policy=NO_CACHE)
async def record_prompts(
    *,
    source: str | Sequence[Mapping[str, Any]] | None,
    job_id: str | None,
    settings: Settings,
    sessions: async_sessionmaker[AsyncSession],
    name: str | None = None,
    rules: RoutingRules | None = None,
) -> RecordedJob:
    """Record the prompts of ``source`` as a job; the same input again resumes its existing job.

    Each prompt is routed once, here, by ``rules`` (None: every prompt real-time); the decision, its
    reason and the prompt's deadline are stored with it.
    """
    logger = get_run_logger()
    if source is None:
        if job_id is None:
            raise ConfigError("give prompts (a .jsonl/.csv path or a list of dicts) or the job id to resume")
        job = await storage.get_job(sessions, job_id=job_id)
        if job is None:
            raise ConfigError(f"no job {job_id!r} in {settings.public_dict()['database_url']}; see `llm-dispatch status`")
        total = sum(job.counts.values())
        logger.info("resuming job %s (%d prompts)", job_id, total)
        return RecordedJob(job_id=job_id, total=total, resumed=True)

    specs = load_specs(source, settings=settings)
    digest = fingerprint(specs)
    existing = job_id or await storage.find_job(sessions, fingerprint=digest)
    if existing is not None:
        job = await storage.get_job(sessions, job_id=existing)
        if job is None:
            raise ConfigError(f"no job {existing!r} to resume in {settings.public_dict()['database_url']}")
        logger.info("input already recorded as job %s: resuming it (only unfinished prompts are sent)", existing)
        return RecordedJob(job_id=existing, total=sum(job.counts.values()), resumed=True)

    input_path = str(Path(source).resolve()) if isinstance(source, (str, Path)) else None
    new_id = await storage.create_job(
        sessions,
        name=name or (Path(source).name if isinstance(source, (str, Path)) else "prompts"),
        fingerprint=digest,
        input_path=input_path,
        model=settings.model,
        settings=settings.public_dict(),
    )
    await storage.add_prompts(sessions, job_id=new_id, prompts=new_prompts(specs, rules=rules, now=datetime.now(UTC)))
    logger.info("recorded job %s: %d prompts", new_id, len(specs))
    return RecordedJob(job_id=new_id, total=len(specs), resumed=False)
