"""The ``llm-dispatch`` command: ad-hoc runs, batch collection and cancelling, reports, the simulator."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import click
import typer
from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn, TimeElapsedColumn
from typer.core import TyperGroup

from llm_dispatch.core import (
    RETRY_FAILED,
    APIError,
    LLMDispatchError,
    RetryFailed,
    Settings,
    money,
    to_json,
)

if TYPE_CHECKING:
    # The send path's (it loads the HTTP stack): imported by the commands that send, not by the reports.
    from llm_dispatch.core import Progress
    from llm_dispatch.jobs import BatchProblem, BudgetStanding, DispatchSummary

# Options several commands take alike.
DatabaseUrl = Annotated[Optional[str], typer.Option(help="SQLAlchemy URL (default: ./llm_dispatch.db)")]
AsJson = Annotated[bool, typer.Option("--json", help="print as JSON")]
NewestJob = Annotated[Optional[str], typer.Argument(help="a job id (default: the newest job)")]

err = Console(stderr=True)
# Piped or captured output gets room for the whole table, not 80 columns.
out = Console() if sys.stdout.isatty() else Console(width=160)

# Exit codes (README, "Exit codes"); a signal that stops a run exits 128 + its number.
EXIT_FAILED_PROMPTS = 1  # the run ended with prompts that failed
EXIT_INPUT = 2  # bad input, settings or database, or a refused --max-cost: nothing was sent
# A batch that failed this many sweeps in a row: the CLI says how to give it up.
ABANDON_HINT_AFTER = 3
EXIT_PROVIDER = 3  # a provider call failed after its retries (network, key, refusal); what came back is stored
EXIT_BUDGET = 4  # the budget was reached: what was sent is stored, the rest is pending
EPHEMERAL_STARTUP_TIMEOUT = 120
# With --simulate the simulator's batches take seconds, not hours; poll them as often.
SIM_BATCH_SECONDS = 3.0
SIM_POLL_SECONDS = 0.5

EXIT_CODES = ("Exit codes: 0 done; 1 some prompts failed; 2 bad input, settings or database, or --max-cost refused "
              "(nothing sent); 3 a provider call failed after its retries (what came back is stored: run again "
              "later); 4 the budget was reached (the rest is pending: run again with a higher --budget); 128+N "
              "stopped by signal N.")


def exit_code(error: LLMDispatchError) -> int:
    """The exit code of a command that stopped on ``error``."""
    return EXIT_PROVIDER if isinstance(error, APIError) else EXIT_INPUT


def expected_error(exc: BaseException) -> LLMDispatchError | None:
    """``exc`` when it is one of ours; for a group of errors (two halves of a run failing together), its first
    when every one is ours; else None (a bug: its traceback is worth showing)."""
    if isinstance(exc, LLMDispatchError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        leaves = [expected_error(inner) for inner in exc.exceptions]
        if leaves and all(leaf is not None for leaf in leaves):
            return leaves[0]
    return None


def _debug() -> bool:
    """Whether ``--debug`` was given (an option of the command group, read from the running command's context)."""
    context = click.get_current_context(silent=True)
    return bool(context is not None and context.find_root().params.get("debug"))


class _Commands(TyperGroup):
    """The command group: any error of llm-dispatch's tree becomes one line and its exit code (the traceback with
    ``--debug``); an error outside it is a bug, shown as Python shows it."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (LLMDispatchError, BaseExceptionGroup) as exc:
            error = expected_error(exc)
            if error is None or ctx.params.get("debug"):
                raise
            raise _fail(str(error), code=exit_code(error)) from None


app = typer.Typer(cls=_Commands, add_completion=False, no_args_is_help=True, epilog=EXIT_CODES,
                  # Locals may hold a database URL's password; a traceback never shows them.
                  pretty_exceptions_show_locals=False,
                  help="Send many prompts to LLM APIs through Prefect flows.")


@app.callback()
def _options(
    debug: Annotated[bool, typer.Option(
        "--debug", help="on an error, show its traceback and Prefect's error logs instead of one line")] = False,
) -> None:
    # Read where it matters, from the command's context (``_debug``).
    pass


def main() -> None:
    app()


def _fail(message: str, *, code: int = EXIT_INPUT) -> typer.Exit:
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


def _settings(**overrides: Any) -> Settings:
    """The command's settings; a bad one (a database URL that cannot work included) is one line and exit 2."""
    from llm_dispatch.storage import check_database_url

    try:
        settings = Settings(**{key: value for key, value in overrides.items() if value is not None})
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        raise _fail(f"setting {field}: {first['msg']} (env LLM_DISPATCH_{field.upper()})") from None
    check_database_url(settings.database_url)
    return settings


@app.command()
def run(
    file: Annotated[Optional[Path], typer.Argument(help="a .jsonl or .csv file of prompts")] = None,
    resume: Annotated[Optional[str], typer.Option(
        "--resume", help="the job to resume: its id (or the id's first characters) or its name; no FILE needed")] = None,
    new_job: Annotated[bool, typer.Option(
        "--new-job", help="start a new job even if FILE was run before (default: resume the job FILE already is)")] = False,
    job_name: Annotated[Optional[str], typer.Option(
        "--job-name", help="name the job; a run with the same name and FILE resumes it, another name starts a new one")] = None,
    simulate: Annotated[bool, typer.Option("--simulate", help="send to the bundled simulator: no key, no network")] = False,
    model: Annotated[Optional[str], typer.Option(help="default model for prompts that name none")] = None,
    endpoint: Annotated[Optional[str], typer.Option(
        help="endpoint for prompts that name none: chat|responses|embeddings (default chat)")] = None,
    concurrency: Annotated[Optional[int], typer.Option(help="requests in flight per run")] = None,
    chunk_size: Annotated[Optional[int], typer.Option(help="prompts per Prefect task")] = None,
    dedupe: Annotated[bool, typer.Option("--dedupe/--no-dedupe", help="reuse stored answers to identical requests")] = True,
    retry_failed: Annotated[str, typer.Option(help="on resume, resend failed prompts: retryable|all|none")] = "retryable",
    retry_refused: Annotated[bool, typer.Option(
        "--retry-refused", help="on resume, ask the prompts the model refused again (each is paid again)")] = False,
    route: Annotated[Optional[str], typer.Option(
        help="rule for prompts with no urgency or deadline: length|all-realtime|all-batch (default length)")] = None,
    wait: Annotated[bool, typer.Option(
        "--wait/--no-wait", help="follow batches to the end here, or submit them and leave them to `collect`")] = True,
    max_cost: Annotated[Optional[float], typer.Option(help="refuse the run if its estimate is above this many dollars")] = None,
    fail_above: Annotated[float, typer.Option(
        "--fail-above", min=0.0, max=1.0,
        help="share of the job's prompts (0-1) that may fail with the run still Completed in Prefect and exit 0; "
             "default 0: any failed prompt makes the run Failed (exit 1)")] = 0.0,
    budget: Annotated[Optional[float], typer.Option(
        help="the most the job may spend, in dollars, over all its runs: each request's worst case is reserved "
             "before it is sent (env LLM_DISPATCH_BUDGET)")] = None,
    budget_name: Annotated[Optional[str], typer.Option(
        "--budget-name", help="hold a named budget (`llm-dispatch budget set`) shared with every run naming it")] = None,
    prices_file: Annotated[Optional[Path], typer.Option(help="your own price table (JSON), over the bundled one")] = None,
    schema: Annotated[Optional[str], typer.Option(
        "--schema", help="every answer's schema (unless a prompt gives its own): a JSON Schema file or module:Model")] = None,
    max_reasks: Annotated[Optional[int], typer.Option(
        "--max-reasks", help="times an answer that breaks its schema is asked again (default 2)")] = None,
    database_url: DatabaseUrl = None,
    sim_latency: Annotated[float, typer.Option(help="with --simulate: seconds per request")] = 0.2,
    as_json: Annotated[bool, typer.Option("--json", help="print the summary as JSON")] = False,
) -> None:
    """Send FILE's prompts: urgent ones now as concurrent real-time calls, the rest through the Batch API
    at half price. Every result, token count and cost lands in the database."""
    if file is None and resume is None:
        raise _fail("give a prompt FILE (.jsonl or .csv) or --resume JOB_ID")
    if resume is not None and (new_job or job_name is not None):
        raise _fail("--resume continues a job; --new-job and --job-name choose or start one from FILE: give one or the other")
    if job_name is not None and not job_name.strip():
        raise _fail("--job-name must not be empty")
    if simulate and not wait:
        # The simulator lives in this process: its batches would end with the command, leaving batches open in
        # the database that no provider knows.
        raise _fail("--no-wait cannot go with --simulate: the simulator stops with this command and its batches with "
                    f"it; drop --no-wait (its batches take {SIM_BATCH_SECONDS:.0f} s), or run `llm-dispatch simulate` "
                    "apart, point LLM_DISPATCH_BASE_URL at it and leave out --simulate")
    if retry_failed not in RETRY_FAILED:
        raise _fail(f"--retry-failed must be retryable, all or none, not {retry_failed!r}")
    settings = _settings(model=model, endpoint=endpoint, concurrency=concurrency, chunk_size=chunk_size, dedupe=dedupe,
                         database_url=database_url, route_policy=route,
                         prices_file=str(prices_file) if prices_file else None, response_schema=schema,
                         max_reasks=max_reasks, budget=budget, budget_name=budget_name)
    if prices_file is not None:
        from llm_dispatch.core import PriceTable

        PriceTable.load(path=prices_file)

    if file is not None:
        from llm_dispatch.jobs import prompt_input

        # The whole file, before anything is sent or written; streaming, no prompt held.
        checked = prompt_input(file, settings=settings).check(warn=False, remember=True)
        err.print(f"{file}: {checked.count} prompts valid", highlight=False)
        for warning in checked.warnings:
            err.print(f"[yellow]warning:[/] {warning}", highlight=False, soft_wrap=True)
        providers = checked.providers
    else:
        providers = frozenset({"openai"})

    if not simulate:
        _check_keys(settings, providers=providers)

    with contextlib.ExitStack() as stack:
        if simulate:
            from llm_dispatch.simulator import Simulator, SimulatorConfig

            sim = SimulatorConfig(latency=sim_latency, batch_processing_seconds=SIM_BATCH_SECONDS)
            base_url = stack.enter_context(Simulator.in_thread(sim))
            # One simulator answers both providers: OpenAI's API under /v1, Anthropic's at the host (its paths carry /v1).
            settings = settings.model_copy(update={"base_url": base_url, "anthropic_base_url": base_url.removesuffix("/v1"),
                                                   "batch_poll_interval": SIM_POLL_SECONDS})
            err.print(f"simulator at {base_url} ({sim_latency * 1000:.0f} ms per request, batches take "
                      f"{SIM_BATCH_SECONDS:.0f} s)", highlight=False)
        from prefect.exceptions import TerminationSignal

        try:
            summary = asyncio.run(_run_with_progress(source=str(file) if file else None, job_id=resume, settings=settings,
                                                     retry_failed=retry_failed, retry_refused=retry_refused,  # type: ignore[arg-type]
                                                     show=not as_json, wait=wait, max_cost=max_cost, new_job=new_job,
                                                     job_name=job_name, fail_above=fail_above))
        except (TerminationSignal, BaseExceptionGroup) as exc:
            # Prefect's own SIGTERM handler (installed while a flow runs) raises this wherever the run
            # is, sometimes inside a task group; asyncio.run has cancelled the run on the way out.
            terminations = exc.subgroup(TerminationSignal) if isinstance(exc, BaseExceptionGroup) else exc
            if terminations is None:
                raise
            stop = _Interrupted(signal.SIGTERM)
            again = "the same command" if file is not None else f"llm-dispatch run --resume {resume}"
            raise _fail(
                f"stopped by {stop.name}: every answer received is saved; run {again} to send the rest",
                code=128 + stop.signum,
            ) from None
        except _Interrupted as stop:
            again = "the same command" if file is not None else f"llm-dispatch run --resume {resume}"
            raise _fail(
                f"stopped by {stop.name}: every answer received is saved; run {again} to send the rest",
                code=128 + stop.signum,
            ) from None

    _say_which_job(summary)
    if as_json:
        out.print_json(json.dumps(to_json(summary), default=str))
    else:
        _print_summary(summary)
    stopped = summary.stopped
    if stopped:
        # One line: what stopped the run, what to fix (the stored hint), and that the same command continues.
        again = "the same command" if file is not None else f"llm-dispatch run --resume {resume}"
        causes = " ".join(found["message"] for found in stopped)
        err.print(f"[bold red]error:[/] {causes} {summary.left} prompts are left pending: fix that, "
                  f"then run {again} to send them.", highlight=False, soft_wrap=True)
    held = summary.budget
    if held is not None and held.stopped:
        job = summary.report.job_id[:8]
        if held.name.startswith("job:"):
            again = f"run `llm-dispatch run --resume {job} --budget HIGHER`"
        else:
            wait = "" if held.per == "total" else f", or wait for the next {held.per}"
            again = (f"raise it (`llm-dispatch budget set {held.name} --limit HIGHER --per {held.per}`{wait}), "
                     f"then run `llm-dispatch run --resume {job} --budget-name {held.name}`")
        raise _fail(f"{budget_line(held)}; {held.over_budget} prompts are left pending: {again} to send them",
                    code=EXIT_BUDGET)
    counts = summary.report.counts
    failed = counts.get("failed", 0)
    if failed and failed <= fail_above * sum(counts.values()):
        err.print(f"{failed} of {sum(counts.values())} prompts failed, within --fail-above {fail_above:g}: the run is "
                  "Completed", highlight=False)
        failed = 0
    # A run stopped by its provider's answers (a refused key, no credit): the provider's failure, as when a call
    # of another command fails.
    raise typer.Exit(EXIT_PROVIDER if stopped else EXIT_FAILED_PROMPTS if failed else 0)


def budget_line(budget: BudgetStanding) -> str:
    """One line of where a budget stands (a summary's ``budget``): spent, reserved and left of its limit."""
    period = "" if budget.per == "total" else f" this {budget.per} ({budget.period})"
    return (f"budget {budget.label} reached{period}: spent ${money(budget.spent):.6f}, reserved "
            f"${money(budget.reserved):.6f}, left ${money(budget.left):.6f} of ${money(budget.limit):.6f}")


budget_app = typer.Typer(cls=_Commands, no_args_is_help=True,
                         help="Spending caps shared by every run, shard and worker that names them (--budget-name).")
app.add_typer(budget_app, name="budget")


@budget_app.command("set")
def budget_set(
    name: Annotated[str, typer.Argument(help="the budget's name, as runs give it with --budget-name")],
    limit: Annotated[float, typer.Option("--limit", help="dollars per period")],
    per: Annotated[str, typer.Option("--per", help="the period the limit holds over: day|month|total (UTC)")] = "total",
    database_url: DatabaseUrl = None,
    as_json: AsJson = False,
) -> None:
    """Create a named budget or change its limit; runs holding it see the new limit at their next reservation."""
    from .budgets import print_budgets, set_budget

    settings = _settings(database_url=database_url)
    row = asyncio.run(set_budget(settings=settings, name=name, limit=limit, per=per))
    if as_json:
        out.print_json(json.dumps(row))
    else:
        print_budgets(out, [row])


@budget_app.command("show")
def budget_show(
    name: Annotated[Optional[str], typer.Argument(help="one budget (default: all, jobs' own included)")] = None,
    history: Annotated[bool, typer.Option("--history", help="earlier periods too")] = False,
    database_url: DatabaseUrl = None,
    as_json: AsJson = False,
) -> None:
    """Where each budget stands this period: its limit, what was spent, what runs hold reserved, what is left."""
    from .budgets import print_budgets, show_budgets

    settings = _settings(database_url=database_url)
    rows = asyncio.run(show_budgets(settings=settings, name=name, history=history))
    if as_json:
        out.print_json(json.dumps(rows))
    else:
        print_budgets(out, rows)


def _check_keys(settings: Settings, *, providers: frozenset[str]) -> None:
    """One line and exit 2 when a provider the prompts go to has no key (before anything is written)."""
    if ("openai" in providers and settings.api_key is None and settings.api_key_block is None
            and "api.openai.com" in settings.base_url):
        raise _fail("no API key: set OPENAI_API_KEY (or LLM_DISPATCH_API_KEY), or add --simulate to use the bundled simulator")
    if "anthropic" in providers:
        from llm_dispatch.core import check_provider_key

        try:
            check_provider_key(settings, provider="anthropic")
        except LLMDispatchError as exc:
            raise _fail(f"{exc}, or add --simulate to use the bundled simulator") from None


def _flow_call(coroutine: Any) -> Any:
    """Run a flow from a command, with the CLI's Prefect settings."""
    with _prefect_settings():
        return asyncio.run(coroutine)


@app.command()
def collect(
    job: Annotated[Optional[str], typer.Argument(help="only this job's batches (default: every open batch)")] = None,
    database_url: DatabaseUrl = None,
    stale_after: Annotated[float, typer.Option(help="seconds before a half-submitted batch counts as abandoned")] = 600.0,
    retry_now: Annotated[bool, typer.Option(
        "--retry-now", help="try batches with a recent error now, not after their wait")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the sweep's summary as JSON")] = False,
) -> None:
    """One sweep over open batches: poll each, ingest what finished, resubmit or send real-time the rest.

    Each batch on its own: one that fails (or that the provider lost) is named, and the others are collected."""
    from llm_dispatch.flows.batch import collect_batches

    url = _stored_url(database_url)
    summary = _flow_result(collect_batches(database_url=url, job_id=job,
                                           stale_after=stale_after, retry_now=retry_now, return_state=True))
    if as_json:
        out.print_json(json.dumps(to_json(summary), default=str))
    else:
        ingested = summary.ingested
        waiting = f", {len(summary.waiting)} waiting to retry after errors" if summary.waiting else ""
        out.print(
            f"{summary.open} open batches: polled {summary.polled}, ingested {len(ingested)} "
            f"({sum(i.succeeded for i in ingested)} answers, {sum(i.failed for i in ingested)} failed), "
            f"resubmitted {summary.resubmitted} prompts, sent {summary.realtime} real-time{waiting}",
            highlight=False,
        )
        _print_problems(summary.problems)
    _exit_on_problems(summary.problems)


@app.command()
def cancel(
    job: Annotated[str, typer.Argument(help="the job whose open batches to cancel")],
    database_url: DatabaseUrl = None,
    wait_seconds: Annotated[float, typer.Option(help="how long to wait for the provider to stop them")] = 120.0,
) -> None:
    """Cancel a job's open batches; what they answered before stopping is still stored (it is billed)."""
    from llm_dispatch.flows.batch import cancel_job_batches

    url = _stored_url(database_url)
    summary = _flow_result(cancel_job_batches(job_id=job, database_url=url,
                                              wait_seconds=wait_seconds, return_state=True))
    kept = sum(i.succeeded for i in summary.ingested)
    out.print(f"cancelled {len(summary.cancelled)} batches of job {job}; kept {kept} answers they gave; "
              f"{len(summary.cancelled) - len(summary.ingested)} still stopping (`llm-dispatch collect` finishes them)",
              highlight=False)
    _print_problems(summary.problems)
    _exit_on_problems(summary.problems)


@app.command()
def abandon(
    batch: Annotated[int, typer.Argument(help="our batch id (`llm-dispatch status JOB` lists them)")],
    database_url: DatabaseUrl = None,
    force: Annotated[bool, typer.Option(
        "--force", help="give it up even while the provider still holds it (what it answers is billed, not kept)")] = False,
) -> None:
    """Give up a batch the provider cannot answer for: closed as lost, its unanswered prompts pending again.

    A batch the provider still reports is refused (sending its prompts again would pay twice) unless --force."""
    from llm_dispatch.flows.batch import abandon_batch_flow

    url = _stored_url(database_url)
    outcome = _flow_call(abandon_batch_flow(batch_id=batch, database_url=url,
                                            force=force))
    job = outcome.job_id[:8]
    cancelled = (f"; {outcome.cancelled} failed as cancelled (the job's batches were cancelled: "
                 "`--retry-failed all` sends them)" if outcome.cancelled else "")
    out.print(f"batch {batch} abandoned ({outcome.provider_said}); {outcome.released} prompts of job {job} "
              f"are pending again: `llm-dispatch run --resume {job}` sends them{cancelled}", highlight=False)


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
    state = _flow_call(coroutine)
    result = state.result(raise_on_failure=False)
    if isinstance(result, BaseException):
        raise result
    return result


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


@app.command()
def status(
    job: Annotated[Optional[str], typer.Argument(help="a job id (default: the newest jobs)")] = None,
    database_url: DatabaseUrl = None,
    as_json: AsJson = False,
) -> None:
    """Jobs, their prompts per route and status, and their batches."""
    _report("status", job=job, database_url=database_url, as_json=as_json)


@app.command()
def models(
    prices_file: Annotated[Optional[Path], typer.Option(help="your own price table (JSON), over the bundled one")] = None,
    provider: Annotated[Optional[str], typer.Option(help="only this provider's models: openai|anthropic")] = None,
    as_json: AsJson = False,
) -> None:
    """The model catalog: each model's prices, context window, maximum output, shutdown date and where its figures
    come from, as a run prices them today."""
    from llm_dispatch.core import PROVIDERS, PriceTable

    from .catalog import catalog, print_catalog

    if provider is not None and provider not in PROVIDERS:
        raise _fail(f"--provider must be one of {', '.join(PROVIDERS)}, not {provider!r}")
    prices = prices_file if prices_file is not None else _settings().prices_file
    try:
        table = PriceTable.load(path=Path(prices) if prices else None)
    except LLMDispatchError as exc:
        raise _fail(str(exc)) from None
    data = catalog(table, provider=provider)
    if as_json:
        print(json.dumps(data, indent=2))
    else:
        print_catalog(out, data)


@app.command()
def cost(
    job: NewestJob = None,
    database_url: DatabaseUrl = None,
    prices_file: Annotated[Optional[Path], typer.Option(hidden=True)] = None,
    as_json: AsJson = False,
) -> None:
    """What a job cost per route, as stored with each answer when it came, and what the Batch API saved."""
    if prices_file is not None:
        raise _fail("cost shows what each answer cost when it was stored; to see a job under other prices, "
                    f"run `llm-dispatch reprice {job or ''} --prices-file {prices_file}`".replace("  ", " "))
    _report("cost", job=job, database_url=database_url, as_json=as_json)


@app.command()
def reprice(
    job: NewestJob = None,
    prices_file: Annotated[Optional[Path], typer.Option(help="the price table (JSON) to try, over the bundled one")] = None,
    tier: Annotated[Optional[str], typer.Option(
        help="what if every real-time answer had been served at this service tier (standard, flex, priority...)")] = None,
    route: Annotated[Optional[str], typer.Option(help="what if every answer had been sent this way: realtime|batch")] = None,
    database_url: DatabaseUrl = None,
    as_json: AsJson = False,
) -> None:
    """What a job would cost under another price table, service tier or route, beside its stored cost; changes
    nothing."""
    if prices_file is None and tier is None and route is None:
        raise _fail("give --prices-file FILE (a price table), --tier TIER or --route ROUTE: what to reprice the job with")
    if route not in (None, "realtime", "batch"):
        raise _fail(f"--route must be realtime or batch, not {route!r}")
    _report("reprice", job=job, database_url=database_url, as_json=as_json, prices_file=prices_file, tier=tier,
            route=route)


def _report(name: str, *, job: str | None, database_url: str | None, as_json: bool, **options: Any) -> None:
    """Run the report ``reports.<name>``; print it as a table (``reports.print_<name>``) or JSON."""
    from . import reports

    settings = _settings(database_url=database_url)
    query, show = getattr(reports, name), getattr(reports, f"print_{name}")
    data = asyncio.run(query(settings=settings, job_id=job, **options))
    if data is None:
        where = settings.public_dict()["database_url"]
        raise _fail(f"no job {job or ''!r} in {where}; `llm-dispatch status` lists jobs")
    if as_json:
        out.print_json(json.dumps(data, default=str))
    else:
        show(out, data)


@app.command()
def export(
    job: Annotated[str, typer.Argument(help="the job to export: its id (or the id's first characters) or its name")],
    fmt: Annotated[Optional[str], typer.Option(
        "--format", help="jsonl (default), csv, parquet, or npy (the embedding vectors alone, float32)")] = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="file to write (default: stdout)")] = None,
    fields: Annotated[Optional[str], typer.Option(
        "--fields", help="columns, comma-separated: built-in names, metadata keys, or all (default: id, prompt, "
                         "answer, status, error, model, tokens, cost_usd, latency_ms, then each metadata key)")] = None,
    database_url: DatabaseUrl = None,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON array of the rows (instead of --format)")] = False,
) -> None:
    """Every prompt of JOB in input order, ready for scoring: the user's id, the prompt, the answer, status, error,
    tokens, cost, latency and the prompt's metadata as columns; for a job with a schema, each field of the parsed
    answer as a column of its own (typed in Parquet), its violation, re-asks and cost with them."""
    from . import reports

    if as_json and fmt is not None:
        raise _fail("give --json or --format, not both")
    if fmt not in (None, "jsonl", "csv", "parquet", "npy"):
        raise _fail(f"--format must be jsonl, csv, parquet or npy, not {fmt!r}")
    if fmt in ("parquet", "npy") and output is None:
        raise _fail(f"--format {fmt} writes a file: give --output FILE.{fmt}")
    fmt = "json" if as_json else fmt or "jsonl"
    chosen = [name.strip() for name in fields.split(",") if name.strip()] if fields is not None else None
    if chosen == []:
        raise _fail("--fields names no column; give names separated by commas, or leave it out for the default ones")
    settings = _settings(database_url=database_url)
    written = asyncio.run(reports.export(settings=settings, job_id=job, fmt=fmt, output=output, fields=chosen))
    if output is not None:
        err.print(f"wrote {written} rows to {output}", highlight=False)


