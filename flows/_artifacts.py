"""What a run shows in the Prefect UI beyond its logs: progress artifacts while it works, a table and a
report when it ends. All best effort: the Prefect API refusing an artifact never stops a run whose
requests are paid for."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
import logging
import re
import time
import unicodedata
from typing import Any

from prefect.artifacts import (
    acreate_markdown_artifact,
    acreate_progress_artifact,
    acreate_table_artifact,
    aupdate_progress_artifact,
)

from llm_dispatch import storage
from llm_dispatch.jobs import DispatchSummary, SweepSummary
from llm_dispatch.core import DispatchOutcome, ROUTES, RouteTotals, counted, from_pico, money, unfinished

Logger = logging.Logger | logging.LoggerAdapter  # type: ignore[type-arg]

# Characters of a job's name kept in an artifact key (Prefect allows 100 in all).
MAX_KEY_NAME = 64


class ProgressBoard:
    """The real-time half's progress artifact, created alongside the first requests and updated as chunks end."""

    # Each update is a write to the Prefect API; on a SQLite-backed server writes contend.
    MIN_INTERVAL = 2.0

    def __init__(self, *, job: str, logger: Logger) -> None:
        self._job, self._logger = job, logger
        self._prompts = self._chunks = self._finished = 0
        self._artifact: asyncio.Task[Any] | None = None
        self._last = time.monotonic()

    def open(self) -> None:
        """Create the artifact in the background, once there is something to show."""
        if self._artifact is None and self._prompts:
            self._artifact = asyncio.create_task(self._create())

    async def _create(self) -> Any:
        try:
            return await acreate_progress_artifact(
                progress=0.0, description=f"job {self._job}: real-time, {counted(self._prompts, 'prompt')}")
        except Exception as exc:  # noqa: BLE001 - a progress display must not stop the run
            self._logger.warning("No progress artifact for job %s: %s", self._job, exc)
            return None

    def retotal(self, *, prompts: int, chunks: int) -> None:
        """The run's totals as far as known (they settle once every slice of a new job is planned)."""
        self._prompts, self._chunks = prompts, chunks

    async def update(self, outcome: DispatchOutcome) -> None:
        """A chunk ended: show it, at most every ``MIN_INTERVAL`` seconds."""
        self._finished += 1
        if time.monotonic() - self._last >= self.MIN_INTERVAL:
            await self._show(outcome)

    async def close(self, outcome: DispatchOutcome) -> None:
        """Every chunk ended: show the final counts."""
        await self._show(outcome)

    async def _show(self, outcome: DispatchOutcome) -> None:
        artifact = await self._artifact if self._artifact is not None else None
        if artifact is None:
            return
        self._last = time.monotonic()
        # Every prompt with its final outcome is done: a refusal and an answer still invalid after its re-asks too.
        done = outcome.succeeded + outcome.refused + outcome.invalid + outcome.failed
        told = ", ".join(f"{n} {word}" for n, word in ((outcome.refused, "refused"), (outcome.invalid, "invalid"))
                         if n)
        try:
            await aupdate_progress_artifact(
                artifact_id=artifact, progress=min(100.0, 100.0 * done / max(1, self._prompts)),
                description=(f"real-time: {done} of {self._prompts} prompts done ({outcome.succeeded} succeeded"
                             f"{', ' + told if told else ''}, {outcome.failed} failed); {self._finished} of "
                             f"{self._chunks} chunks"),
            )
        except Exception as exc:  # noqa: BLE001 - a progress display must not stop the run
            self._logger.warning("Progress artifact of job %s not updated: %s", self._job, exc)


class BatchBoard:
    """One progress artifact for every batch a run follows, updated once a round at most every ``MIN_INTERVAL``."""

    MIN_INTERVAL = 5.0

    def __init__(self, *, total: int, logger: Logger) -> None:
        self._total, self._logger = total, logger
        self._artifact: Any = None
        self._last = 0.0

    async def show(self, *, following: Iterable[storage.BatchRecord], done: int) -> None:
        records = list(following)
        if records and time.monotonic() - self._last < self.MIN_INTERVAL:
            return
        self._last = time.monotonic()
        lines = sum(r.request_total for r in records)
        answered = sum(r.request_completed + r.request_failed for r in records)
        progress = 100.0 * done / self._total if self._total else 100.0
        description = (f"{done} of {counted(self._total, 'batch', many='batches')} ingested; {len(records)} open, {answered} of their {lines} "
                       "requests answered at the provider")
        try:
            if self._artifact is None:
                self._artifact = await acreate_progress_artifact(progress=progress, description=description)
            else:
                await aupdate_progress_artifact(artifact_id=self._artifact, progress=progress,
                                                description=description)
        except Exception as exc:  # noqa: BLE001 - a progress display must not stop the run
            self._logger.warning("Batch progress artifact not shown: %s", exc)


