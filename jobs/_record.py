"""Recording a job: validate the input, store one row per prompt with its route (or find the job again),
in slices when the job is sent while it is stored."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Container, Hashable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime, timedelta
from itertools import islice
from pathlib import Path
from typing import Any


from llm_dispatch import storage
from llm_dispatch.core import (
    counted,
    DEFAULT_ENDPOINT,
    ConfigError,
    EstimateSums,
    UnknownJobError,
    InputCheck,
    PriceTable,
    PromptSource,
    PromptSpec,
    RoutingRules,
    Settings,
    check_prompts,
    DEFAULT_ANTHROPIC_VERSION,
    DEFAULT_MAX_TOKENS,
    iter_prompts,
    load_schema,
    ProviderTable,
    JobStatus,
    RetryFailed,
    Route,
    unfinished,
)

from ._cache_plan import CacheEstimate, JobPrefixes
from ._costs import counted_prompts
from ._prompt_rows import CheckPassEstimate, batchless_providers, new_prompts
from ._run import load_prices

logger = logging.getLogger(__name__)

# Slices of the rest grow from the first size to at most this many prompts: early ones reach the
# sender quickly; a slice is held in memory while it is planned and its chunks are sent.
MAX_SLICE = 10_000
# Prompts a check keeps in memory (a slice's worth); it spills the rest of the input to a temporary file, from which
# they are stored: the input is parsed and checked once.
KEEP_CHECKED = MAX_SLICE


@dataclass(frozen=True, slots=True)
class PromptInput:
    """A checked input, read again as a stream whenever its prompts are needed, so that none is held."""

    source: PromptSource
    default_model: str
    default_endpoint: str = DEFAULT_ENDPOINT
    table: PriceTable | None = field(default=None, repr=False)
    # Which provider each model goes to (``core.ProviderTable``, or a ``Settings.model_providers`` mapping), and
    # Anthropic's max_tokens when none is set.
    model_providers: Mapping[str, str] | ProviderTable = field(default_factory=dict)
    default_max_tokens: int = DEFAULT_MAX_TOKENS
    # What Anthropic's models refuse depends on the API version sent (``Settings.anthropic_version``).
    anthropic_version: str = DEFAULT_ANTHROPIC_VERSION
    # Every prompt's parameters unless it sets its own: the job's schema as ``response_format`` (``--schema``).
    default_params: Mapping[str, Any] | None = None
    # Send models the catalog does not name (``Settings.allow_unknown_model``) instead of refusing them.
    allow_unknown_model: bool = False

    def specs(self, *, start: int = 0, checked: InputCheck | None = None) -> Iterator[PromptSpec]:
        """Its prompts in input order, from input position ``start``: those ``checked`` (its check) kept (every one,
        ``InputCheck.specs``), else read again. The input was checked whole (``check``), so the model-limit checks
        are not run again (no token estimates); every other check is."""
        if checked is not None and checked.specs is not None:
            return checked.specs.iter_from(start)
        return islice(iter_prompts(self.source, default_model=self.default_model,
                                   default_endpoint=self.default_endpoint, default_params=self.default_params,
                                   model_providers=self.model_providers, anthropic_version=self.anthropic_version),
                      start, None)

    def check(self, *, warn: bool = True, remember: bool = False, keep: bool = True,
              each: Callable[[PromptSpec], object] | None = None) -> InputCheck:
        """Validate the whole input (``InputError`` naming its bad lines): its count, fingerprint, repeats, providers.

        A file this context checked before with ``remember`` (the command, before it starts the flow) is not read
        again while it is unchanged (same size, modification time and inode) and checked by the same rules: then
        ``each`` (called with every good prompt as the check reads it) is not called at all. ``keep``: the check keeps
        the prompts (``InputCheck.specs``) for ``specs`` to give without reading the input again."""
        key = self._check_key()
        known = checked_inputs.get().get(key) if key is not None else None
        if known is not None:
            return known
        checked = check_prompts(self.source, default_model=self.default_model,
                                default_endpoint=self.default_endpoint, default_params=self.default_params,
                                table=self.table,
                                model_providers=self.model_providers, default_max_tokens=self.default_max_tokens,
                                anthropic_version=self.anthropic_version, warn=warn,
                                keep=KEEP_CHECKED if keep else 0, spill=keep,
                                allow_unknown_model=self.allow_unknown_model, each=each)
        if remember and key is not None:
            checked_inputs.set({**checked_inputs.get(), key: checked})
        return checked

    def _check_key(self) -> Hashable | None:
        """What a check of this input depends on: the file as it is now, and the rules it is checked by (every other
        field; a rule that reads differently only costs a second read)."""
        if not isinstance(self.source, (str, Path)):
            return None
        try:
            path = Path(self.source).resolve()
            stat = path.stat()
        except OSError:
            return None
        table = None if self.table is None else (self.table.prices_file, self.table.prices_as_of, self.table.priced_on)
        rules = tuple((f.name, repr(getattr(self, f.name))) for f in fields(self) if f.name not in ("source", "table"))
        return (str(path), stat.st_size, stat.st_mtime_ns, stat.st_ino, table, rules)


# Inputs checked whole in this context (``PromptInput.check(remember=True)``), by what their check depends on: the
# command checks the file before it starts the flow, and the flow's run (the same context) does not read it again.
checked_inputs: ContextVar[Mapping[Hashable, InputCheck]] = ContextVar("llm_dispatch_checked_inputs", default={})


@dataclass(frozen=True, slots=True)
class StoredSlice:
    """Prompts ``store_rest`` has stored: input positions ``start .. stop - 1``, in order."""

    start: int
    stop: int
    specs: list[PromptSpec]
    # Each spec's planned route, as stored.
    routes: list[Route | None] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class RecordedJob:
    job_id: str
    total: int
    resumed: bool
    # A new job stored in slices (``record_job(head=...)``): its input, of which the first ``head``
    # prompts are stored; ``store_rest`` stores the others. The job's status stays ``recording`` until then.
    input: PromptInput | None = None
    head: int = 0
    # When the job was recorded: relative deadlines of the rest count from it, as the first ones' did.
    recorded_at: datetime | None = None
    # Requests (dedupe keys) that more than one prompt of the job makes: their prompts may be split
    # between slices, so a sender grouping identical requests waits until all are stored.
    repeated_keys: Container[str] = frozenset()
    # The input's check, whose kept prompts (``InputCheck.specs``, a small input's) ``store_rest`` stores.
    checked: InputCheck | None = field(default=None, repr=False)
    # The providers its prompts go to: the run needs a client (a key) for each before it sends anything.
    providers: frozenset[str] = frozenset()
    name: str = ""
    # A resumed job: its prompts with an outcome (succeeded or failed) when this run found it.
    answered: int = 0
    # A new job with ``record_job(estimate=True)``: the estimate's sums of its prompts, made as they were stored whole,
    # or by the check pass of one stored in slices (``estimate_cost(recorded=...)``), so the estimate reads none back.
    sums: EstimateSums | None = field(default=None, repr=False, compare=False)
    # A new job started because the finished job of the same input was not to be resumed (``dedupe`` off).
    started_over_from: str | None = None
    # A new job stored in slices with ``record_job(estimate=True)``: its prompts routed to the Batch API (the check
    # pass routed them), which a real-time feed does not wait for.
    batched: int = 0
    # A new job with ``record_job(estimate=True)``: the prefixes its prompts share, each group's cache plan priced,
    # found in the same pass as ``sums`` and stored with the job (``storage.store_cache_groups``).
    cache: CacheEstimate | None = field(default=None, repr=False, compare=False)

    @property
    def rest(self) -> int:
        """How many prompts ``store_rest`` has to store."""
        return self.total - self.head if self.input is not None else 0

    @property
    def stored(self) -> int:
        """Prompts stored so far: input positions ``0 .. stored - 1``."""
        return self.head if self.input is not None else self.total


def routing_rules(settings: Settings) -> RoutingRules:
    return RoutingRules(policy=settings.route_policy, urgent_below_chars=settings.urgent_below_chars,
                        margin=timedelta(seconds=settings.deadline_margin))


async def replan_pending(sessions: storage.Sessions, *, job_id: str, rules: RoutingRules, now: datetime) -> int:
    """Route a resumed job's pending prompts by ``rules.policy`` when it is ``all-realtime`` or ``all-batch`` (given
    again with ``--route``), whatever route was stored when they were recorded; returns how many moved. A prompt
    whose deadline falls before the batch window and margin from ``now`` keeps its route: no batch could meet it."""
    reason = f"--route {rules.policy} on a resumed job"
    if rules.policy == "all-realtime":
        return await storage.reroute_pending(sessions, job_id=job_id, route="realtime", reason=reason)
    if rules.policy == "all-batch":
        return await storage.reroute_pending(sessions, job_id=job_id, route="batch", reason=reason,
                                             due_after=now + rules.batch_window + rules.margin)
    raise ValueError(f"route policy {rules.policy!r} is decided per prompt when recorded; it re-plans nothing")


def prompt_input(source: str | Path | Sequence[Mapping[str, Any]], *, settings: Settings) -> PromptInput:
    """The input at ``source`` (a path or a list of dicts), each prompt to be checked against its model's
    context window and maximum output in the price table (the bundled one and ``settings.prices_file``);
    raises ``ConfigError`` for a bad price file."""
    return PromptInput(source=source, default_model=settings.model, default_endpoint=settings.endpoint,
                       table=load_prices(settings),
                       model_providers=ProviderTable.from_settings(settings),
                       default_max_tokens=settings.default_max_tokens,
                       anthropic_version=settings.anthropic_version, default_params=job_params(settings),
                       allow_unknown_model=settings.allow_unknown_model)


def job_params(settings: Settings) -> dict[str, Any] | None:
    """The parameters every prompt of a job gets unless it sets its own: the job's schema (``--schema``)."""
    if settings.response_schema is None:
        return None
    return {"response_format": load_schema(settings.response_schema)}


