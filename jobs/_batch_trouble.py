"""One batch's trouble kept to that batch: the error a step met on it stored on its row, with a growing wait before
a sweep tries it again; a batch the provider no longer knows looked up again, then closed as ``lost`` with its
prompts pending again; and ``abandon``, which gives a batch up by hand. Plain async code (no Prefect).

The one back-off rule for a batch's waits lives here too (``backoff``): the wait between a run's polls
(``poll_wait``) and the wait a sweep leaves a batch alone after errors in a row (``batch_error_wait``) are that
rule with their own first wait, growth and most.

Never paid twice: a batch is only lost when the provider answers 404 for its id *and* its list of batches holds
neither that id nor (OpenAI) a batch whose metadata names ours. A batch the provider does not hold runs nothing
and bills nothing, so sending its prompts again pays for each once. ``abandon`` refuses a batch the provider
still reports (running: ``cancel`` it; finished: ``collect`` ingests it) unless forced. A lost batch keeps its
provider id on its row, so no look-up ever adopts that provider batch for another of ours.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import ClassVar, Final, TypeVar

from llm_dispatch import storage
from llm_dispatch.core import (
    ACTIVE_BATCH_STATUSES,
    CLOSED_BATCH_STATUSES,
    BatchCancelledError,
    BatchInUseError,
    BatchInfo,
    APIConnectionError,
    InternalServerError,
    NotFoundError,
    Settings,
    json_field,
    counted,
)

from ._run import JobRun
from ._submit import adopted_by

__all__ = ["BATCH_RETRY_FIRST", "BATCH_RETRY_MAX", "ERROR_GROWTH", "FOLLOW_ERRORS", "POLL_GROWTH", "AbandonOutcome",
           "BatchProblem", "abandon_batch", "backoff", "batch_error_wait", "batch_trouble", "error_text", "lose_batch",
           "poll_wait"]

logger = logging.getLogger(__name__)

Wait = TypeVar("Wait", float, timedelta)

# After a batch's first error a sweep leaves it alone this long, ERROR_GROWTH times as long after each further one
# in a row, never longer than the maximum: a scheduled sweep (every 15 minutes) tries it on the next sweep, then less
# often.
BATCH_RETRY_FIRST: Final = timedelta(minutes=5)
BATCH_RETRY_MAX: Final = timedelta(hours=6)
ERROR_GROWTH: Final = 2.0
# Each wait between a run's polls is this many times the last, from ``batch_poll_interval`` up to
# ``batch_poll_max_interval``.
POLL_GROWTH: Final = 1.5
# Errors in a row after which a run stops following a batch and leaves it to collect-batches.
FOLLOW_ERRORS: Final = 3
# A stored error line is cut here: a provider's message can be long, a row's error is read in a table.
ERROR_CHARS: Final = 300


@dataclass(frozen=True, slots=True)
class BatchProblem:
    """What went wrong with one batch in a sweep or a cancel: the step, the error, and what happens next."""

    json_properties: ClassVar = ("retry_at", "line")

    batch_id: int | None  # None: a job's step after its batches (a resubmission), kept in the sweep's report only
    job_id: str
    step: str
    error: str
    lost: bool = False
    released: int = 0  # a lost batch's prompts back to pending
    errors_in_a_row: int = 0
    retry_after: datetime | None = json_field(skip=True, default=None)

    @property
    def line(self) -> str:
        """One line a person reads in a log, an artifact or the CLI."""
        where = f"batch {self.batch_id} (job {self.job_id[:8]})" if self.batch_id is not None else f"job {self.job_id[:8]}"
        if self.lost:
            return f"{where} lost: {self.error}; its {self.released} unanswered prompts are pending again"
        if self.batch_id is None:
            return f"{where}: {self.step} failed: {self.error}; the next sweep tries again"
        when = f"; tried again after {self.retry_after:%H:%M} UTC" if self.retry_after is not None else ""
        return f"{where}: {self.step} failed ({self.errors_in_a_row} in a row): {self.error}{when}"

    @property
    def retry_at(self) -> str | None:
        return None if self.retry_after is None else self.retry_after.isoformat(timespec="seconds")


def backoff(times: int, *, first: Wait, most: Wait, growth: float) -> Wait:
    """The wait after ``times`` waits before it: ``first``, ``growth`` times longer each time, never beyond ``most``."""
    # The cap on the exponent only keeps growth**times finite; the wait is capped long before that.
    return min(first * growth ** min(max(0, times), 64), most)


def poll_wait(polls: int, *, settings: Settings) -> float:
    """Seconds a run waits after its ``polls``-th round of polls (0 for the first) before the next."""
    return backoff(polls, first=settings.batch_poll_interval, most=settings.batch_poll_max_interval,
                   growth=POLL_GROWTH)


def batch_error_wait(errors_in_a_row: int) -> timedelta:
    """How long a sweep leaves a batch alone after its ``errors_in_a_row``-th error in a row."""
    return backoff(errors_in_a_row - 1, first=BATCH_RETRY_FIRST, most=BATCH_RETRY_MAX, growth=ERROR_GROWTH)


def error_text(error: BaseException) -> str:
    """An error as one bounded line: its class and message."""
    text = " ".join(f"{type(error).__name__}: {error}".split())
    return text if len(text) <= ERROR_CHARS else text[: ERROR_CHARS - 1] + "…"


async def batch_trouble(*, run: JobRun, record: storage.BatchRecord, step: str, error: BaseException,
                        now: datetime | None = None) -> BatchProblem:
    """Keep ``error``, met by ``step`` on ``record``, on that batch's row and say what happens next.

    A 404 from the provider for a created batch is looked up again (``BatchApi.locate``): listed under another
    id (OpenAI's metadata names ours) it is adopted and polled next time; listed nowhere, it is ``lost`` (see the
    module notes). Any other error, a failed look-up included, waits ``batch_error_wait`` before the next sweep.
    """
    now = now or datetime.now(UTC)
    if isinstance(error, NotFoundError) and record.provider_batch_id is not None:
        try:
            found = await run.clients.batch_api(record.provider).locate(record)
        except Exception as lookup_error:  # noqa: BLE001 - kept on the batch like the 404 it follows
            step, error = f"{step}, then its look-up", lookup_error
        else:
            if found is None:
                reason = f"the provider answered 404 for {record.provider_batch_id} and lists no batch of ours in its place"
                released, _ = await lose_batch(run=run, record=record, reason=reason)
                logger.warning("batch %d lost: %s; %s pending again", record.id, reason, counted(released, "prompt"))
                return BatchProblem(batch_id=record.id, job_id=record.job_id, step=step, error=reason, lost=True,
                                    released=released)
            if found.id != record.provider_batch_id:
                await _adopt(run, record=record, found=found)
                error = NotFoundError(f"{record.provider_batch_id} is unknown; adopted {found.id}, which the "
                                      "provider lists with our batch's ids", status_code=404)
    text = error_text(error)
    previous = record.error_count
    retry_after = now + batch_error_wait(previous + 1)
    count = await storage.record_batch_error(run.sessions, batch_id=record.id, error=f"{step}: {text}",
                                             retry_after=retry_after)
    logger.warning("batch %d: %s failed (%d in a row): %s", record.id, step, count, text)
    return BatchProblem(batch_id=record.id, job_id=record.job_id, step=step, error=text, errors_in_a_row=count,
                        retry_after=retry_after)


async def _adopt(run: JobRun, *, record: storage.BatchRecord, found: BatchInfo) -> None:
    await storage.update_batch(run.sessions, batch_id=record.id, provider_batch_id=found.id)
    logger.warning("batch %d: provider id %s is unknown; adopting %s, listed with our batch's ids",
                   record.id, record.provider_batch_id, found.id)


async def lose_batch(*, run: JobRun, record: storage.BatchRecord, reason: str) -> tuple[int, int]:
    """Close ``record`` as ``lost``: its members still waiting go back to pending or, when the user cancelled it,
    fail as cancelled ones do at ingest; returns how many went back to pending and how many failed."""
    failed = 0
    if record.cancel_requested:
        waiting = await storage.batch_members(run.sessions, batch_id=record.id, waiting_only=True)
        error = BatchCancelledError(f"batch {record.id} was cancelled with `llm-dispatch cancel` and then lost at "
                                    "the provider; run the job again with --retry-failed all to send it")
        async with storage.ResultWriter(run.sessions, job_id=record.job_id, prices=run.prices) as writer:
            for ids in waiting.values():
                for prompt_id in ids:
                    await writer.failure(prompt_ids=[prompt_id], error=error, route="batch")
                    failed += 1
    return await storage.mark_batch_lost(run.sessions, batch_id=record.id, reason=reason), failed


@dataclass(frozen=True, slots=True)
class AbandonOutcome:
    """A batch given up by hand: the batch, its prompts back to pending, and what the provider said of it."""

    batch_id: int
    job_id: str
    released: int
    provider_said: str
    cancelled: int = 0  # prompts of a batch the user had cancelled: failed as cancelled, not sent again


async def abandon_batch(*, run: JobRun, batch_id: int, force: bool = False) -> AbandonOutcome:
    """Give batch ``batch_id`` up by hand: close it ``lost`` and put its unanswered prompts back to pending.

    The provider is asked first. A batch it still reports is refused (``BatchInUseError``: sending its prompts
    again would pay for them twice) unless ``force``, which asks it to cancel first. A 404 or no answer at all
    gives it up; so does a batch never created at the provider.
    """
    record = await storage.require_batch(run.sessions, batch_id=batch_id)
    if record.status in CLOSED_BATCH_STATUSES:
        raise BatchInUseError(f"batch {batch_id} is already {record.status}; nothing to give up")
    api = run.clients.batch_api(record.provider)
    said = "never created at the provider"
    info: BatchInfo | None = None
    try:
        if record.provider_batch_id is not None:
            info = await api.retrieve(record.provider_batch_id)
        elif record.status == "uploaded":  # its create may have got through without our hearing of it
            info = await api.find(record=record, adopted=adopted_by(run.sessions))
    except (NotFoundError, APIConnectionError, InternalServerError) as exc:
        said = error_text(exc)  # unknown or unreachable: what abandon is for; a refused key stops here instead
    if info is not None:
        said = f"{info.id} is {info.status.value}"
        if not force:
            todo = ("`llm-dispatch cancel JOB` stops it and keeps what it answered"
                    if info.status in ACTIVE_BATCH_STATUSES else "`llm-dispatch collect` stores its answers")
            raise BatchInUseError(f"batch {batch_id}: the provider still holds it ({said}); {todo}, or add "
                                  "--force to give it up anyway (what it answers is billed and not kept)")
        if info.status in ACTIVE_BATCH_STATUSES:
            try:
                await api.cancel(info.id)
            except Exception as exc:  # noqa: BLE001 - forced: given up whatever the cancel says
                said += f"; its cancel failed: {error_text(exc)}"
    released, cancelled = await lose_batch(run=run, record=record, reason=f"abandoned by hand ({said})")
    logger.warning("batch %d abandoned by hand (%s); %s pending again", batch_id, said, counted(released, "prompt"))
    return AbandonOutcome(batch_id=batch_id, job_id=record.job_id, released=released, provider_said=said,
                          cancelled=cancelled)