async def publish_sweep(summary: SweepSummary, *, scope: str, logger: Logger) -> None:
    """A ``collect-batches`` sweep as a markdown artifact (key ``collect-batches``): its counts, then every batch
    with a problem (lost ones first) and every batch waiting out the wait after an earlier error."""
    lines = [
        f"# Sweep over {scope}", "",
        f"{summary.open} open batches: {summary.polled} polled, {len(summary.ingested)} ingested "
        f"({counted(sum(i.succeeded for i in summary.ingested), 'answer')}), {counted(summary.resubmitted, 'prompt')} "
        "resubmitted, "
        f"{summary.realtime} sent real-time.",
    ]
    if summary.problems:
        lines += ["", f"## Problems ({len(summary.problems)})", "", "| batch | job | step | what happened |",
                  "|---|---|---|---|"]
        for problem in sorted(summary.problems, key=lambda p: not p.lost):
            step = "lost" if problem.lost else problem.step
            lines.append(f"| {problem.batch_id if problem.batch_id is not None else '-'} | {problem.job_id[:8]} "
                         f"| {step} | {problem.line.replace('|', '/')} |")
    if summary.waiting:
        lines += ["", f"Waiting to retry after earlier errors (`llm-dispatch collect --retry-now` tries them now): "
                  f"batches {', '.join(map(str, summary.waiting))}."]
    try:
        await acreate_markdown_artifact(markdown="\n".join(lines) + "\n", key="collect-batches",
                                        description=f"collect-batches over {scope}: "
                                                    f"{counted(len(summary.problems), 'problem')}")
    except Exception as exc:  # noqa: BLE001 - the sweep's work is done and stored; the display is extra
        logger.warning("Sweep artifact not published: %s", exc)


def job_label(*, name: str, job_id: str) -> str:
    """A job as a person reads it: its name and the first characters of its id (``questions.jsonl (0eea949d)``)."""
    return f"{name} ({job_id[:8]})" if name else f"job {job_id[:8]}"


def artifact_key(name: str, *, job_id: str) -> str:
    """An artifact key after the job's name (Prefect's keys are lowercase letters, digits and dashes): runs of one
    job, or of one name, add versions to the same artifacts."""
    ascii_name = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode().lower()
    slug = re.sub(r"[^a-z0-9]+", "-", ascii_name).strip("-")[:MAX_KEY_NAME]
    return slug or job_id[:8]


async def publish_report(summary: DispatchSummary, *, logger: Logger) -> None:
    """A table (one row per route) and a markdown report on the flow run, keyed and titled by the job's name."""
    report = summary.report
    rows = []
    for route in ROUTES:
        statuses = report.routes.get(route, {})
        if not statuses and route not in ("realtime", "batch"):
            continue  # a lane no prompt took
        cost = report.cost.routes.get(route) or RouteTotals()
        estimate = report.estimate.routes.get(route) if report.estimate is not None else None
        rows.append({
            "route": route,
            "prompts": sum(statuses.values()),
            "succeeded": statuses.get("succeeded", 0),
            "refused": statuses.get("refused", 0),
            "invalid": statuses.get("invalid", 0),
            "failed": statuses.get("failed", 0),
            "unfinished": unfinished(statuses),
            "tokens in / out": f"{cost.prompt_tokens:,} / {cost.completion_tokens:,}",
            "cost": f"${money(cost.cost):.6f}",
            "estimate": f"${money(estimate.cost):.6f}" if estimate is not None else "-",
        })
    job = job_label(name=summary.job_name, job_id=report.job_id)
    key = f"dispatch-{artifact_key(summary.job_name, job_id=report.job_id)}"
    try:
        await acreate_table_artifact(table=rows, key=f"{key}-routes", description=f"{job}: per route")
        await acreate_markdown_artifact(markdown=report_markdown(summary), key=f"{key}-report",
                                        description=f"{job}: report")
    except Exception as exc:  # noqa: BLE001 - the job's work is done and stored; the display is extra
        logger.warning("Report artifacts of job %s not published: %s", job, exc)


