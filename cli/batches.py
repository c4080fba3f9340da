"""``llm-dispatch collect``, ``cancel`` and ``abandon``: the commands that run the batch flows, and the one
``error:`` line each batch's problem gets."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from llm_dispatch.core import counted, to_json

from ._common import EXIT_PROVIDER, DatabaseUrl, _fail, _settings, err, out
from ._prefect import _prefect_settings

if TYPE_CHECKING:
    from llm_dispatch.jobs import BatchProblem

# A batch that failed this many sweeps in a row: the CLI says how to give it up.
ABANDON_HINT_AFTER = 3


ProvidersFile = Annotated[Optional[Path], typer.Option(
    "--providers-file", help="the providers file that declares the job's providers (LLM_DISPATCH_PROVIDERS_FILE)")]


def _use_providers_file(path: Path | None) -> None:
    """The providers file for the flow this command runs in its process (its Settings read the environment)."""
    if path is None:
        return
    if not path.is_file():
        raise _fail(f"--providers-file: no such file: {path}")
    os.environ["LLM_DISPATCH_PROVIDERS_FILE"] = str(path.resolve())


def _flow_call(coroutine: Any) -> Any:
    """Run a flow from a command, with the CLI's Prefect settings."""
    with _prefect_settings():
        return asyncio.run(coroutine)


def collect(
    job: Annotated[Optional[str], typer.Argument(help="only this job's batches (default: every open batch)")] = None,
    database_url: DatabaseUrl = None,
    stale_after: Annotated[float, typer.Option(help="seconds before a half-submitted batch counts as abandoned")] = 600.0,
    retry_now: Annotated[bool, typer.Option(
        "--retry-now", help="try batches with a recent error now, not after their wait")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the sweep's summary as JSON")] = False,
    providers_file: ProvidersFile = None,
) -> None:
    """One sweep over open batches: poll each, ingest what finished, resubmit or send real-time the rest.

    Each batch on its own: one that fails (or that the provider lost) is named, and the others are collected."""
    from llm_dispatch.flows.batch import collect_batches

    _use_providers_file(providers_file)
    url = _stored_url(database_url)
    summary = _flow_result(collect_batches(database_url=url, job_id=job,
                                           stale_after=stale_after, retry_now=retry_now, return_state=True))
    if as_json:
        out.print_json(json.dumps(to_json(summary), default=str))
    else:
        ingested = summary.ingested
        waiting = f", {len(summary.waiting)} waiting to retry after errors" if summary.waiting else ""
        out.print(
            f"{counted(summary.open, 'open batch', many='open batches')}: polled {summary.polled}, ingested "
            f"{len(ingested)} ({counted(sum(i.succeeded for i in ingested), 'answer')}, "
            f"{sum(i.failed for i in ingested)} failed), resubmitted {counted(summary.resubmitted, 'prompt')}, sent "
            f"{summary.realtime} real-time{waiting}",
            highlight=False,
        )
        _print_problems(summary.problems)
    _exit_on_problems(summary.problems)


def cancel(
    job: Annotated[str, typer.Argument(help="the job whose open batches to cancel")],
    database_url: DatabaseUrl = None,
    wait_seconds: Annotated[float, typer.Option(help="how long to wait for the provider to stop them")] = 120.0,
    providers_file: ProvidersFile = None,
) -> None:
    """Cancel a job's open batches; what they answered before stopping is still stored (it is billed)."""
    from llm_dispatch.flows.batch import cancel_job_batches

    _use_providers_file(providers_file)
    url = _stored_url(database_url)
    summary = _flow_result(cancel_job_batches(job_id=job, database_url=url,
                                              wait_seconds=wait_seconds, return_state=True))
    kept = sum(i.succeeded for i in summary.ingested)
    out.print(f"cancelled {counted(len(summary.cancelled), 'batch', many='batches')} of job {job}; kept "
              f"{counted(kept, 'answer')} they gave; "
              f"{len(summary.cancelled) - len(summary.ingested)} still stopping (`llm-dispatch collect` finishes them)",
              highlight=False)
    _print_problems(summary.problems)
    _exit_on_problems(summary.problems)


def abandon(
    batch: Annotated[int, typer.Argument(help="our batch id (`llm-dispatch status JOB` lists them)")],
    database_url: DatabaseUrl = None,
    force: Annotated[bool, typer.Option(
        "--force", help="give it up even while the provider still holds it (what it answers is billed, not kept)")] = False,
    providers_file: ProvidersFile = None,
) -> None:
    """Give up a batch the provider cannot answer for: closed as lost, its unanswered prompts pending again.

    A batch the provider still reports is refused (sending its prompts again would pay twice) unless --force."""
    from llm_dispatch.flows.batch import abandon_batch_flow

    _use_providers_file(providers_file)
    url = _stored_url(database_url)
    outcome = _flow_call(abandon_batch_flow(batch_id=batch, database_url=url,
                                            force=force))
    job = outcome.job_id[:8]
    cancelled = (f"; {outcome.cancelled} failed as cancelled (the job's batches were cancelled: "
                 "`--retry-failed all` sends them)" if outcome.cancelled else "")
    out.print(f"batch {batch} abandoned ({outcome.provider_said}); {counted(outcome.released, 'prompt')} of job {job} "
              f"{'is' if outcome.released == 1 else 'are'} pending again: `llm-dispatch run --resume {job}` sends them{cancelled}", highlight=False)


def _stored_url(database_url: str | None) -> Any:
    """The URL of a database that must exist already, as a flow parameter (a SecretStr)."""
    from pydantic import SecretStr

    from .reports import require_database

    settings = _settings(database_url=database_url)
    require_database(settings)
    return SecretStr(settings.database_url)


def _flow_result(coroutine: Any) -> Any:
    """Run a flow called with ``return_state=True`` and return its result, whether it ended Completed or Failed
    (a run whose problems are part of its result: the command prints them); an error of ours still raises."""
    from llm_dispatch.tasks import outcome_of

    return outcome_of(_flow_call(coroutine).result(raise_on_failure=False))


def _exit_on_problems(problems: list[BatchProblem]) -> None:
    """A sweep or cancel that met a problem with any batch exits with the provider's code (the rest was done)."""
    if problems:
        raise typer.Exit(EXIT_PROVIDER)


def _print_problems(problems: list[BatchProblem]) -> None:
    """One ``error:`` line per problem; batches that met the same error (a provider out of reach) share one."""
    groups: dict[tuple[str, str, bool], list[BatchProblem]] = {}
    for problem in problems:
        groups.setdefault((problem.step, problem.error, problem.lost), []).append(problem)
    for (step, error, lost), group in groups.items():
        first = group[0]
        if len(group) == 1:
            line = first.line
        else:
            ids = ", ".join(str(p.batch_id) for p in group)
            line = f"{len(group)} batches ({ids}) {'lost' if lost else f'{step} failed'}: {error}"
        stuck = not lost and first.batch_id is not None and first.errors_in_a_row >= ABANDON_HINT_AFTER
        hint = "; `llm-dispatch abandon BATCH` gives one up" if stuck else ""
        err.print(f"[bold red]error:[/] {line}{hint}", highlight=False, soft_wrap=True)
