"""Following provider batches to the end: poll, ingest the output, and decide what happens to every
prompt a batch did not answer. Plain async code over the client and storage (no Prefect).

After ``ingest_batch`` each member of the batch is exactly one of:

* succeeded (route ``batch``; identical prompts sharing the line get ``reused``);
* failed, with the provider's reason: a line refused for good (a 400, say), a batch that failed
  validation, or a batch the user cancelled;
* pending again, to be sent once more: a retryable line error (429, 5xx; per provider, see
  ``core._line_errors``: OpenAI's ``batch_expired``, ``batch_cancelled``, ``request_timeout``, Anthropic's
  ``api_error``, ``overloaded_error``, ``rate_limit_error``, ``timeout_error``, ``canceled``, ``expired``) or a
  line an expired or provider-cancelled batch never reached. Its route stays ``batch`` while its deadline
  leaves room for another 24-hour window and it has been in fewer than ``max_submissions`` batches;
  otherwise it is re-routed to real-time, with the reason stored.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final


from llm_dispatch import storage
from llm_dispatch.core import (
    BatchCancelledError,
    BatchFailedError,
    BatchInfo,
    BatchLine,
    BatchLineError,
    ResultFile,
    checked,
    embedding_text,
    split_member_id,
    status_error_class,
    unpack_line,
    TERMINAL_BATCH_STATUSES,
    to_json,
    counted,
)


from ._clients import Clients
from ._reask import reask_invalid, reask_number

__all__ = ["IngestOutcome", "cancel_batch", "cancel_batches", "ingest_batch", "poll_batch", "reroute_for_deadlines"]

logger = logging.getLogger(__name__)

BATCH_WINDOW: Final = timedelta(hours=24)
# Provider errors quoted in a failed batch's message.
QUOTED_ERRORS: Final = 3
READ_SLICE: Final = 5000
# Line errors that mean "never answered, the batch was stopped": Anthropic's ``canceled`` result lines, OpenAI's
# ``batch_cancelled`` error lines, Gemini's ``CANCELLED`` statuses.
CANCELLED_LINES: Final = frozenset({"canceled", "batch_cancelled", "CANCELLED"})
STORE_SLICE: Final = 5000


@dataclass(slots=True)
class IngestOutcome:
    batch_id: int
    status: str  # the provider's final status
    succeeded: int = 0
    invalid: int = 0  # answered, not as their schema asks (counted apart from succeeded)
    valid_after_reask: int = 0  # of the succeeded, answers to a follow-up batch's re-ask
    # Invalid answers asked again: in these follow-up batches (prompts), or at once in real time (prompts).
    reask_batches: list[int] = field(default_factory=list)
    reasked_in_batches: int = 0
    reasked_realtime: int = 0
    reasks_over_budget: int = 0  # invalid answers not asked again: their worst case did not fit the budget
    reasks_failed: int = 0  # re-asks of follow-up batches that came back no answer: their prompts stay invalid
    failed: int = 0
    resend: int = 0  # members back to pending, to go in another batch or real-time
    to_realtime: int = 0  # of those, re-routed to real-time
    unknown_lines: int = 0  # output lines with a custom_id that is not a waiting member
    failed_by_code: dict[str, int] = field(default_factory=dict)


async def poll_batch(*, sessions: storage.Sessions, clients: Clients, record: storage.BatchRecord) -> storage.BatchRecord:
    """Ask the provider how the batch stands and store it (status, counts, file ids, errors)."""
    if record.provider_batch_id is None:
        raise ValueError(f"batch {record.id} has not been created at the provider yet (status {record.status})")
    info = await clients.batch_api(record.provider).retrieve(record.provider_batch_id)
    await storage.update_batch(sessions, batch_id=record.id, **_fields(info))
    updated = await storage.get_batch(sessions, batch_id=record.id)
    assert updated is not None
    return updated


def _fields(info: BatchInfo) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "status": info.status.value,
        "request_completed": info.request_counts.completed,
        "request_failed": info.request_counts.failed,
        "output_file_id": info.output_file_id,
        "error_file_id": info.error_file_id,
        "last_polled_at": datetime.now(UTC),
    }
    if info.request_counts.total:
        fields["request_total"] = info.request_counts.total
    if info.expires_at is not None:
        fields["expires_at"] = info.expires_at
    finished = info.completed_at or info.failed_at or info.expired_at or info.cancelled_at
    if info.status.is_terminal:
        fields["finished_at"] = finished or datetime.now(UTC)
    if info.errors:
        fields["errors"] = [
            {"code": e.code, "message": e.message, "line": e.line, "param": e.param} for e in info.errors
        ]
    return fields


async def ingest_batch(
    *,
    sessions: storage.Sessions,
    clients: Clients,
    writer: storage.ResultWriter,
    record: storage.BatchRecord,
    directory: Path,
    max_submissions: int,
    deadline_margin: timedelta = timedelta(hours=1),
    now: datetime | None = None,
    max_reasks: int = 0,
    budget: storage.BudgetInfo | None = None,
) -> IngestOutcome:
    """Store what a finished batch answered and settle every member (see the module notes).

    Idempotent: only members still ``batched`` are written, so an ingest cut short by a crash and
    run again writes each answer once. Marks the batch ``ingested`` last. An answer that breaks its schema is asked
    again (``reask_invalid``: a follow-up batch, or real time when its deadline leaves no window) up to
    ``max_reasks`` times, each re-ask's worst case reserved out of ``budget`` (the run's) first.
    """
    if record.status not in TERMINAL_BATCH_STATUSES:
        raise ValueError(f"batch {record.id} is {record.status!r}, not finished; poll it until it is")
    outcome = IngestOutcome(batch_id=record.id, status=record.status)
    waiting = await storage.batch_members(sessions, batch_id=record.id, waiting_only=True)
    latency_s = _answer_time(record)
    directory = Path(directory) / record.job_id
    answers: list[tuple[list[int], Any]] = []
    again: list[int] = []  # members of retryable error lines, back to pending
    # Invalid answers with the number of the asking each answered: asked again once the batch is settled.
    to_reask: list[tuple[list[int], Any]] = []
    reask_from: dict[int, int] = {}

    async def store_answers(answers: list[tuple[list[int], Any]]) -> None:
        # Each answer checked against its prompt's schema, if it has one (invalid ones are stored as such); an
        # answer to a prompt that has an invalid one already answers a follow-up batch: it is numbered after it.
        firsts = [ids[0] for ids, _ in answers]
        schemas = await storage.answer_schemas(sessions, prompt_ids=firsts)
        levels: dict[int, int] = {}
        if schemas:
            answers[:] = [(ids, checked(result, schemas.get(ids[0]))) for ids, result in answers]
            levels = {pid: level + 1 for pid, level in
                      (await storage.reask_levels(sessions, prompt_ids=[p for p in firsts if p in schemas])).items()}
        # Answers go in bulk (thousands a transaction), priced as the writer prices; the rarer failures through it.
        await storage.store_batch_answers(sessions, job_id=record.job_id, answers=answers, model=record.model,
                                          prices=writer.prices, latency_s=latency_s, batch_id=record.id,
                                          reasks=levels)
        wrong = [(ids, result) for ids, result in answers if result.violation is not None]
        invalid = sum(len(ids) for ids, _ in wrong)
        outcome.invalid += invalid
        outcome.succeeded += sum(len(ids) for ids, _ in answers) - invalid
        outcome.valid_after_reask += sum(len(ids) for ids, result in answers
                                         if result.violation is None and ids[0] in levels)
        if max_reasks:
            to_reask.extend(wrong)
            reask_from.update((ids[0], levels.get(ids[0], 0)) for ids, _ in wrong)

    # Slices of answers stored while the next is read and settled: the database's work overlaps the parsing and the
    # building of rows. As many at once as the database writes side by side (``storage.write_lanes``); each slice is
    # its own transaction over members of its own, so the order they commit in changes nothing.
    lanes = storage.write_lanes(sessions)
    storing: list[asyncio.Future[None]] = []

    async def stored(*, keep: int = 0) -> None:
        while len(storing) > keep:  # the oldest first
            await storing.pop(0)

    async def store_slice() -> None:
        await stored(keep=lanes - 1)
        if answers:
            storing.append(asyncio.ensure_future(store_answers(answers[:])))
            answers.clear()

    # Each packed embeddings line's members (the settled ones too: every text's weight splits the line's usage).
    packed = await _packed_lines(sessions, record=record)

    async def settle(line: BatchLine, ids: list[int]) -> None:
        assert line.custom_id is not None
        if line.result is None and record.cancel_requested and line.error_code in CANCELLED_LINES:
            waiting[line.custom_id] = ids  # unanswered because the user cancelled: failed below
        elif line.result is not None:
            answers.append((ids, line.result))
        elif await _settle_failure(writer, line, ids, outcome=outcome, model=record.model, batch_id=record.id):
            again.extend(ids)

    async def read_results(files: Sequence[ResultFile]) -> None:
        for results in files:
            if not waiting:
                break
            path = await results.download(to=directory / f"batch-{record.id}-{results.kind}.jsonl")
            reader = results.read(path)

            def take() -> list[BatchLine]:
                # About READ_SLICE answers a slice, however many a line holds (a packed one: thousands of vectors).
                taken: list[BatchLine] = []
                answered = 0
                for line in reader:
                    taken.append(line)
                    answered += (len(line.result.embeddings or ()) or 1) if line.result is not None else 1
                    if answered >= READ_SLICE:
                        break
                return taken

            # Parsed a slice at a time (memory stays flat whatever the file's size), on the event loop, while the
            # slices before it are stored: in a thread of its own the parsing only contends for the GIL with the
            # rows being built and bound, and costs more CPU.
            while lines := take():
                await asyncio.sleep(0)  # the slices being stored go on between two slices read
                for line in lines:
                    if line.custom_id in packed:
                        members = packed.pop(line.custom_id)
                        texts = await _texts(sessions, members=members)
                        asked = [(index, name) for index, name, _ in members if name in waiting]
                        for name, part in unpack_line(line, texts=texts, members=asked):
                            await settle(part, waiting.pop(name))
                        continue
                    ids = waiting.pop(line.custom_id, None) if line.custom_id is not None else None
                    if ids is None:
                        outcome.unknown_lines += 1
                    elif line.result is not None:  # an answer, most lines: as ``settle`` takes it
                        answers.append((ids, line.result))
                    else:
                        await settle(line, ids)
                if len(answers) >= STORE_SLICE:
                    await store_slice()

    try:
        await read_results(clients.batch_api(record.provider).result_files(record))
        await store_slice()
        await stored()
    finally:
        if storing:  # the read (or a store) failed, or was cancelled, while slices were being stored: let them end
            await asyncio.wait(storing)
            for failed in storing:
                if not failed.cancelled() and failed.exception() is not None:
                    logger.warning("batch %s: storing a slice of answers failed (%s)", record.id,
                                   type(failed.exception()).__name__)

    # Members of a follow-up batch's lines that no line answered: their re-ask failed with the batch (it failed,
    # expired, was cancelled); each gets a row of its own and keeps its invalid answer, never sent as a first ask.
    for custom_id in [found for found in waiting if reask_number(found) is not None]:
        ids = waiting.pop(custom_id)
        await writer.failure(prompt_ids=ids, error=_unanswered_reask(record), route="batch", model=record.model,
                             reask=reask_number(custom_id) or 0)
        outcome.reasks_failed += len(ids)
    # Members no line answered.
    unanswered = [pid for ids in waiting.values() for pid in ids]
    if unanswered and record.status == "failed":
        error = BatchFailedError(_failed_message(record))
        await writer.failure(prompt_ids=unanswered, error=error, route="batch")
        outcome.failed += len(unanswered)
        _count(outcome, "batch_failed", len(unanswered))
        unanswered = []
    elif unanswered and record.cancel_requested:
        cancelled = BatchCancelledError(
            f"batch {record.id} was cancelled with `llm-dispatch cancel` before answering this prompt; "
            "run the job again with --retry-failed all to send it"
        )
        # One row per prompt: these were not answered, so nothing is "reused".
        for pid in unanswered:
            await writer.failure(prompt_ids=[pid], error=cancelled, route="batch")
        outcome.failed += len(unanswered)
        _count(outcome, "cancelled", len(unanswered))
        unanswered = []
    # How many batches each member to send again has been in, counted before a re-ask adds any: the members of a
    # batch that answered every line (most) need no count.
    resend = [*again, *unanswered]
    submissions = await storage.batch_submissions(sessions, batch_id=record.id) if resend else {}
    await writer.flush()
    # Unanswered members (an expired or provider-cancelled batch) go back to pending here.
    released = await storage.mark_batch_ingested(sessions, batch_id=record.id)
    outcome.resend += released
    # The ingest appended a ledger delta per slice: folded, as a real-time run's writer folds its own.
    await storage.compact_ledger(sessions, job_id=record.job_id)
    if to_reask:
        # After the batch is closed: its invalid members go into a batch of their own.
        reasked = await reask_invalid(
            sessions=sessions, clients=clients, writer=writer, job_id=record.job_id, invalid=to_reask,
            levels=reask_from, max_reasks=max_reasks, directory=directory.parent, now=now or datetime.now(UTC),
            margin=deadline_margin, budget=budget)
        await writer.flush()
        outcome.reask_batches += reasked.batch_ids
        outcome.reasked_in_batches += reasked.batched
        outcome.reasked_realtime += reasked.realtime
        outcome.reasks_over_budget += reasked.over_budget
    to_realtime = await _over_the_limit(
        sessions, prompt_ids=resend, submissions=submissions, max_submissions=max_submissions
    )
    # Whatever is pending again: real-time if its deadline no longer allows a batch.
    to_realtime += await reroute_for_deadlines(
        sessions, job_id=record.job_id, now=now or datetime.now(UTC), margin=deadline_margin
    )
    outcome.to_realtime = to_realtime
    logger.info("batch %d (%s) ingested: %s", record.id, record.status, to_json(outcome))
    return outcome


async def _packed_lines(
    sessions: storage.Sessions, *, record: storage.BatchRecord
) -> dict[str, list[tuple[int, str, int]]]:
    """Each packed line of an embeddings batch: its members ``(index, name, first prompt id)`` in input order."""
    if record.endpoint != "embeddings":
        return {}
    lines: dict[str, list[tuple[int, str, int]]] = {}
    for name, ids in (await storage.batch_members(sessions, batch_id=record.id)).items():
        line, index = split_member_id(name)
        if line != name:
            lines.setdefault(line, []).append((index, name, ids[0]))
    for members in lines.values():
        members.sort()
    return lines


async def _texts(sessions: storage.Sessions, *, members: Sequence[tuple[int, str, int]]) -> list[str]:
    """The texts of a packed line's members, in its order (each one's weight in the line's usage)."""
    rows = {row.id: row for row in await storage.load_work(sessions, prompt_ids=[pid for _, _, pid in members])}
    return [(embedding_text(rows[pid].messages) or "") if pid in rows else "" for _, _, pid in members]


