"""What a run did, as typed results between the layers; ``as_dict()`` gives the JSON a flow returns,
the CLI's ``--json`` prints and the artifacts show."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from llm_dispatch import storage
from llm_dispatch.core import unfinished

from ._collect import IngestOutcome
from ._costs import JobCost, actual_cost
from ._submit import SubmitOutcome


@dataclass(frozen=True, slots=True)
class RealtimeSummary:
    """One real-time run over a job: what it sent, how the job stands after it, and where the time went."""

    job_id: str
    resumed: bool
    prompts: int
    sent_prompts: int
    reused: int
    counts: dict[str, int]
    failed_by_class: dict[str, int]
    stats: storage.ResultStats
    wall_s: float
    send_s: float
    phases_s: dict[str, float]
    # Providers or models whose requests the run stopped (``core.RunStop``): scope, error class, how many
    # identical answers, and the line that says what to fix; and how many prompts were left pending for it.
    stopped: list[dict[str, Any]] = field(default_factory=list)
    left: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id, "resumed": self.resumed, "prompts": self.prompts,
            "stopped": [dict(found) for found in self.stopped], "left": self.left,
            "sent_prompts": self.sent_prompts, "reused": self.reused, "counts": dict(self.counts),
            "failed_by_class": dict(self.failed_by_class), "stats": self.stats.as_dict(),
            "wall_s": round(self.wall_s, 3), "send_s": round(self.send_s, 3),
            "phases_s": {name: round(seconds, 3) for name, seconds in self.phases_s.items()},
        }


@dataclass(frozen=True, slots=True)
class ShardRuns:
    """The real-time half sent as deployment runs, one per shard: their flow run ids."""

    flow_run_ids: list[str]

    def as_dict(self) -> dict[str, Any]:
        return {"shards": list(self.flow_run_ids)}


@dataclass(slots=True)
class BatchHalfSummary:
    """The Batch API half of a ``dispatch`` run: submissions, ingests, fallbacks to real-time."""

    submitted: SubmitOutcome = field(default_factory=SubmitOutcome)
    # Rounds of waiting for open batches (each may resubmit what the last left unanswered).
    rounds: int = 0
    ingested: list[IngestOutcome] = field(default_factory=list)
    realtime_fallback: int = 0
    wall_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "submitted_batches": len(self.submitted.batch_ids), "submitted_prompts": self.submitted.prompts,
            "reused": self.submitted.reused, "rounds": self.rounds,
            "ingested": [outcome.as_dict() for outcome in self.ingested],
            "realtime_fallback": self.realtime_fallback, "wall_s": round(self.wall_s, 3),
        }


@dataclass(slots=True)
class SweepSummary:
    """One ``collect-batches`` sweep over open batches."""

    open: int = 0
    polled: int = 0
    ingested: list[IngestOutcome] = field(default_factory=list)
    resubmitted: int = 0
    realtime: int = 0
    # Half-submitted batches left alone: the run that owns them may be submitting them right now.
    skipped_recent: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"open": self.open, "polled": self.polled, "ingested": [i.as_dict() for i in self.ingested],
                "resubmitted": self.resubmitted, "realtime": self.realtime, "skipped_recent": self.skipped_recent}


@dataclass(frozen=True, slots=True)
class CancelSummary:
    """A ``cancel-batches`` run: the batches asked to stop, and the ingests of those that did in time."""

    job_id: str
    cancelled: list[int]
    ingested: list[IngestOutcome]

    def as_dict(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "cancelled": list(self.cancelled),
                "ingested": [outcome.as_dict() for outcome in self.ingested]}


@dataclass(frozen=True, slots=True)
class JobReport:
    """How a job stands: prompts per status and route, failures, latency, tokens, cost and savings."""

    job_id: str
    counts: dict[str, int]
    routes: dict[str, dict[str, int]]
    stats: storage.ResultStats
    cost: JobCost
    estimate: JobCost | None = None

    @property
    def unfinished(self) -> int:
        return unfinished(self.counts)

    def as_dict(self) -> dict[str, Any]:
        report: dict[str, Any] = {
            "job_id": self.job_id, "counts": dict(self.counts), "routes": self.routes,
            "unfinished": self.unfinished, "failed_by_class": dict(self.stats.failed_by_class),
            "stats": self.stats.as_dict(), "cost": self.cost.as_dict(),
        }
        if self.estimate is not None:
            report["estimate"] = self.estimate.as_dict()
        return report


@dataclass(frozen=True, slots=True)
class DispatchSummary:
    """A ``dispatch`` run: the job's report, and what each half did."""

    report: JobReport
    resumed: bool
    prompts: int
    wait: bool
    realtime: RealtimeSummary | ShardRuns
    batch: BatchHalfSummary
    wall_s: float
    job_name: str = ""
    # A resumed job: its prompts with an outcome when the run found it (answered before this run).
    answered_before: int = 0
    # The finished job of the same input that this new one sends again (dedupe off), if any.
    started_over_from: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {**self.report.as_dict(), "job_name": self.job_name, "resumed": self.resumed,
                "answered_before": self.answered_before, "started_over_from": self.started_over_from,
                "prompts": self.prompts, "wait": self.wait, "wall_s": round(self.wall_s, 3),
                "realtime": self.realtime.as_dict(), "batch": self.batch.as_dict()}


async def job_report(
    sessions: storage.Sessions, *, job_id: str, estimate: JobCost | None = None, provider_of: Callable[[str], str] | None = None
) -> JobReport:
    """The job as it stands in the database, with the costs stored with its answers (per provider by ``provider_of``)."""
    counts = await storage.job_counts(sessions, job_id=job_id)
    return JobReport(
        job_id=job_id, counts=counts, routes=await storage.route_counts(sessions, job_id=job_id),
        stats=await storage.result_stats(sessions, job_id=job_id),
        cost=await actual_cost(sessions=sessions, job_id=job_id, provider_of=provider_of), estimate=estimate,
    )
