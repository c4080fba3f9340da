"""What a run did, as typed results between the layers; ``core.to_json`` gives the JSON the CLI's ``--json``
prints and the artifacts show."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from llm_dispatch import storage
from llm_dispatch.core import PriceTable, counted, dollars, json_field, unfinished

from ._budget import BudgetStanding
from ._batch_trouble import BatchProblem
from ._cache_report import CacheGroupReport, cache_report
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
    wall_s: float = json_field(digits=3)
    send_s: float = json_field(digits=3)
    phases_s: dict[str, float] = json_field(digits=3)
    # Providers or models whose requests the run stopped (``core.RunStop``): scope, error class, how many
    # identical answers, and the line that says what to fix; and how many prompts were left pending for it.
    stopped: list[dict[str, Any]] = field(default_factory=list)
    left: int = 0
    # The budget the run held, as the run left it (``over_budget``: prompts it left pending for it).
    budget: BudgetStanding | None = None


@dataclass(frozen=True, slots=True)
class ShardRuns:
    """The real-time half sent as deployment runs, one per shard: their flow run ids."""

    flow_run_ids: list[str] = json_field(name="shards")
    # Of them, the runs that stopped because the next request's worst case did not fit the budget.
    budget_reached: int = 0


@dataclass(slots=True)
class BatchHalfSummary:
    """The Batch API half of a ``dispatch`` run: submissions, ingests, fallbacks to real-time."""

    json_properties: ClassVar = ("submitted_batches", "submitted_prompts", "reused")

    submitted: SubmitOutcome = json_field(skip=True, default_factory=SubmitOutcome)
    # Rounds of waiting for open batches (each may resubmit what the last left unanswered).
    rounds: int = 0
    ingested: list[IngestOutcome] = field(default_factory=list)
    realtime_fallback: int = 0
    # Whether sending those real-time stopped on the job's budget (the rest left pending).
    budget_reached: bool = False
    wall_s: float = json_field(digits=3, default=0.0)

    @property
    def submitted_batches(self) -> int:
        return len(self.submitted.batch_ids)

    @property
    def submitted_prompts(self) -> int:
        return self.submitted.prompts

    @property
    def reused(self) -> int:
        return self.submitted.reused


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
    # What went wrong, a batch at a time (each kept on its batch; the others went on), and the batches left
    # alone because an earlier error's wait is not over.
    problems: list[BatchProblem] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)

    @property
    def lost(self) -> list[BatchProblem]:
        return [problem for problem in self.problems if problem.lost]


@dataclass(frozen=True, slots=True)
class CancelSummary:
    """A ``cancel-batches`` run: the batches asked to stop, the ingests of those that did in time, and the problems."""

    job_id: str
    cancelled: list[int]
    ingested: list[IngestOutcome]
    # Batches the provider could not be asked (each kept on its batch; the others were cancelled).
    problems: list[BatchProblem] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class JobReport:
    """How a job stands: prompts per status and route, failures, latency, tokens, cost and savings."""

    json_properties: ClassVar = ("unfinished", "failed_by_class")

    job_id: str
    counts: dict[str, int]
    routes: dict[str, dict[str, int]]
    stats: storage.ResultStats
    cost: JobCost
    estimate: JobCost | None = json_field(omit_none=True, default=None)
    # Answers checked against their schemas (valid at first, after re-asks, still invalid, re-asks' cost); None
    # when no prompt has a schema.
    structured: storage.StructuredStats | None = json_field(omit_none=True, default=None)
    # Per group of prompts sharing a prefix, what caching it did (``cache_report``); empty: no such group answered.
    cache: list[CacheGroupReport] = field(default_factory=list)

    @property
    def unfinished(self) -> int:
        return unfinished(self.counts)

    @property
    def failed_by_class(self) -> dict[str, int]:
        return self.stats.failed_by_class


# Keyword-only: ``report`` and ``wall_s`` are made by ``json_field``, whose fields a type checker takes as defaulted.
@dataclass(frozen=True, slots=True, kw_only=True)
class DispatchSummary:
    """A ``dispatch`` run: the job's report, and what each half did."""

    report: JobReport = json_field(inline=True)
    resumed: bool
    prompts: int
    wait: bool
    realtime: RealtimeSummary | ShardRuns
    batch: BatchHalfSummary
    wall_s: float = json_field(digits=3)
    job_name: str = ""
    # A resumed job: its prompts with an outcome when the run found it (answered before this run).
    answered_before: int = 0
    # The finished job of the same input that this new one sends again (dedupe off), if any.
    started_over_from: str | None = None
    # The budget the run held, as the run left it (None: no budget).
    budget: BudgetStanding | None = None

    def __repr__(self) -> str:
        """A short summary (``rows.summary`` in a notebook): the job, its prompts by outcome, cost and estimate;
        ``core.to_json`` of it gives everything."""
        report = self.report
        counts = report.counts
        outcomes = ", ".join(f"{counts.get(status, 0):,} {status}" for status in ("succeeded", "refused", "failed"))
        estimate = report.estimate
        estimated = "" if estimate is None else (
            f", estimate {dollars(estimate.total, unpriced=not estimate.complete)}"
            + (" (this run)" if self.resumed else ""))
        return (f"<DispatchSummary job {report.job_id[:8]} ({self.job_name}){' resumed' if self.resumed else ''}: "
                f"{counted(sum(counts.values()), 'prompt')}, {outcomes}, {report.unfinished:,} unfinished; "
                f"cost {dollars(report.cost.total, unpriced=not report.cost.complete)}{estimated}; "
                f"{self.wall_s:.1f} s>")

    __str__ = __repr__

    @property
    def sent_prompts(self) -> int:
        """Prompts this run sent: real-time (in this process) and to the Batch API."""
        realtime = self.realtime.sent_prompts if isinstance(self.realtime, RealtimeSummary) else 0
        return realtime + self.batch.submitted_prompts

    @property
    def reused(self) -> int:
        """Prompts this run answered from stored identical requests."""
        realtime = self.realtime.reused if isinstance(self.realtime, RealtimeSummary) else 0
        return realtime + self.batch.reused

    @property
    def stopped(self) -> list[dict[str, Any]]:
        """What stopped the real-time half's requests (``RealtimeSummary.stopped``); empty when nothing did."""
        return self.realtime.stopped if isinstance(self.realtime, RealtimeSummary) else []

    @property
    def left(self) -> int:
        """Prompts left pending by what stopped the run."""
        return self.realtime.left if isinstance(self.realtime, RealtimeSummary) else 0