async def _settle_failure(
    writer: storage.ResultWriter, line: BatchLine, ids: list[int], *, outcome: IngestOutcome, model: str,
    batch_id: int,
) -> bool:
    """Store a line's error for its prompts; returns whether they are to be sent again (a retryable
    error: in another batch, or real-time once over the limit). What a billed line cost is spent out of its batch's
    budget reservation, as its answers are."""
    code = line.error_code or "unknown_error"
    # Stored on each of its prompts' rows, which say whose it is: the line's own name (a member id) is ours alone.
    message = f"its batch line failed: {line.error_message or code}"
    error: BaseException
    if line.status_code is not None and not 200 <= line.status_code < 300:
        error = status_error_class(line.status_code)(message, status_code=line.status_code)
    else:
        # A line error code, or a 2xx that carried no answer (billed, so ``line.retryable`` is False).
        error = BatchLineError(message, code=code, retryable=line.retryable)
        error.usage, error.raw_body = line.usage, line.raw_body
        # Billed, or billing not said (a request that ran and timed out): counted as possibly billed.
        error.maybe_billed = 0 if line.billed is False else 1
    number = reask_number(line.custom_id or "")
    if number is not None:
        # A follow-up batch's re-ask: a row of its own, and its prompts keep their invalid answer (``invalid``).
        await writer.failure(prompt_ids=ids, error=error, route="batch", model=model, batch_id=batch_id,
                             reask=number)
        outcome.reasks_failed += len(ids)
        return False
    # Not final: the prompts go back to pending (history kept) and are sent again.
    await writer.failure(prompt_ids=ids, error=error, final=not line.retryable, route="batch", model=model,
                         batch_id=batch_id)
    if line.retryable:
        outcome.resend += len(ids)
    else:
        outcome.failed += len(ids)
        _count(outcome, code, len(ids))
    return line.retryable