def fingerprint_of(path: str | Path, *, settings: Settings) -> str:
    """The fingerprint a job of the prompts in ``path`` has (same prompts, same default model)."""
    return prompt_input(path, settings=settings).check(keep=False).fingerprint


async def record_job(
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
    """Record the prompts of ``source`` as a job, or find the job they already are and resume it.

    Which job a run works on (the README's "Resume or start over"): ``job_id`` (a whole id, a unique
    prefix of one, or a job's name) names it; ``new_job`` always starts one; otherwise the newest job
    of the same input (the same prompts and default model), among those called ``name`` when one is
    given, is resumed; except, when ``settings.dedupe`` is off, one whose resume would send nothing (every
    prompt answered, no failure that ``retry_failed`` sends again): then a new job sends every prompt
    again. A new job is called ``name``, else after its input file.

    Each prompt is routed once, here, by ``rules`` (None: every prompt real-time); the decision, its
    reason and the prompt's deadline are stored with it. The whole input is validated first.

    ``head``: a new job stores only its first ``head`` prompts here and returns the others in
    ``RecordedJob.rest`` for ``store_rest``, so sending can start while they are stored; until
    then the job's status is ``recording``. A job left ``recording`` (its run was cut off) gets
    its missing prompts stored when it is met again, from the same input or its input file.

    ``estimate``: a new job comes back with the cost estimate's sums of its prompts (``sums``): made as they are
    stored when it is stored whole, else by its check pass (``CheckPassEstimate``), routed there as they will be
    stored, so that no prompt is read twice for it. The same pass finds the prefixes they share (``cache``): each
    group with its cache plan (``settings.cache_plan``, for ``settings.concurrency``), stored with the job.
    """
    if job_id is not None:
        job_id = await storage.resolve_job(sessions, reference=job_id)
    if source is None:
        if job_id is None:
            raise ConfigError("give prompts (a .jsonl/.csv path or a list of dicts) or the job id to resume")
        job = await _require_job(sessions, job_id=job_id, settings=settings)
        if job.status == "recording":
            given, checked = _input_of(job, settings=settings)
            job = await _finish_recording(sessions, job=job, given=given, rules=rules, checked=checked)
        logger.info("resuming job %s (%s)", job_id, counted(sum(job.counts.values()), "prompt"))
        return _resumed(job, providers=await _stored_providers(sessions, job_id=job_id, settings=settings))

    given = prompt_input(source, settings=settings)
    # A new job stored while it is sent is routed and priced by its check pass, as of now (when it is recorded).
    now = datetime.now(UTC)
    ahead = (CheckPassEstimate(table=given.table, rules=rules, now=now, dedupe=settings.dedupe,
                                 without_batches=batchless_providers(given.model_providers),
                                 prefixes=_prefixes(given))
             if head is not None and estimate and given.table is not None else None)
    checked = given.check(each=ahead)
    digest = checked.fingerprint
    existing = job_id
    started_over_from = None
    if existing is None and not new_job:
        existing = await storage.find_job(sessions, fingerprint=digest, name=name)
        if existing is not None and not settings.dedupe and await _all_answered(sessions, job_id=existing,
                                                                                 retry_failed=retry_failed):
            started_over_from, existing = existing, None
    if existing is not None:
        job = await _require_job(sessions, job_id=existing, settings=settings)
        if job.status == "recording":
            if job.fingerprint != digest:
                raise ConfigError(f"job {existing} was cut off while recording other prompts than this input's: "
                                  "run its own input again, or this input without the job id")
            job = await _finish_recording(sessions, job=job, given=given, rules=rules, checked=checked)
        logger.info("input already recorded as job %s: resuming it (only unfinished prompts are sent)", existing)
        return _resumed(job, providers=checked.providers)

    input_path = str(Path(source).resolve()) if isinstance(source, (str, Path)) else None
    name = name or (Path(source).name if isinstance(source, (str, Path)) else "prompts")
    split = head is not None and 0 < head < checked.count
    new_id = await storage.create_job(
        sessions,
        name=name,
        fingerprint=digest,
        input_path=input_path,
        model=settings.model,
        settings=settings.public_dict(),
        # Until its prompts are stored: a run killed in between leaves a job the next run completes.
        status="recording",
    )
    recorded = RecordedJob(job_id=new_id, total=checked.count, resumed=False, providers=checked.providers,
                           name=name, started_over_from=started_over_from)
    if not split:
        rows = new_prompts(given.specs(checked=checked), rules=rules, now=now, table=given.table,
                           without_batches=batchless_providers(given.model_providers))
        sums = EstimateSums(table=given.table) if estimate and given.table is not None else None
        prefixes = None if sums is None else _prefixes(given)
        if sums is not None:
            rows = counted_prompts(rows, sums=sums, dedupe=settings.dedupe, repeated=checked.repeated_keys,
                                   prefixes=prefixes)
        await storage.add_prompts(sessions, job_id=new_id, prompts=rows, then_status="created")
        logger.info("recorded job %s: %s", new_id, counted(checked.count, "prompt"))
        return replace(recorded, sums=sums, cache=await _store_groups(sessions, job_id=new_id, prefixes=prefixes,
                                                                      given=given, settings=settings))
    assert head is not None
    if ahead is not None and ahead.seen != checked.count:
        # Checked before in this context (the command checks the file first): priced in a pass of its own.
        ahead = CheckPassEstimate(table=ahead.sums.table, rules=rules, now=now, dedupe=settings.dedupe,
                                  without_batches=batchless_providers(given.model_providers),
                                  prefixes=_prefixes(given))
        for spec in given.specs(checked=checked):
            ahead(spec)
    await storage.add_prompts(sessions, job_id=new_id,
                              prompts=new_prompts(islice(given.specs(checked=checked), head), rules=rules, now=now,
                                                  without_batches=batchless_providers(given.model_providers),
                                                  table=given.table))
    logger.info("recording job %s: %s, the first %d stored", new_id, counted(checked.count, "prompt"), head)
    return replace(recorded, input=given, head=head, recorded_at=now, repeated_keys=checked.repeated_keys,
                   checked=checked, sums=None if ahead is None else ahead.sums,
                   batched=0 if ahead is None else ahead.batched,
                   cache=await _store_groups(sessions, job_id=new_id, prefixes=None if ahead is None else ahead.prefixes,
                                             given=given, settings=settings))


def _prefixes(given: PromptInput) -> JobPrefixes:
    """A collector of the prefix groups of ``given``'s prompts, each model's by the provider whose cache it meets."""
    table = given.model_providers
    if not isinstance(table, ProviderTable):
        table = ProviderTable(model_providers=table)
    return JobPrefixes(provider_of=table.cache_rules_of)


async def _store_groups(sessions: storage.Sessions, *, job_id: str, prefixes: JobPrefixes | None, given: PromptInput,
                        settings: Settings) -> CacheEstimate | None:
    """The groups ``prefixes`` found, each with its plan priced, stored with the job; None when none were looked for."""
    if prefixes is None:
        return None
    rows = prefixes.plans(prices=given.table, concurrency=settings.concurrency, enabled=settings.cache_plan)
    if rows:
        await storage.store_cache_groups(sessions, job_id=job_id, groups=rows)
    return CacheEstimate.of(rows, enabled=settings.cache_plan)


async def _require_job(sessions: storage.Sessions, *, job_id: str,
                       settings: Settings) -> storage.JobInfo:
    job = await storage.get_job(sessions, job_id=job_id)
    if job is None:
        database = settings.public_dict()["database_url"]
        raise UnknownJobError(f"no job {job_id!r} in {database}; `llm-dispatch status` lists jobs")
    return job


async def _all_answered(sessions: storage.Sessions, *, job_id: str,
                        retry_failed: RetryFailed) -> bool:
    """Whether a resume of the job would send nothing: no prompt waits (pending, in flight, in a batch) and no
    failed one is to be sent again."""
    counts = await storage.job_counts(sessions, job_id=job_id)
    return not unfinished(counts) and not await storage.unfinished_prompt_count(
        sessions, job_id=job_id, retry_failed=retry_failed)


async def _stored_providers(sessions: storage.Sessions, *, job_id: str, settings: Settings) -> frozenset[str]:
    """The providers a job's prompts were recorded for; ``ConfigError`` for one this run's providers file does not
    declare (its prompts would have nowhere to go)."""
    table = ProviderTable.from_settings(settings)
    providers = frozenset(provider or table.provider_of(model)
                          for model, provider in (await storage.job_providers(sessions, job_id=job_id)).items())
    missing = sorted(provider for provider in providers if provider not in table)
    if missing:
        raise ConfigError(f"job {job_id}'s prompts were recorded for provider {missing[0]}, which no providers file "
                          "of this run declares: give the providers file it was run with (--providers-file, "
                          "LLM_DISPATCH_PROVIDERS_FILE)")
    return providers


def _resumed(job: storage.JobInfo, *, providers: frozenset[str]) -> RecordedJob:
    counts = job.counts
    return RecordedJob(job_id=job.id, total=sum(counts.values()), resumed=True, providers=providers, name=job.name,
                       answered=counts.get("succeeded", 0) + counts.get("failed", 0))


async def store_rest(
    *,
    job_id: str,
    given: PromptInput,
    start: int,
    sessions: storage.Sessions,
    first_slice: int,
    recorded_at: datetime,
    then_status: JobStatus,
    rules: RoutingRules | None = None,
    checked: InputCheck | None = None,
) -> AsyncIterator[StoredSlice]:
    """Store the prompts of ``given`` from input position ``start`` on (those ``record_job`` left for
    later), yielding each slice once stored, so that it can be sent while the next is stored.

    Slices start at ``first_slice`` prompts and grow to ``MAX_SLICE``, each its own transaction, routed
    by ``rules`` as of ``recorded_at`` like the first ones. The last slice moves the job on from
    ``recording`` to ``then_status``. Only the slice at hand is in memory, unless ``checked`` (the input's check)
    kept the whole input: its prompts are stored from there.
    """
    if first_slice < 1:
        raise ValueError("first_slice must be at least 1")
    specs = given.specs(start=start, checked=checked)
    size = min(first_slice, MAX_SLICE)
    part = list(islice(specs, size))
    while part:
        size = min(size * 2, MAX_SLICE)
        # One slice ahead: the last one is known as such, and moves the job on in its own transaction.
        after = list(islice(specs, size))
        rows = list(new_prompts(part, rules=rules, now=recorded_at, table=given.table,
                                without_batches=batchless_providers(given.model_providers)))
        await storage.add_prompts(sessions, job_id=job_id, prompts=rows, skip_existing=True,
                                  then_status=None if after else then_status)
        yield StoredSlice(start=part[0].position, stop=part[-1].position + 1, specs=part,
                          routes=[row.planned_route for row in rows])
        part = after


def _input_of(job: storage.JobInfo, *, settings: Settings) -> tuple[PromptInput, InputCheck]:
    """The input of a job cut off while recording: its input file, and its check, which found the same prompts."""
    cut_off = f"job {job.id} was cut off while its prompts were being recorded ({sum(job.counts.values())} stored)"
    if job.input_path is None or not Path(job.input_path).is_file():
        where = f"its input {job.input_path} is gone" if job.input_path else "it was given as a list, not a file"
        raise ConfigError(f"{cut_off} and {where}: run the same prompts again as input (not by job id) to store the rest")
    given = prompt_input(job.input_path, settings=settings)
    checked = given.check()
    if checked.fingerprint != job.fingerprint:
        raise ConfigError(f"{cut_off}, and its input {job.input_path} no longer reads as the same prompts (the file "
                          "or the default model changed): run it with the original input and model")
    return given, checked


async def _finish_recording(
    sessions: storage.Sessions,
    *,
    job: storage.JobInfo,
    given: PromptInput,
    rules: RoutingRules | None,
    checked: InputCheck | None = None,
) -> storage.JobInfo:
    """Store the prompts a cut-off recording left out (those stored stay as they are); the job as it is now.

    Relative deadlines count from when the job was created, as they did for the prompts stored then.
    """
    stored = sum(job.counts.values())
    await storage.add_prompts(sessions, job_id=job.id,
                              prompts=new_prompts(given.specs(checked=checked), rules=rules, now=job.created_at,
                                                  table=given.table,
                                                  without_batches=batchless_providers(given.model_providers)),
                              skip_existing=True, then_status="created")
    finished = await storage.get_job(sessions, job_id=job.id)
    assert finished is not None
    logger.warning("job %s was cut off while its prompts were being recorded: %d of %d were stored, now all are",
                   job.id, stored, sum(finished.counts.values()))
    return finished