@dataclass(frozen=True, slots=True)
class DirectorySummary:
    """A ``dispatch-directory`` run: the files dispatched, and those skipped as finished already."""

    dispatched: list[str]
    skipped: list[str]


# The largest job whose run report reads each shared prefix's caching back (about a second per 5,000 answers).
CACHE_REPORT_MAX_PROMPTS = 50_000


async def _no_groups() -> list[CacheGroupReport]:
    return []


async def job_report(
    sessions: storage.Sessions, *, job_id: str, estimate: JobCost | None = None, provider_of: Callable[[str], str] | None = None,
    prices: PriceTable | None = None, cache_rules_of: Callable[[str], str] | None = None,
) -> JobReport:
    """The job as it stands in the database, with the costs stored with its answers (per provider by ``provider_of``)
    and, given ``cache_rules_of`` (``ProviderTable.cache_rules_of``), its caching per shared prefix (what it saved at
    ``prices``): that reads every stored request again."""
    # Independent reads, each in a session (a connection) of its own: they run at once.
    counts, routes, stats, cost, structured, cache = await asyncio.gather(
        storage.job_counts(sessions, job_id=job_id),
        storage.route_counts(sessions, job_id=job_id),
        storage.result_stats(sessions, job_id=job_id),
        actual_cost(sessions=sessions, job_id=job_id, provider_of=provider_of),
        storage.structured_stats(sessions, job_id=job_id),
        cache_report(sessions, job_id=job_id, prices=prices, provider_of=cache_rules_of) if cache_rules_of is not None
        else _no_groups(),
    )
    return JobReport(job_id=job_id, counts=counts, routes=routes, stats=stats, cost=cost, estimate=estimate,
                     structured=structured, cache=cache)