async def _over_the_limit(
    sessions: storage.Sessions, *, prompt_ids: Sequence[int], submissions: dict[int, int], max_submissions: int
) -> int:
    spent = [pid for pid in prompt_ids if submissions.get(pid, 1) >= max_submissions]
    if not spent:
        return 0
    return await storage.set_planned_route(
        sessions, prompt_ids=spent, route="realtime",
        reason=f"unanswered in {counted(max_submissions, 'batch', many='batches')}; sent real-time",
    )


async def reroute_for_deadlines(sessions: storage.Sessions, *, job_id: str, now: datetime, margin: timedelta) -> int:
    """Re-route to real-time the job's batch-routed prompts still to send whose deadline falls before
    another batch window could end; returns how many."""
    return await storage.reroute_late_prompts(
        sessions, job_id=job_id, before=now + BATCH_WINDOW + margin,
        reason="deadline no longer leaves room for another batch window; sent real-time",
    )


def _unanswered_reask(record: storage.BatchRecord) -> Exception:
    """Why a follow-up batch left a re-ask unanswered: the batch's own failure, or how it ended."""
    if record.status == "failed":
        return BatchFailedError(_failed_message(record))
    return BatchLineError(f"batch {record.id} ended {record.status} without answering this re-ask; the prompt keeps "
                          "its invalid answer", code=record.status, retryable=False)