class _Interrupted(Exception):
    """The run was cancelled by SIGINT or SIGTERM, after saving what had arrived."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
        self.name = signal.Signals(signum).name


async def _run_with_progress(
    *,
    source: str | None,
    job_id: str | None,
    settings: Settings,
    retry_failed: RetryFailed,
    retry_refused: bool,
    show: bool,
    wait: bool,
    max_cost: float | None,
    new_job: bool = False,
    job_name: str | None = None,
    fail_above: float = 0.0,
) -> DispatchSummary:
    from llm_dispatch.flows.dispatch import dispatch
    from llm_dispatch.tasks import result_of

    # Per-task "Finished in state Completed" lines would drown the progress bar.
    logging.getLogger("prefect.task_runs").setLevel(logging.WARNING)
    from llm_dispatch.core import Progress, current_progress

    progress = Progress()
    token = current_progress.set(progress)
    # Ctrl-C cancels the run instead of killing it: the result writer then saves every answer
    # already received before we exit. (SIGTERM is Prefect's while a flow runs: it raises
    # TerminationSignal, and asyncio.run cancels the run on the way out, to the same effect.)
    loop = asyncio.get_running_loop()
    main_task = asyncio.current_task()
    received: list[int] = []

    def stop(signum: int) -> None:
        if not received and main_task is not None:
            received.append(signum)
            main_task.cancel()

    loop.add_signal_handler(signal.SIGINT, stop, signal.SIGINT)
    display: asyncio.Task[None] | None = asyncio.create_task(_show(progress)) if show and err.is_terminal else None
    try:
        with _prefect_settings():
            # The run may end Failed (failed prompts) with its summary: read either way.
            return await result_of(await dispatch(
                prompts=source, job_id=job_id, model=settings.model, endpoint=settings.endpoint,
                route_policy=settings.route_policy,
                wait=wait, max_cost=max_cost, concurrency=settings.concurrency, chunk_size=settings.chunk_size,
                chunk_concurrency=settings.chunk_concurrency, dedupe=settings.dedupe, retry_failed=retry_failed,
                retry_refused=retry_refused, base_url=settings.base_url, anthropic_base_url=settings.anthropic_base_url,
                database_url=settings.database_url, prices_file=settings.prices_file,
                answer_schema=settings.response_schema, max_reasks=settings.max_reasks,
                batch_poll_interval=settings.batch_poll_interval, new_job=new_job, job_name=job_name,
                budget=settings.budget, budget_name=settings.budget_name,
                fail_above=fail_above, return_state=True,
            ))
    except asyncio.CancelledError:
        if received:
            raise _Interrupted(received[0]) from None
        raise
    finally:
        loop.remove_signal_handler(signal.SIGINT)
        current_progress.reset(token)
        if display is not None:
            display.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await display


@contextlib.contextmanager
def _prefect_settings() -> Any:
    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_SERVER_ANALYTICS_ENABLED,
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS,
        temporary_settings,
    )

    # With no Prefect server configured, Prefect starts a temporary one: 10-17 s on a fresh home,
    # more on a busy machine, past its default wait of 20 s. A user's own setting still wins.
    updates: dict[Any, Any] = {
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS: max(
            PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value(), EPHEMERAL_STARTUP_TIMEOUT
        ),
    }
    if "PREFECT_SERVER_ANALYTICS_ENABLED" not in os.environ:
        # A temporary server's telemetry only logs an error on an offline machine.
        updates[PREFECT_SERVER_ANALYTICS_ENABLED] = False
    if not PREFECT_API_URL.value():
        from .server import running_server

        # No server configured: the one `llm-dispatch server start` keeps, when it is up, not a temporary one.
        local = running_server()
        if local is not None:
            updates[PREFECT_API_URL] = local.api_url
    with temporary_settings(updates=updates), _run_errors_unprinted(unless=_debug()):
        yield


class _RunErrors(logging.Filter):
    """Holds back the ERROR lines of flow and task runs: each is about an error that reaches the command, which
    says it once (one line, or the traceback of a bug). The Prefect API, and so the UI, still gets them."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < logging.ERROR or not record.name.startswith(("prefect.flow_runs", "prefect.task_runs"))


