"""One step of a batch's life, the one every loop that follows batches takes: a waiting run's ``wait-for-batches``
sub-flow, the ``collect-batches`` sweep, a cancel waiting for the provider to stop. ``advance_batch`` moves a batch one
state forward (finish a half-submitted one's submission, poll, ingest once finished, give up past its expiry, keep
an error on it, lose it on a 404 its look-up confirms) and says what happened in a ``BatchStep``. Plain async code (no
Prefect): the ingest and the submission's finish are the caller's callables, so a flow runs them as task runs.
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal, Protocol

from llm_dispatch import storage
from llm_dispatch.core import ACTIVE_BATCH_STATUSES, HALF_SUBMITTED_BATCH_STATUSES, TERMINAL_BATCH_STATUSES

from ._batch_trouble import BatchProblem, batch_trouble
from ._collect import IngestOutcome, poll_batch
from ._run import JobRun

__all__ = ["BatchStep", "FinishSubmission", "Ingest", "advance_batch"]



class Ingest(Protocol):
    """Store a finished batch's answers: ``tasks.ingest_batch``, for a flow that shows each ingest as a task run."""

    def __call__(self, *, run: JobRun, batch_id: int) -> Awaitable[IngestOutcome]: ...


class FinishSubmission(Protocol):
    """Take a half-submitted batch on to created: ``tasks.finish_submission``, as a rule."""

    def __call__(self, *, run: JobRun, batch_id: int) -> Awaitable[storage.BatchRecord]: ...


Happened = Literal["open", "ingested", "submitted", "left", "errored", "lost"]


@dataclass(frozen=True, slots=True)
class BatchStep:
    """What one ``advance_batch`` did to a batch.

    * ``open``: polled, still with the provider; poll it again (a run waits ``poll_wait`` between rounds);
    * ``ingested``: finished and stored (``ingested``);
    * ``submitted``: a half-submitted batch's submission finished; poll it from now on;
    * ``left``: left to ``collect-batches`` (``why``): past its expiry's grace, half-submitted by a run that may be
      at it now, closed elsewhere, or (``problem``) after too many errors in a row;
    * ``errored``: the error kept on the batch (``problem``, its ``retry_after`` the wait a sweep gives it);
    * ``lost``: the provider no longer holds it; its unanswered prompts are pending again (``problem``).
    """

    happened: Happened
    record: storage.BatchRecord  # the batch's row as the step left it
    polled: bool = False  # the provider was asked how it stands
    ingested: IngestOutcome | None = None
    problem: BatchProblem | None = None
    why: str = ""

    @property
    def following(self) -> bool:
        """Whether a loop that follows the batch polls it again."""
        return self.happened in ("open", "errored", "submitted")

    @property
    def released(self) -> bool:
        """Whether the step may have left prompts of the batch's job to send again (in a batch or real-time)."""
        return self.happened in ("ingested", "submitted", "lost")


async def advance_batch(
    *,
    run: JobRun,
    record: storage.BatchRecord,
    ingest: Ingest,
    finish: FinishSubmission | None = None,
    stale_before: datetime | None = None,
    grace: timedelta | None = None,
    leave_after_errors: int | None = None,
    now: datetime | None = None,
) -> BatchStep:
    """Move ``record`` one state forward and say what happened (see ``BatchStep``).

    A half-submitted batch is finished (``finish``) only once unchanged since ``stale_before``: a younger one may
    belong to a run submitting it now, and without ``finish`` it is left. An active one is polled, and ingested
    (``ingest``) once the provider is done with it; with ``grace``, one still active that long past its expiry is
    left. An error is kept on the batch (``batch_trouble``: a confirmed 404 loses it) and the batch left after
    ``leave_after_errors`` in a row; a step that works clears the errors before it.
    """
    step, polled = "poll", False
    try:
        if record.status in HALF_SUBMITTED_BATCH_STATUSES:
            if finish is None or stale_before is None or record.updated_at > stale_before:
                return BatchStep("left", record, why=f"still {record.status}: the run submitting it finishes it")
            step = "finish its submission"
            record = await finish(run=run, batch_id=record.id)
            if record.status not in TERMINAL_BATCH_STATUSES:
                return await _cleared(run, BatchStep("submitted", record))
        elif record.status in ACTIVE_BATCH_STATUSES:
            record = await poll_batch(sessions=run.sessions, clients=run.clients, record=record)
            polled = True
        if record.status in TERMINAL_BATCH_STATUSES:
            step = "ingest"
            ingested = await ingest(run=run, batch_id=record.id)
            return await _cleared(run, BatchStep("ingested", record, polled=polled, ingested=ingested))
    except Exception as exc:  # noqa: BLE001 - kept on the batch; the caller goes on with the others
        problem = await batch_trouble(run=run, record=record, step=step, error=exc, now=now)
        record = await storage.require_batch(run.sessions, batch_id=record.id)
        if problem.lost:
            return BatchStep("lost", record, polled=polled, problem=problem)
        if leave_after_errors is not None and problem.errors_in_a_row >= leave_after_errors:
            return BatchStep("left", record, polled=polled, problem=problem,
                             why=f"{problem.errors_in_a_row} errors in a row")
        return BatchStep("errored", record, polled=polled, problem=problem)
    if record.status not in ACTIVE_BATCH_STATUSES:
        left = BatchStep("left", record, polled=polled, why=f"{record.status}: closed or half-submitted elsewhere")
    elif grace is not None and record.expires_at is not None and (now or datetime.now(UTC)) > record.expires_at + grace:
        left = BatchStep("left", record, polled=polled, why=f"still {record.status} {grace} after its expiry")
    else:
        return await _cleared(run, BatchStep("open", record, polled=polled))
    return await _cleared(run, left)


async def _cleared(run: JobRun, step: BatchStep) -> BatchStep:
    """``step`` with the batch's errors before it cleared: the step worked."""
    if not step.record.error_count:
        return step
    await storage.clear_batch_error(run.sessions, batch_id=step.record.id)
    record = await storage.require_batch(run.sessions, batch_id=step.record.id)
    return BatchStep(step.happened, record, polled=step.polled, ingested=step.ingested, why=step.why)
