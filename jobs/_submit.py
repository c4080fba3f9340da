"""Putting prompts into provider batches: write the files, record, upload, create; and finish what a
crash left half done. Plain async code over the client and storage (no Prefect); ``tasks.batch`` wraps it.

Each step is recorded before and after its provider call, so the database always says how far a
batch got:

    preparing  row and members stored, prompts ``batched``; file written, maybe uploaded (id unknown)
    uploaded   input file id stored; the batch may or may not exist at the provider
    validating / in_progress / ...   provider batch id stored

``advance_submission`` takes a batch from wherever it stands to created. For ``uploaded`` it first
looks for the provider batch a create that reached the provider before the process died made
(``BatchApi.find``: by our ids in its metadata on OpenAI, by its display name on Gemini, by its size and time on
Anthropic) and
adopts it, so a crash never makes a second batch for the same prompts. The create itself is one
attempt at a time: after a timeout, a dropped connection or a 5xx the batch may exist all the same,
so it is looked up again before every retry. Anthropic's Message Batches have no upload: their
``uploaded`` means only that the create may have been sent.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Final


from llm_dispatch import storage
from llm_dispatch.core import (
    BATCH_ID_KEY,
    DEFAULT_MAX_RETRIES,
    JOB_ID_KEY,
    Adopted,
    APIError,
    APIStatusError,
    BatchApi,
    BatchConflictError,
    BatchInfo,
    BatchLimits,
    CachePlan,
    ChatRequest,
    InputError,
    NotFoundError,
    batch_metadata_problem,
    packed_request,
    split_member_id,
    write_batch_files,
    RetryFailed,
)

from ._batch_build import BatchBuilder, BuiltFile, Group, request_groups
from ._cache_plan import describe_plan, make_batch_caches, plan_run_caches
from ._clients import Clients
from ._plan import Selection
from ._reuse import reuse_stored_answers

__all__ = [
    "SubmitOutcome",
    "advance_submission",
    "adopted_by",
    "find_provider_batch",
    "submit_prompts",
]

logger = logging.getLogger(__name__)

# Uploads and creates in flight at once.
SUBMIT_CONCURRENCY: Final = 4
# Open prompts read per query while building the files (a keyset page, with its messages).
SUBMIT_PAGE: Final = 5000


@dataclass(slots=True)
class SubmitOutcome:
    """What one or more submissions did: our ids of the batches created, their lines and prompts."""

    batch_ids: list[int] = field(default_factory=list)
    lines: int = 0
    prompts: int = 0
    reused: int = 0  # answered from stored identical requests, never sent
    # Left pending: their worst case did not fit the budget (they wait for a later submission).
    over_budget: int = 0

    def add(self, other: SubmitOutcome) -> None:
        self.batch_ids += other.batch_ids
        self.lines += other.lines
        self.prompts += other.prompts
        self.reused += other.reused
        self.over_budget += other.over_budget


async def submit_prompts(
    *,
    sessions: storage.Sessions,
    clients: Clients,
    writer: storage.ResultWriter,
    job_id: str,
    directory: Path,
    retry_failed: RetryFailed = "retryable",
    max_requests: int | None = None,
    max_bytes: int | None = None,
    dedupe: bool = True,
    resubmission_of: int | None = None,
    metadata: Mapping[str, str] | None = None,
    max_retries: int = DEFAULT_MAX_RETRIES,
    page: int = SUBMIT_PAGE,
    budget: storage.BudgetInfo | None = None,
    cache_plan: bool = False,
) -> SubmitOutcome:
    """Send the open batch-routed prompts of ``job_id`` (failed ones as ``retry_failed`` says, like
    ``storage.unfinished_prompts``) as provider batches: one line per distinct request, files split per model
    and at the provider's limits (or ``max_requests`` / ``max_bytes`` where given), each to its model's
    provider. Returns our ids of the batches created.

    With ``dedupe``, a request already answered in storage is reused and never sent, and identical
    prompts share one line (one paid request). ``max_retries`` bounds the retries of each create.

    The prompts are read ``page`` at a time in input order, and each file is recorded (and its
    upload begun) as soon as it is complete: memory holds a page and the files being filled. A request
    too large for any file raises ``ValueError``; the files recorded before it stay recorded. ``metadata`` goes on
    each OpenAI batch beside llm-dispatch's own two keys: more than OpenAI takes raises ``InputError`` first.

    ``budget``: each line's worst case at the batch price is reserved before its file is built, and each file's
    reservation becomes the batch's own once it is recorded (spent as its answers are stored, the rest given back
    when it ends); once a line does not fit, the files are cut there and the rest of the prompts wait, pending.

    ``cache_plan``: each line as the Batch API lane's cache plan writes it (``plan_run_caches(lane="batch")``: an
    Anthropic group's breakpoint), reserved as written.
    """
    if metadata:
        problem = batch_metadata_problem(metadata, added=len((JOB_ID_KEY, BATCH_ID_KEY)))
        if problem is not None:
            raise InputError(problem, field="metadata")
    outcome = SubmitOutcome()
    plan = None
    if cache_plan:
        plan = await plan_run_caches(sessions=sessions, job_id=job_id, prices=writer.prices,
                                     selection=Selection(retry_failed=retry_failed, planned_route="batch"),
                                     provider_of=clients.providers.cache_rules_of, concurrency=1, lane="batch")
        for line in describe_plan(plan):
            logger.info("Job %s: %s", job_id, line)
    builder = BatchBuilder(directory=Path(directory) / job_id, provider_of=clients.provider_of,
                           upstream=clients.upstream, cache_plan=plan)
    gate = asyncio.Semaphore(SUBMIT_CONCURRENCY)
    # The worst case reserved for each line, by its first prompt.
    held: dict[int, int] = {}
    lease = None if budget is None else storage.BudgetLease(sessions, budget=budget, prices=writer.prices,  # type: ignore[arg-type]
                                                            job_id=job_id, route="batch", block=page)

    async def submit(batch_id: int) -> None:
        # Batches are created while later files are still built; a provider whose lost creates are found by
        # size and time (Anthropic) takes one create at a time (``BatchApi.creating``, in advance_submission).
        async with gate:
            record = await storage.require_batch(sessions, batch_id=batch_id)
            await advance_submission(sessions=sessions, clients=clients, record=record, metadata=metadata,
                                     max_retries=max_retries)

    async def record(built: list[BuiltFile], tasks: asyncio.TaskGroup) -> None:
        for item in built:
            file, members = item.file, item.members
            try:
                batch_id = await storage.create_batch_record(
                    sessions, job_id=job_id, model=item.model, members=members, file_path=str(file.path),
                    resubmission_of=resubmission_of, provider=item.provider, endpoint=file.endpoint,
                )
            except BatchConflictError as exc:
                # Another run batched some of these meanwhile: they are in good hands; leave this file out.
                logger.warning("batch file %s not sent: %s", file.path.name, exc)
                file.path.unlink(missing_ok=True)
                continue
            if lease is not None:
                await lease.hand_over(batch_id=batch_id, amount=sum(held.pop(pid, 0) for pid, _ in members))
            outcome.batch_ids.append(batch_id)
            outcome.lines += file.requests
            outcome.prompts += len(members)
            tasks.create_task(submit(batch_id))

    try:
        if lease is not None:
            await lease.__aenter__()
        if plan is not None:
            await make_batch_caches(plan, sessions=sessions, job_id=job_id, prices=writer.prices,
                                    client_of=clients.for_model, lease=lease)
        async with asyncio.TaskGroup() as tasks:
            # The files completed are recorded while the next pages are read and written; one recording at a time
            # (in the order the files were made), so memory holds at most the members of the files it records.
            recording: asyncio.Task[None] | None = None

            async def recorded(built: list[BuiltFile]) -> None:
                nonlocal recording
                if not built:
                    return
                if recording is not None:
                    await recording
                recording = tasks.create_task(record(built, tasks))

            try:
                async for groups in request_groups(sessions, job_id=job_id, page=page, dedupe=dedupe,
                                                   retry_failed=retry_failed):
                    if dedupe:
                        groups = await _unanswered(sessions=sessions, writer=writer, groups=groups, outcome=outcome)
                    if lease is not None:
                        # A recording hands its files' reservations over from the lease: never while it reserves
                        # more.
                        if recording is not None:
                            await recording
                        groups = await _funded(lease, groups, held=held, outcome=outcome, plan=plan)
                    for provider in builder.needs(groups):
                        api = clients.batch_api(provider)
                        builder.use(provider, limits=api.limits(max_requests=max_requests, max_bytes=max_bytes))
                    await recorded(await _in_thread(builder.add, groups))
                await recorded(builder.close())
            finally:
                # A failure while building the next files lets the recording under way finish first (the task
                # group would cancel it): a batch recorded has its reservation handed over before the lease closes,
                # and the files recorded before the failure stay recorded.
                if recording is not None:
                    await asyncio.wait([recording])
    finally:
        builder.discard()
        if lease is not None:
            await lease.close()  # what files left unrecorded held
    if outcome.reused:
        await writer.flush()
    return outcome


async def _funded(
    lease: storage.BudgetLease, groups: list[Group], *, held: dict[int, int], outcome: SubmitOutcome,
    plan: CachePlan | None = None,
) -> list[Group]:
    """The groups whose worst case the budget holds, in order, up to the first that does not fit (the rest are
    counted in ``over_budget`` and left pending); ``held`` gets each one's amount by its first prompt."""
    for index, group in enumerate(groups):
        first = group.first
        request = _request(first)
        amount = await lease.reserve(request if plan is None else plan.prepare(request)[0])
        if amount is None:
            outcome.over_budget += sum(len(rest.prompt_ids) for rest in groups[index:])
            return groups[:index]
        held[first.id] = amount
    return groups


