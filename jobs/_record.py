"""Recording a job: validate the input, store one row per prompt with its route (or find the job again),
in slices when the job is sent while it is stored."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

import storage
from llm_dispatch import (
    ConfigError,
    PromptSpec,
    RoutingRules,
    Settings,
    decide_route,
    fingerprint,
    parse_deadline,
    parse_prompt_dicts,
    prompt_chars,
    read_prompts,
)

from ._run import load_prices

logger = logging.getLogger(__name__)

# Slices of the rest grow from the first size to at most this many times it: early ones reach the
# sender quickly, later ones keep the number of transactions (and planning task runs) small.
MAX_SLICE_GROWTH = 64


@dataclass(frozen=True, slots=True)
class RecordedJob:
    job_id: str
    total: int
    resumed: bool
    # A new job stored in slices (``record_job(head=...)``): all its prompts in input order, of
    # which the first ``head`` are stored; ``store_rest`` stores the others. The job's status stays
    # ``recording`` until then. Its sender may take requests from here rather than load them again.
    specs: Sequence[PromptSpec] = ()
    head: int = 0
    # When the job was recorded: relative deadlines of the rest count from it, as the first ones' did.
    recorded_at: datetime | None = None
    # Requests (dedupe keys) that more than one prompt of the job makes: their prompts may be split
    # between slices, so a sender grouping identical requests waits until all are stored.
    repeated_keys: frozenset[str] = frozenset()

    @property
    def rest(self) -> Sequence[PromptSpec]:
        """The prompts ``store_rest`` has to store."""
        return self.specs[self.head :]

    @property
    def stored(self) -> int:
        """Prompts stored so far: input positions ``0 .. stored - 1``."""
        return self.head if self.specs else self.total


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


def fingerprint_of(path: str | Path, *, settings: Settings) -> str:
    """The fingerprint a job of the prompts in ``path`` has (same prompts, same default model)."""
    return fingerprint(load_specs(path, settings=settings))


def load_specs(source: str | Path | Sequence[Mapping[str, Any]], *, settings: Settings) -> list[PromptSpec]:
    """Parse and validate prompts from a path or a list of dicts, each against its model's context window
    and maximum output in the price table (the bundled one and ``settings.prices_file``); raises
    ``InputError`` (``ConfigError`` for a bad price file)."""
    table = load_prices(settings)
    if isinstance(source, (str, Path)):
        return read_prompts(source, default_model=settings.model, table=table)
    return parse_prompt_dicts(source, default_model=settings.model, table=table)


async def record_job(
    *,
    source: str | Sequence[Mapping[str, Any]] | None,
    job_id: str | None,
    settings: Settings,
    sessions: async_sessionmaker[AsyncSession],
    name: str | None = None,
    rules: RoutingRules | None = None,
    head: int | None = None,
) -> RecordedJob:
    """Record the prompts of ``source`` as a job; the same input again resumes its existing job.

    Each prompt is routed once, here, by ``rules`` (None: every prompt real-time); the decision, its
    reason and the prompt's deadline are stored with it. The whole input is validated first.

    ``head``: a new job stores only its first ``head`` prompts here and returns the others in
    ``RecordedJob.rest`` for ``store_rest``, so sending can start while they are stored; until
    then the job's status is ``recording``. A job left ``recording`` (its run was cut off) gets
    its missing prompts stored when it is met again, from the same input or its input file.
    """
    database = settings.public_dict()["database_url"]
    if source is None:
        if job_id is None:
            raise ConfigError("give prompts (a .jsonl/.csv path or a list of dicts) or the job id to resume")
        job = await storage.get_job(sessions, job_id=job_id)
        if job is None:
            raise ConfigError(f"no job {job_id!r} in {database}; see `llm-dispatch status`")
        if job.status == "recording":
            job = await _finish_recording(sessions, job=job, specs=_input_of(job, settings=settings), rules=rules)
        total = sum(job.counts.values())
        logger.info("resuming job %s (%d prompts)", job_id, total)
        return RecordedJob(job_id=job_id, total=total, resumed=True)

    specs = load_specs(source, settings=settings)
    digest = fingerprint(specs)
    existing = job_id or await storage.find_job(sessions, fingerprint=digest)
    if existing is not None:
        job = await storage.get_job(sessions, job_id=existing)
        if job is None:
            raise ConfigError(f"no job {existing!r} to resume in {database}")
        if job.status == "recording":
            if job.fingerprint != digest:
                raise ConfigError(f"job {existing} was cut off while recording other prompts than this input's: "
                                  "run its own input again, or this input without the job id")
            job = await _finish_recording(sessions, job=job, specs=specs, rules=rules)
        logger.info("input already recorded as job %s: resuming it (only unfinished prompts are sent)", existing)
        return RecordedJob(job_id=existing, total=sum(job.counts.values()), resumed=True)

    input_path = str(Path(source).resolve()) if isinstance(source, (str, Path)) else None
    split = head is not None and 0 < head < len(specs)
    new_id = await storage.create_job(
        sessions,
        name=name or (Path(source).name if isinstance(source, (str, Path)) else "prompts"),
        fingerprint=digest,
        input_path=input_path,
        model=settings.model,
        settings=settings.public_dict(),
        # Until its prompts are stored: a run killed in between leaves a job the next run completes.
        status="recording",
    )
    now = datetime.now(UTC)
    if not split:
        await storage.add_prompts(sessions, job_id=new_id, prompts=new_prompts(specs, rules=rules, now=now),
                                  then_status="created")
        logger.info("recorded job %s: %d prompts", new_id, len(specs))
        return RecordedJob(job_id=new_id, total=len(specs), resumed=False)
    assert head is not None
    await storage.add_prompts(sessions, job_id=new_id, prompts=new_prompts(specs[:head], rules=rules, now=now))
    counts = Counter(spec.dedupe_key for spec in specs)
    logger.info("recording job %s: %d prompts, the first %d stored", new_id, len(specs), head)
    return RecordedJob(job_id=new_id, total=len(specs), resumed=False, specs=specs, head=head, recorded_at=now,
                       repeated_keys=frozenset(key for key, count in counts.items() if count > 1))


async def store_rest(
    *,
    job_id: str,
    specs: Sequence[PromptSpec],
    sessions: async_sessionmaker[AsyncSession],
    first_slice: int,
    recorded_at: datetime,
    then_status: storage.JobStatus,
    rules: RoutingRules | None = None,
) -> AsyncIterator[tuple[int, int]]:
    """Store the prompts ``record_job`` left for later (``RecordedJob.rest``), yielding after each slice
    the input positions ``(start, stop)`` it held, so that they can be sent while the next is stored.

    Slices start at ``first_slice`` prompts and grow, each its own transaction, routed by ``rules``
    as of ``recorded_at`` like the first ones. The last slice moves the job on from ``recording`` to
    ``then_status``.
    """
    if first_slice < 1:
        raise ValueError("first_slice must be at least 1")
    stored, size = 0, first_slice
    while stored < len(specs):
        part = specs[stored : stored + size]
        last = stored + len(part) == len(specs)
        await storage.add_prompts(sessions, job_id=job_id, prompts=new_prompts(part, rules=rules, now=recorded_at),
                                  skip_existing=True, then_status=then_status if last else None)
        stored += len(part)
        yield part[0].position, part[-1].position + 1
        size = min(size * 2, first_slice * MAX_SLICE_GROWTH)


def _input_of(job: storage.JobInfo, *, settings: Settings) -> list[PromptSpec]:
    """The prompts of a job cut off while recording, read again from its input file."""
    cut_off = f"job {job.id} was cut off while its prompts were being recorded ({sum(job.counts.values())} stored)"
    if job.input_path is None or not Path(job.input_path).is_file():
        where = f"its input {job.input_path} is gone" if job.input_path else "it was given as a list, not a file"
        raise ConfigError(f"{cut_off} and {where}: run the same prompts again as input (not by job id) to store the rest")
    specs = load_specs(job.input_path, settings=settings)
    if fingerprint(specs) != job.fingerprint:
        raise ConfigError(f"{cut_off}, and its input {job.input_path} no longer reads as the same prompts (the file "
                          "or the default model changed): run it with the original input and model")
    return specs


async def _finish_recording(
    sessions: async_sessionmaker[AsyncSession],
    *,
    job: storage.JobInfo,
    specs: Sequence[PromptSpec],
    rules: RoutingRules | None,
) -> storage.JobInfo:
    """Store the prompts a cut-off recording left out (those stored stay as they are); the job as it is now.

    Relative deadlines count from when the job was created, as they did for the prompts stored then.
    """
    stored = sum(job.counts.values())
    await storage.add_prompts(sessions, job_id=job.id, prompts=new_prompts(specs, rules=rules, now=job.created_at),
                              skip_existing=True, then_status="created")
    logger.warning("job %s was cut off while its prompts were being recorded: %d of %d were stored, now all are",
                   job.id, stored, len(specs))
    finished = await storage.get_job(sessions, job_id=job.id)
    assert finished is not None
    return finished
