"""The ``llm-dispatch`` command: the command group, ``run`` (ad-hoc runs with their progress bar and summary) and
``simulate``; the other commands live by group (``batches``, ``read_only``, ``budgets``, ``server``) and are
registered here, in the order ``--help`` lists them."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from llm_dispatch.core import (
    RETRY_FAILED,
    LLMDispatchError,
    RetryFailed,
    Settings,
    counted,
    money,
    setting_overrides,
    to_json,
)

from ._common import (
    EXIT_BUDGET,
    EXIT_CODES,
    EXIT_FAILED_PROMPTS,
    EXIT_PROVIDER,
    DatabaseUrl,
    _Commands,
    _fail,
    _settings,
    err,
    out,
    run_argument,
    run_flag,
)
from ._flow_runs import SIM_BATCH_SECONDS, check_simulated_wait, dispatch_summary, simulated
from .batches import abandon, cancel, collect
from .budgets import budget_app
from .read_only import cost, export, models, reprice, status
from .server import server_app

if TYPE_CHECKING:
    # The send path's (it loads the HTTP stack): imported by the commands that send, not by the reports.
    from llm_dispatch.core import Progress
    from llm_dispatch.jobs import BudgetStanding, DispatchSummary

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


def run(
    file: Annotated[Optional[Path], run_argument("prompts")] = None,
    resume: Annotated[Optional[str], run_flag("job_id")] = None,
    new_job: Annotated[bool, run_flag("new_job")] = False,
    job_name: Annotated[Optional[str], run_flag("job_name")] = None,
    simulate: Annotated[bool, run_flag("simulate")] = False,
    model: Annotated[Optional[str], run_flag("model")] = None,
    allow_unknown_model: Annotated[bool, run_flag("allow_unknown_model")] = False,
    endpoint: Annotated[Optional[str], run_flag("endpoint")] = None,
    concurrency: Annotated[Optional[int], run_flag("concurrency")] = None,
    chunk_size: Annotated[Optional[int], run_flag("chunk_size")] = None,
    dedupe: Annotated[bool, run_flag("dedupe")] = True,
    retry_failed: Annotated[str, run_flag("retry_failed")] = "retryable",
    retry_refused: Annotated[bool, run_flag("retry_refused")] = False,
    route: Annotated[Optional[str], run_flag("route_policy")] = None,
    wait: Annotated[bool, run_flag("wait")] = True,
    max_cost: Annotated[Optional[float], run_flag("max_cost")] = None,
    fail_above: Annotated[float, run_flag("fail_above", min=0.0, max=1.0)] = 0.0,
    budget: Annotated[Optional[float], run_flag("budget")] = None,
    budget_name: Annotated[Optional[str], run_flag("budget_name")] = None,
    prices_file: Annotated[Optional[Path], run_flag("prices_file")] = None,
    providers_file: Annotated[Optional[Path], run_flag("providers_file")] = None,
    schema: Annotated[Optional[str], run_flag("answer_schema")] = None,
    max_reasks: Annotated[Optional[int], run_flag("max_reasks")] = None,
    cache_plan: Annotated[Optional[bool], run_flag("cache_plan")] = None,
    database_url: DatabaseUrl = None,
    sim_latency: Annotated[float, run_flag("sim_latency")] = 0.2,
    as_json: Annotated[bool, run_flag("json")] = False,
) -> None:
    """Send FILE's prompts: urgent ones now as concurrent real-time calls, the rest through the Batch API
    at half price. Every result, token count and cost lands in the database."""
    if file is None and resume is None:
        raise _fail("give a prompt FILE (.jsonl or .csv) or --resume JOB_ID")
    if resume is not None and (new_job or job_name is not None):
        raise _fail("--resume continues a job; --new-job and --job-name choose or start one from FILE: give one or the other")
    if job_name is not None and not job_name.strip():
        raise _fail("--job-name must not be empty")
    check_simulated_wait(simulate=simulate, wait=wait)
    if retry_failed not in RETRY_FAILED:
        raise _fail(f"--retry-failed must be retryable, all or none, not {retry_failed!r}")
    # A flag not given leaves the environment's setting (LLM_DISPATCH_ALLOW_UNKNOWN_MODEL) standing.
    settings = _settings(**{**setting_overrides(locals(), door="cli"), "allow_unknown_model": allow_unknown_model or None})
    if prices_file is not None:
        from llm_dispatch.core import PriceTable

        PriceTable.load(path=prices_file)

    if file is not None:
        from llm_dispatch.jobs import prompt_input

        # The whole file, before anything is sent or written; streaming, no prompt held.
        checked = prompt_input(file, settings=settings).check(warn=False, remember=True)
        err.print(f"{file}: {counted(checked.count, 'prompt')} valid", highlight=False)
        for warning in checked.warnings:
            err.print(f"[yellow]warning:[/] {warning}", highlight=False, soft_wrap=True)
        providers = checked.providers
    else:
        providers = frozenset({"openai"})

    if not simulate:
        _check_keys(settings, providers=providers)

    with simulated(settings, latency=sim_latency) if simulate else contextlib.nullcontext(settings) as settings:
        if simulate:
            err.print(f"simulator at {settings.base_url} ({sim_latency * 1000:.0f} ms per request, batches take "
                      f"{SIM_BATCH_SECONDS:.0f} s)", highlight=False)
        from prefect.exceptions import TerminationSignal

        try:
            summary = asyncio.run(_run_with_progress(source=str(file) if file else None, job_id=resume, settings=settings,
                                                     retry_failed=retry_failed, retry_refused=retry_refused,
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
        _print_summary(summary, database_url=settings.database_url)
    stopped = summary.stopped
    if stopped:
        # One line: what stopped the run, what to fix (the stored hint), and that the same command continues.
        again = "the same command" if file is not None else f"llm-dispatch run --resume {resume}"
        causes = " ".join(found["message"] for found in stopped)
        err.print(f"[bold red]error:[/] {causes} {counted(summary.left, 'prompt')} {'is' if summary.left == 1 else 'are'} left pending: fix that, "
                  f"then run {again} to send them.", highlight=False, soft_wrap=True)
    held = summary.budget
    if held is not None and held.stopped:
        job = summary.report.job_id[:8]
        if held.name.startswith("job:"):
            again = f"run `llm-dispatch run --resume {job} --budget HIGHER`"
        else:
            next_period = "" if held.per == "total" else f", or wait for the next {held.per}"
            again = (f"raise it (`llm-dispatch budget set {held.name} --limit HIGHER --per {held.per}`{next_period}), "
                     f"then run `llm-dispatch run --resume {job} --budget-name {held.name}`")
        raise _fail(f"{budget_line(held)}; {counted(held.over_budget, 'prompt')} {'is' if held.over_budget == 1 else 'are'} left pending: {again} to send them",
                    code=EXIT_BUDGET)
    counts = summary.report.counts
    failed = counts.get("failed", 0)
    if failed and failed <= fail_above * sum(counts.values()):
        err.print(f"{failed} of {counted(sum(counts.values()), 'prompt')} failed, within --fail-above {fail_above:g}: the run is "
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


def _check_keys(settings: Settings, *, providers: frozenset[str]) -> None:
    """One line and exit 2 when a provider the prompts go to has no key (before anything is written)."""
    if ("openai" in providers and settings.api_key is None and settings.api_key_block is None
            and "api.openai.com" in settings.base_url):
        raise _fail("no API key: set OPENAI_API_KEY (or LLM_DISPATCH_API_KEY), or add --simulate to use the bundled simulator")
    for provider in sorted(providers & {"anthropic", "gemini"}):
        from llm_dispatch.core import check_provider_key

        try:
            check_provider_key(settings, provider=provider)
        except LLMDispatchError as exc:
            raise _fail(f"{exc}, or add --simulate to use the bundled simulator") from None
    from llm_dispatch.core import ProviderTable

    table = ProviderTable.from_settings(settings)
    for provider in sorted(providers & set(table.declared)):
        try:
            table.get(provider).check_key(source=table.source)
        except LLMDispatchError as exc:
            raise _fail(str(exc)) from None


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
        return await dispatch_summary(source=source, job_id=job_id, settings=settings, wait=wait, max_cost=max_cost,
                                      retry_failed=retry_failed, retry_refused=retry_refused, new_job=new_job,
                                      job_name=job_name, fail_above=fail_above)
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


async def _show(progress: Progress) -> None:
    # The bar's module is loaded by a run, not by every command.
    from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn, TimeElapsedColumn

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
                  f"new {job} sent its {counted(summary.prompts, 'prompt')} again", highlight=False, soft_wrap=True)
    elif summary.resumed:
        before = summary.answered_before
        did = "nothing sent" if not sent and not summary.report.unfinished else f"{counted(sent, 'prompt')} sent now"
        err.print(f"resumed {job}: {before} of its {counted(summary.prompts, 'prompt')} {'was' if before == 1 else 'were'} answered before this run, "
                  f"{did}; --new-job starts a new job from the same file", highlight=False, soft_wrap=True)


def where_results_are(database_url: str) -> str:
    """The database a run's results are in, as a user finds it: a SQLite file's path, any other URL without its
    password."""
    from sqlalchemy.engine import make_url

    url = make_url(database_url)
    if url.get_backend_name() == "sqlite" and url.database:
        return url.database if Path(url.database).is_absolute() else f"./{url.database}"
    return url.render_as_string(hide_password=True)


def _print_summary(summary: DispatchSummary, *, database_url: str) -> None:
    from llm_dispatch.jobs import RealtimeSummary

    from .reports import job_table

    realtime = summary.realtime
    title = f"job {summary.report.job_id[:8]} ({summary.job_name})" + (" (resumed)" if summary.resumed else "")
    out.print(job_table(summary, title=title))
    notes = []
    if summary.reused:
        notes.append(f"answered from storage: {summary.reused}")
    if isinstance(realtime, RealtimeSummary) and realtime.send_s and realtime.sent_prompts:
        notes.append(f"real-time throughput {realtime.sent_prompts / realtime.send_s:.0f} prompts/s")
    notes.append(f"wall time {summary.wall_s:.1f} s")
    out.print("  ".join(notes), highlight=False)
    waiting = summary.report.counts.get("batched", 0)
    if waiting:
        out.print(f"{counted(waiting, 'prompt')} wait in provider batches: `llm-dispatch collect` (or the "
                  "collect-batches deployment) ingests them when they finish", highlight=False)
    job = summary.report.job_id[:8]
    out.print(f"results in {where_results_are(database_url)}; next: `llm-dispatch status {job}`, "
              f"`llm-dispatch export {job} --format csv -o {job}.csv`, `llm-dispatch cost {job}`"
              + (", `llm-dispatch collect` once its batches are done" if waiting else ""),
              highlight=False, soft_wrap=True)


def simulate(
    port: Annotated[int, typer.Option(help="port to listen on")] = 8000,
    host: Annotated[str, typer.Option(help="address to bind")] = "127.0.0.1",
    latency: Annotated[float, typer.Option(help="seconds per request")] = 0.2,
    rate_429: Annotated[float, typer.Option(help="share of requests answered 429")] = 0.0,
    rate_500: Annotated[float, typer.Option(help="share of requests answered 500")] = 0.0,
    rpm: Annotated[Optional[int], typer.Option(help="requests-per-minute quota")] = None,
    tpm: Annotated[Optional[int], typer.Option(help="tokens-per-minute quota")] = None,
    batch_seconds: Annotated[float, typer.Option(help="how long a batch takes, seconds")] = 30.0,
    provider: Annotated[Optional[list[str]], typer.Option(
        help="also serve this named provider at /p/NAME (its OpenAI base URL /p/NAME/v1); repeat for several")] = None,
) -> None:
    """Run the bundled simulator (OpenAI's chat completions, files and batches; Anthropic's Messages and Message
    Batches) until interrupted."""
    from llm_dispatch.simulator import SimulatorConfig, provider_base_url, serve

    config = SimulatorConfig(latency=latency, rate_429=rate_429, rate_500=rate_500, rpm=rpm, tpm=tpm,
                             batch_processing_seconds=batch_seconds)
    def ready(base_url: str) -> None:
        err.print(f"simulator on {base_url} — point LLM_DISPATCH_BASE_URL there (and LLM_DISPATCH_ANTHROPIC_BASE_URL at "
                  f"{base_url.removesuffix('/v1')} for claude models); Ctrl-C stops it", highlight=False)
        for name in named:
            err.print(f"provider {name} at {provider_base_url(base_url, name)} (its OpenAI base URL; "
                      f"{provider_base_url(base_url, name, wire='anthropic')} for another wire): point "
                      "LLM_DISPATCH_PROVIDER_BASE_URLS there", highlight=False)

    named = provider or []
    with contextlib.suppress(KeyboardInterrupt):
        serve(host=host, port=port, config=config, on_ready=ready, providers=named)


for command in (run, collect, cancel, abandon, status, models, cost, reprice, export, simulate):
    app.command()(command)
app.add_typer(budget_app, name="budget")
app.add_typer(server_app, name="server")

if __name__ == "__main__":  # pragma: no cover
    main()