async def _unanswered(
    *, sessions: storage.Sessions, writer: storage.ResultWriter, groups: list[Group], outcome: SubmitOutcome
) -> list[Group]:
    """The groups whose request has no stored answer; the others are given theirs (``reused``)."""
    answered = set(await reuse_stored_answers(
        sessions=sessions, sink=writer, groups={group.first.dedupe_key: group.prompt_ids for group in groups}))
    if not answered:
        return groups
    outcome.reused += sum(len(group.prompt_ids) for group in groups if group.first.dedupe_key in answered)
    return [group for group in groups if group.first.dedupe_key not in answered]


async def _in_thread(add: Callable[[list[Group]], list[BuiltFile]], groups: list[Group]) -> list[BuiltFile]:
    """``add(groups)`` in a worker thread, so the event loop (uploads, the real-time half) keeps going.

    Cancelled, it still waits for the thread (which cannot be stopped) before the files are discarded,
    and removes those it completed: no one will record them.
    """
    work = asyncio.ensure_future(asyncio.to_thread(add, groups))
    try:
        return await asyncio.shield(work)
    except asyncio.CancelledError:
        await asyncio.wait([work])
        if not work.cancelled() and work.exception() is None:
            for item in work.result():
                item.file.path.unlink(missing_ok=True)
        raise