@contextlib.contextmanager
def _run_errors_unprinted(*, unless: bool) -> Any:
    """While a command runs a flow, Prefect's console shows no run's ERROR lines (``--debug``: it shows them all)."""
    from prefect.logging.handlers import PrefectConsoleHandler

    consoles = [] if unless else [h for h in logging.getLogger().handlers if isinstance(h, PrefectConsoleHandler)]
    quiet = _RunErrors()
    for handler in consoles:
        handler.addFilter(quiet)
    try:
        yield
    finally:
        for handler in consoles:
            handler.removeFilter(quiet)


async def _show(progress: Progress) -> None:
    columns = (
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[detail]}"),
        TimeElapsedColumn(),
    )
    with RichProgress(*columns, console=err, transient=True) as bar, _quiet_prefect_info():
        task = bar.add_task("requests", total=None, detail="")
        shown = 0
        while True:
            # Prefect's INFO lines are held back while the bar is drawn; what the flow wants seen comes here.
            for note in progress.notes[shown:]:
                bar.console.print(note, highlight=False)
            shown = len(progress.notes)
            bar.update(
                task,
                total=progress.total or None,
                completed=progress.done,
                detail=f"failed {progress.failed}  in flight {progress.in_flight}  {progress.rate():.0f} req/s",
            )
            await asyncio.sleep(0.25)