def _answer_time(record: storage.BatchRecord) -> float:
    if record.submitted_at is None or record.finished_at is None:
        return 0.0
    return max(0.0, (record.finished_at - record.submitted_at).total_seconds())


def _failed_message(record: storage.BatchRecord) -> str:
    errors = record.errors or []
    quoted = "; ".join(
        (f"line {e.get('line')}: " if e.get("line") else "") + f"{e.get('code') or 'error'}: {e.get('message')}"
        for e in errors[:QUOTED_ERRORS]
    )
    more = f" (and {len(errors) - QUOTED_ERRORS} more)" if len(errors) > QUOTED_ERRORS else ""
    return (
        f"batch {record.id} failed validation at the provider: {quoted or 'no reason given'}{more}; "
        "nothing in it was billed. Fix the input and run again with --retry-failed all"
    )


def _count(outcome: IngestOutcome, code: str, n: int) -> None:
    outcome.failed_by_code[code] = outcome.failed_by_code.get(code, 0) + n


async def cancel_batches(*, sessions: storage.Sessions, clients: Clients, job_id: str) -> list[storage.BatchRecord]:
    """Ask the provider to stop every open batch of ``job_id`` (``cancel_batch`` each); returns them as they now stand."""
    return [await cancel_batch(sessions=sessions, clients=clients, record=record)
            for record in await storage.unfinished_batches(sessions, job_id=job_id)]