async def advance_submission(
    *,
    sessions: storage.Sessions,
    clients: Clients,
    record: storage.BatchRecord,
    metadata: Mapping[str, str] | None = None,
    max_retries: int = DEFAULT_MAX_RETRIES,
) -> storage.BatchRecord:
    """Take a batch in ``preparing`` or ``uploaded`` to created at the provider; return it as stored.

    Safe to call again after a crash at any point: an upload whose file id was never stored is made
    again (the orphan costs only storage), and a create that reached the provider is adopted.
    A batch already created is returned as it is. ``max_retries`` bounds the retries of the create.
    """
    api = clients.batch_api(record.provider)
    # A create is only ever sent for an ``uploaded`` batch: one that was ``preparing`` has none to look for.
    sent_before = record.status == "uploaded"
    if record.status == "preparing":
        path = await _input_file(sessions=sessions, record=record, sent_as=clients.sent_as) if api.uploads else None
        input_file_id = await api.upload(path) if path is not None else None
        await storage.update_batch(sessions, batch_id=record.id, status="uploaded", input_file_id=input_file_id)
        record = await storage.require_batch(sessions, batch_id=record.id)
    if record.status != "uploaded":
        return record
    async with api.creating():
        info = await api.find(record=record, adopted=adopted_by(sessions)) if sent_before else None
        if info is not None:
            logger.info("batch %d: adopting provider batch %s, created before this process lost track of it",
                        record.id, info.id)
        else:
            try:
                info = await _create(sessions=sessions, api=api, record=record, metadata=metadata or {},
                                     max_retries=max_retries, sent_as=clients.sent_as)
            except NotFoundError:
                if not api.uploads or not record.input_file_id:
                    raise
                # The uploaded file is gone (deleted, or expired at the provider): upload it again.
                path = await _input_file(sessions=sessions, record=record, sent_as=clients.sent_as)
                await storage.update_batch(sessions, batch_id=record.id, input_file_id=await api.upload(path))
                record = await storage.require_batch(sessions, batch_id=record.id)
                info = await _create(sessions=sessions, api=api, record=record, metadata=metadata or {},
                                     max_retries=max_retries, sent_as=clients.sent_as)
        await storage.update_batch(
            sessions,
            batch_id=record.id,
            status=info.status.value,
            provider_batch_id=info.id,
            input_file_id=info.input_file_id or record.input_file_id,
            submitted_at=info.created_at or datetime.now(UTC),
            expires_at=info.expires_at,
            request_total=info.request_counts.total or record.request_total,
            # An adopted batch may have ended already (it ran while its create's answer was lost): its results.
            output_file_id=info.output_file_id,
            error_file_id=info.error_file_id,
        )
    logger.info("batch %d: created %s (%d lines, %s)", record.id, info.id, record.request_total, record.model)
    return await storage.require_batch(sessions, batch_id=record.id)