@contextlib.contextmanager
def _quiet_prefect_info() -> Any:
    """While the live bar is drawn, Prefect's INFO lines (which write past rich) are held back.

    The bar and the closing table say the same; without a terminal every log line is kept.
    """
    loggers = [logging.getLogger(name) for name in ("prefect", "prefect.flow_runs", "prefect.task_runs")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(max(logger.getEffectiveLevel(), logging.WARNING))
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def _say_which_job(summary: DispatchSummary) -> None:
    """One line when the run did not start a job from scratch: which job it resumed, and what it sent."""
    job = f"job {summary.report.job_id[:8]} ({summary.job_name})"
    sent = summary.sent_prompts
    if summary.started_over_from:
        err.print(f"job {summary.started_over_from[:8]} already answered this input and --no-dedupe was given: "
                  f"new {job} sent its {summary.prompts} prompts again", highlight=False, soft_wrap=True)
    elif summary.resumed:
        before = summary.answered_before
        did = "nothing sent" if not sent and not summary.report.unfinished else f"{sent} prompts sent now"
        err.print(f"resumed {job}: {before} of its {summary.prompts} prompts were answered before this run, "
                  f"{did}; --new-job starts a new job from the same file", highlight=False, soft_wrap=True)


def _print_summary(summary: DispatchSummary) -> None:
    from llm_dispatch.jobs import RealtimeSummary

    from .reports import job_table

    realtime = summary.realtime
    title = f"job {summary.report.job_id[:8]} ({summary.job_name})" + (" (resumed)" if summary.resumed else "")
    out.print(job_table(to_json(summary), title=title))
    notes = []
    if summary.reused:
        notes.append(f"answered from storage: {summary.reused}")
    if isinstance(realtime, RealtimeSummary) and realtime.send_s and realtime.sent_prompts:
        notes.append(f"real-time throughput {realtime.sent_prompts / realtime.send_s:.0f} prompts/s")
    notes.append(f"wall time {summary.wall_s:.1f} s")
    out.print("  ".join(notes), highlight=False)
    waiting = summary.report.counts.get("batched", 0)
    if waiting:
        out.print(f"{waiting} prompts wait in provider batches: `llm-dispatch collect` (or the collect-batches "
                  "deployment) ingests them when they finish", highlight=False)


server_app = typer.Typer(no_args_is_help=True, help=(
    "A local Prefect server for the session: with none configured (PREFECT_API_URL), each run would start a "
    "temporary one first. `server start` keeps one up; run, collect and cancel use it while it is up."))
app.add_typer(server_app, name="server")


@server_app.command("start")
def server_start(
    port: Annotated[int, typer.Option(help="port on 127.0.0.1")] = 4200,
) -> None:
    """Start a Prefect server in the background (its UI at the same address) for later commands to use."""
    from prefect.settings import PREFECT_API_URL

    from .server import start_server

    if PREFECT_API_URL.value():
        err.print(f"a Prefect server is configured already (PREFECT_API_URL={PREFECT_API_URL.value()}): commands "
                  "use it; nothing started", highlight=False, soft_wrap=True)
        return
    local, started = start_server(port=port)
    ui = local.api_url.removesuffix("/api")
    err.print(f"Prefect server {'started' if started else 'already up'} at {ui} (pid {local.pid}, log {local.log}); "
              "run, collect and cancel use it until `llm-dispatch server stop`", highlight=False, soft_wrap=True)


@server_app.command("stop")
def server_stop() -> None:
    """Stop the Prefect server `llm-dispatch server start` started."""
    from .server import stop_server

    stopped = stop_server()
    err.print(f"stopped the Prefect server at {stopped.api_url} (pid {stopped.pid})" if stopped is not None
              else "no Prefect server of `llm-dispatch server start` is running", highlight=False)


@app.command()
def simulate(
    port: Annotated[int, typer.Option(help="port to listen on")] = 8000,
    host: Annotated[str, typer.Option(help="address to bind")] = "127.0.0.1",
    latency: Annotated[float, typer.Option(help="seconds per request")] = 0.2,
    rate_429: Annotated[float, typer.Option(help="share of requests answered 429")] = 0.0,
    rate_500: Annotated[float, typer.Option(help="share of requests answered 500")] = 0.0,
    rpm: Annotated[Optional[int], typer.Option(help="requests-per-minute quota")] = None,
    tpm: Annotated[Optional[int], typer.Option(help="tokens-per-minute quota")] = None,
    batch_seconds: Annotated[float, typer.Option(help="how long a batch takes, seconds")] = 30.0,
) -> None:
    """Run the bundled simulator (OpenAI's chat completions, files and batches; Anthropic's Messages and Message
    Batches) until interrupted."""
    from llm_dispatch.simulator import SimulatorConfig, serve

    config = SimulatorConfig(latency=latency, rate_429=rate_429, rate_500=rate_500, rpm=rpm, tpm=tpm,
                             batch_processing_seconds=batch_seconds)
    def ready(base_url: str) -> None:
        err.print(f"simulator on {base_url} — point LLM_DISPATCH_BASE_URL there (and LLM_DISPATCH_ANTHROPIC_BASE_URL at "
                  f"{base_url.removesuffix('/v1')} for claude models); Ctrl-C stops it", highlight=False)

    with contextlib.suppress(KeyboardInterrupt):
        serve(host=host, port=port, config=config, on_ready=ready)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