def report_markdown(summary: DispatchSummary) -> str:
    report = summary.report
    counts, cost, stats = report.counts, report.cost, report.stats
    lines = [
        f"# {summary.job_name or 'Job'} (job `{report.job_id}`)",
        "",
        "| | |", "|---|---|",
        f"| prompts | {sum(counts.values())} |",
        f"| succeeded | {counts.get('succeeded', 0)} |",
        f"| refused by the model | {counts.get('refused', 0)} |",
        f"| truncated answers (cut at max_tokens or the window) | {stats.truncated} |",
        f"| answers with tool calls | {stats.tool_calls} |",
        f"| failed | {counts.get('failed', 0)} |",
        f"| unfinished | {report.unfinished} |",
        f"| latency p50 / p95 (real-time) | {_ms(stats.p50_latency_ms)} / {_ms(stats.p95_latency_ms)} |",
        f"| cost | ${money(cost.total):.6f}{'' if cost.complete else ' + unknown (no price for some models)'} |",
        f"| saved by the Batch API and discounted lanes | ${money(cost.savings):.6f} |",
    ]
    structured = report.structured
    if structured is not None:
        cost_of = structured.reask_cost
        lines += [f"| structured: valid at first answer | {structured.valid_first} |",
                  f"| structured: valid after re-asks | {structured.valid_after_reasks} |",
                  f"| structured: still invalid | {structured.still_invalid} |",
                  f"| structured: re-asks (cost) | {structured.reasks} "
                  f"({'unknown' if cost_of is None else f'${money(cost_of):.6f}'}) |"]
    planned = report.estimate.cache if report.estimate is not None else None
    if report.estimate is not None:
        lines.append(f"| estimate before sending | ${money(report.estimate.total):.6f} |")
        if planned is not None and planned.total and planned.enabled:
            lines.append(f"| estimate with the cache plan | ${money(report.estimate.planned_total):.6f} |")
    lines.append(f"| prices as of | {cost.prices_as_of} |")
    budget = summary.budget
    if budget is not None:
        period = "" if budget.per == "total" else f" ({budget.period})"
        lines.append(f"| budget {budget.label}{period}: limit / spent / reserved / left | ${money(budget.limit):.6f} / "
                     f"${money(budget.spent):.6f} / ${money(budget.reserved):.6f} / ${money(budget.left):.6f} |")
        if budget.stopped:
            lines.append(f"| left pending by the budget | {budget.over_budget} |")
    if cost.endpoints:
        lines += ["", "## Cost per endpoint and lane", "", "| endpoint | lane | requests | tokens in / out | cost |",
                  "|---|---|---|---|---|"]
        lines += [f"| {endpoint} | {route} | {paid.prompts} | {paid.prompt_tokens} / {paid.completion_tokens} "
                  f"| ${money(paid.cost):.6f}{' + unknown' if paid.unpriced else ''} |"
                  for endpoint, by_route in cost.endpoints.items() for route, paid in by_route.items()]
    if planned is not None and planned.total:
        lines += ["", f"## Cache plan before sending ({counted(planned.total, 'shared prefix', many='shared prefixes')}"
                  f"{'' if planned.enabled else ', the plan off'})", "",
                  "| lane | group | model | prompts | prefix tokens | plan | prefix cost planned | uncached |",
                  "|---|---|---|---|---|---|---|---|"]
        lines += [f"| {row.lane} | {row.key} | {row.model} | {row.prompts} | {row.prefix_tokens} "
                  f"| {row.action}: {row.reason.replace('|', '/')} | {_pico(row.planned_cost_pico_usd)} "
                  f"| {_pico(row.uncached_cost_pico_usd)} |" for row in planned.groups]
        if planned.total > len(planned.groups):
            lines.append(f"\nand {planned.total - len(planned.groups):,} more")
        lines.append(f"\nAll groups: prefix cost ${money(planned.planned_cost):.6f} planned vs "
                     f"${money(planned.uncached_cost):.6f} uncached.")
    if report.cache:
        lines += ["", "## Prompt caching per shared prefix", "",
                  "| group | model | prompts | prefix tokens (estimated) | cached tokens | hit rate | paid | uncached "
                  "| saved |", "|---|---|---|---|---|---|---|---|---|"]
        lines += [f"| {group.key} | {group.model} | {group.prompts} | {group.prefix_tokens} | {group.cached_tokens} "
                  f"| {group.hit_rate:.1%} | ${money(group.cost):.6f} | ${money(group.uncached_cost):.6f} "
                  f"| ${money(group.saved):.6f}{' + unknown' if group.unpriced else ''} |" for group in report.cache]
    if summary.stopped:
        lines += ["", "## Stopped", ""] + [f"- {found['message']}" for found in summary.stopped]
        lines.append(f"- {counted(summary.left, 'prompt')} left pending: fix that, then run the job again.")
    if report.failed_by_class:
        told = stats.failure_messages
        lines += ["", "## Failures", "", "| class | prompts | what it said |", "|---|---|---|"]
        lines += [f"| {name} | {n} | {told.get(name, '').replace('|', '/')} |"
                  for name, n in sorted(report.failed_by_class.items())]
    return "\n".join(lines) + "\n"


def _pico(value: int | None) -> str:
    return "unknown" if value is None else f"${money(from_pico(value)):.6f}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} ms"