async def cancel_batch(*, sessions: storage.Sessions, clients: Clients,
                       record: storage.BatchRecord) -> storage.BatchRecord:
    """Ask the provider to stop one open batch; returns it as it now stands.

    It is marked ``cancel_requested`` first, so whatever it did not answer is failed at ingest rather than sent
    again. What it answered before stopping is still ingested (and was billed). A batch never created at the
    provider is set ``cancelled`` at once.
    """
    from ._submit import find_provider_batch  # the one place cancel needs submission's lookup

    await storage.update_batch(sessions, batch_id=record.id, cancel_requested=True)
    if record.status not in TERMINAL_BATCH_STATUSES and record.status != "cancelling":
        provider_id = record.provider_batch_id
        if provider_id is None and record.status == "uploaded":
            found = await find_provider_batch(sessions=sessions, clients=clients, record=record)
            provider_id = found.id if found is not None else None
        if provider_id is None:
            await storage.update_batch(sessions, batch_id=record.id, status="cancelled", finished_at=datetime.now(UTC))
        else:
            info = await clients.batch_api(record.provider).cancel(provider_id)
            await storage.update_batch(sessions, batch_id=record.id, provider_batch_id=provider_id, **_fields(info))
    return await storage.require_batch(sessions, batch_id=record.id)