async def _create(
    *, sessions: storage.Sessions, api: BatchApi, record: storage.BatchRecord, metadata: Mapping[str, str],
    max_retries: int, sent_as: Callable[[ChatRequest], ChatRequest],
) -> BatchInfo:
    """Create the provider batch for ``record``, never twice: the client's one retry loop (its waits, Retry-After
    and clock) sends the create, and after each attempt whose answer was lost (timeout, dropped connection, 5xx)
    it reads the provider's list (after the wait, giving the batch time to show) and adopts a batch found there
    instead of trying again. A refusal (a 4xx other than 408/409/429) is raised at once."""
    # A backend that uploads may still send a small batch's requests in the create (Gemini's inline requests).
    path = await _input_file(sessions=sessions, record=record, sent_as=sent_as) if not api.uploads or not record.input_file_id else None

    async def find_lost() -> BatchInfo | None:
        found = await api.find(record=record, adopted=adopted_by(sessions))
        if found is not None:
            logger.info("batch %d: a create attempt got no answer, but made %s: adopted", record.id, found.id)
        return found

    try:
        return await api.create(record=record, path=path, input_file_id=record.input_file_id, metadata=metadata,
                                max_retries=max_retries, find_lost=find_lost)
    except APIError as exc:
        if not exc.retryable:
            raise
        raise _gave_up(exc, record=record) from exc


def _gave_up(error: APIError, *, record: storage.BatchRecord) -> APIError:
    """``error``, its class kept (callers judge retryability by it), saying what became of the batch."""
    message = (
        f"Batch {record.id} of job {record.job_id} was not created after {error.attempts} attempts, and the provider "
        f"lists no batch for it; last: {error.message} It is recorded as ready to create: `llm-dispatch collect` (or "
        "running the job again) looks the batch up before creating it, so it is never made twice."
    )
    if isinstance(error, APIStatusError):
        return type(error)(message, status_code=error.status_code, request_id=error.request_id,
                           attempts=error.attempts, retryable=error.retryable)
    return type(error)(message, attempts=error.attempts)


async def find_provider_batch(*, sessions: storage.Sessions, clients: Clients,
                              record: storage.BatchRecord) -> BatchInfo | None:
    """The provider batch created for our batch ``record``, if any (see ``BatchApi.find``)."""
    return await clients.batch_api(record.provider).find(record=record, adopted=adopted_by(sessions))


def adopted_by(sessions: storage.Sessions) -> Adopted:
    """Whether one of our stored batches already holds a provider batch id (``BatchApi.find``'s ``adopted``)."""

    async def adopted(provider_batch_id: str) -> bool:
        return await storage.find_batch_by_provider_id(sessions, provider_batch_id=provider_batch_id) is not None

    return adopted


async def _input_file(*, sessions: storage.Sessions, record: storage.BatchRecord,
                      sent_as: Callable[[ChatRequest], ChatRequest]) -> Path:
    """The batch's input file on disk, written again from its members when it is missing."""
    path = Path(record.file_path) if record.file_path else None
    if path is not None and path.is_file():
        return path
    # Each line's first prompt per member, in input order (a packed embeddings line has a member per text).
    lines: dict[str, list[tuple[int, int]]] = {}
    packed: set[str] = set()
    for member, ids in (await storage.batch_members(sessions, batch_id=record.id)).items():
        line, index = split_member_id(member)
        lines.setdefault(line, []).append((index, ids[0]))
        if line != member:
            packed.add(line)
    rows = {row.id: row for row in await storage.load_work(
        sessions, prompt_ids=[pid for parts in lines.values() for _, pid in parts])}

    def request(line: str, parts: list[tuple[int, int]]) -> ChatRequest:
        # Under the name its provider's API knows (a declared provider's model is recorded as NAME/model).
        if line not in packed:
            return sent_as(_request(rows[parts[0][1]]))
        return sent_as(packed_request([_request(rows[pid]) for _, pid in sorted(parts)]))

    directory = path.parent if path is not None else Path(".")
    [file] = await asyncio.to_thread(
        write_batch_files,
        ((line, request(line, parts)) for line, parts in lines.items()),
        directory=directory,
        # One file whatever the limits: these lines were one batch already.
        limits=BatchLimits(max_requests=len(lines), max_bytes=2**62, max_embedding_inputs=2**62),
        prefix=f"in-{time.time_ns()}-rewritten",
    )
    await storage.update_batch(sessions, batch_id=record.id, file_path=str(file.path))
    return file.path


def _request(row: storage.WorkRow) -> ChatRequest:
    return ChatRequest(model=row.model, messages=row.messages, params=row.params, endpoint=row.endpoint)
