"""The ``llm-dispatch`` command: ad-hoc runs, the simulator, and (later) reports."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn, TimeElapsedColumn
from rich.table import Table

from llm_dispatch import InputError, LLMDispatchError, Settings
from llm_dispatch._dispatch import Progress, current_progress

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Send many prompts to LLM APIs through Prefect flows.")
err = Console(stderr=True)
out = Console()

EXIT_INPUT = 2
EPHEMERAL_STARTUP_TIMEOUT = 120


def main() -> None:
    app()


def _fail(message: str, *, code: int = EXIT_INPUT) -> typer.Exit:
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


def _settings(**overrides: Any) -> Settings:
    try:
        return Settings(**{key: value for key, value in overrides.items() if value is not None})
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        raise _fail(f"setting {field}: {first['msg']} (env LLM_DISPATCH_{field.upper()})") from None


@app.command()
def run(
    file: Annotated[Optional[Path], typer.Argument(help="a .jsonl or .csv file of prompts")] = None,
    resume: Annotated[Optional[str], typer.Option("--resume", help="job id to resume (no FILE needed)")] = None,
    simulate: Annotated[bool, typer.Option("--simulate", help="send to the bundled simulator: no key, no network")] = False,
    model: Annotated[Optional[str], typer.Option(help="default model for prompts that name none")] = None,
    concurrency: Annotated[Optional[int], typer.Option(help="requests in flight per run")] = None,
    chunk_size: Annotated[Optional[int], typer.Option(help="prompts per Prefect task")] = None,
    dedupe: Annotated[bool, typer.Option("--dedupe/--no-dedupe", help="reuse stored answers to identical requests")] = True,
    retry_failed: Annotated[str, typer.Option(help="on resume, resend failed prompts: retryable|all|none")] = "retryable",
    database_url: Annotated[Optional[str], typer.Option(help="SQLAlchemy URL (default: ./llm_dispatch.db)")] = None,
    sim_latency: Annotated[float, typer.Option(help="with --simulate: seconds per request")] = 0.2,
    as_json: Annotated[bool, typer.Option("--json", help="print the summary as JSON")] = False,
) -> None:
    """Send FILE's prompts as concurrent real-time calls; every result lands in the database."""
    if file is None and resume is None:
        raise _fail("give a prompt FILE (.jsonl or .csv) or --resume JOB_ID")
    if retry_failed not in ("retryable", "all", "none"):
        raise _fail(f"--retry-failed must be retryable, all or none, not {retry_failed!r}")
    settings = _settings(model=model, concurrency=concurrency, chunk_size=chunk_size, dedupe=dedupe, database_url=database_url)

    if file is not None:
        from tasks.record import load_specs

        try:
            specs = load_specs(file, settings=settings)  # the whole file, before anything is sent or written
        except InputError as exc:
            raise _fail(str(exc)) from None
        err.print(f"{file}: {len(specs)} prompts valid", highlight=False)

    if not simulate and settings.api_key is None and "api.openai.com" in settings.base_url:
        raise _fail("no API key: set OPENAI_API_KEY (or LLM_DISPATCH_API_KEY), or add --simulate to use the bundled simulator")

    with contextlib.ExitStack() as stack:
        if simulate:
            from llm_dispatch import Simulator, SimulatorConfig

            base_url = stack.enter_context(Simulator.in_thread(SimulatorConfig(latency=sim_latency)))
            settings = settings.model_copy(update={"base_url": base_url})
            err.print(f"simulator at {base_url} ({sim_latency * 1000:.0f} ms per request)", highlight=False)
        from prefect.exceptions import TerminationSignal

        try:
            summary = asyncio.run(_run_with_progress(source=str(file) if file else None, job_id=resume, settings=settings,
                                                     retry_failed=retry_failed, show=not as_json))  # type: ignore[arg-type]
        except LLMDispatchError as exc:
            raise _fail(str(exc)) from None
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

    if as_json:
        out.print_json(json.dumps(summary, default=str))
    else:
        _print_summary(summary)
    failed = summary["counts"].get("failed", 0)
    raise typer.Exit(1 if failed else 0)


class _Interrupted(Exception):
    """The run was cancelled by SIGINT or SIGTERM, after saving what had arrived."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
        self.name = signal.Signals(signum).name


async def _run_with_progress(
    *, source: str | None, job_id: str | None, settings: Settings, retry_failed: Literal["retryable", "all", "none"], show: bool
) -> dict[str, Any]:
    from prefect.settings import (
        PREFECT_SERVER_ANALYTICS_ENABLED,
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS,
        temporary_settings,
    )

    from flows.realtime import realtime_dispatch

    # Per-task "Finished in state Completed" lines would drown the progress bar.
    logging.getLogger("prefect.task_runs").setLevel(logging.WARNING)
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
    try:
        with temporary_settings(updates=updates):
            return await realtime_dispatch(
                prompts=source, job_id=job_id, model=settings.model, concurrency=settings.concurrency,
                chunk_size=settings.chunk_size, chunk_concurrency=settings.chunk_concurrency, dedupe=settings.dedupe,
                retry_failed=retry_failed, base_url=settings.base_url, database_url=settings.database_url,
            )
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
    columns = (
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[detail]}"),
        TimeElapsedColumn(),
    )
    with RichProgress(*columns, console=err, transient=True) as bar, _quiet_prefect_info():
        task = bar.add_task("requests", total=None, detail="")
        while True:
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


def _print_summary(summary: dict[str, Any]) -> None:
    stats = summary.get("stats") or {}
    counts = summary["counts"]
    table = Table(title=f"job {summary['job_id']}" + (" (resumed)" if summary["resumed"] else ""), show_header=False)
    table.add_row("prompts", str(summary["prompts"]))
    table.add_row("succeeded", str(counts.get("succeeded", 0)))
    table.add_row("failed", str(counts.get("failed", 0)))
    for name, count in sorted(summary["failed_by_class"].items()):
        table.add_row(f"  {name}", str(count))
    if counts.get("pending", 0) or counts.get("in_flight", 0):
        table.add_row("unfinished", str(counts.get("pending", 0) + counts.get("in_flight", 0)))
    table.add_row("sent this run", str(summary["sent_prompts"]))
    table.add_row("answered from storage", str(summary["reused"]))
    table.add_row("wall time", f"{summary['wall_s']:.1f} s")
    if stats.get("p50_latency_ms") is not None:
        table.add_row("latency p50 / p95", f"{stats['p50_latency_ms']:.0f} / {stats['p95_latency_ms']:.0f} ms")
    if summary.get("send_s"):
        table.add_row("throughput", f"{summary['sent_prompts'] / summary['send_s']:.0f} prompts/s")
    out.print(table)


@app.command()
def simulate(
    port: Annotated[int, typer.Option(help="port to listen on")] = 8000,
    host: Annotated[str, typer.Option(help="address to bind")] = "127.0.0.1",
    latency: Annotated[float, typer.Option(help="seconds per request")] = 0.2,
    rate_429: Annotated[float, typer.Option(help="share of requests answered 429")] = 0.0,
    rate_500: Annotated[float, typer.Option(help="share of requests answered 500")] = 0.0,
    rpm: Annotated[Optional[int], typer.Option(help="requests-per-minute quota")] = None,
    tpm: Annotated[Optional[int], typer.Option(help="tokens-per-minute quota")] = None,
) -> None:
    """Run the bundled OpenAI-compatible simulator (chat completions) until interrupted."""
    from llm_dispatch import SimulatorConfig, serve_simulator

    config = SimulatorConfig(latency=latency, rate_429=rate_429, rate_500=rate_500, rpm=rpm, tpm=tpm)
    def ready(base_url: str) -> None:
        err.print(f"simulator on {base_url} — point LLM_DISPATCH_BASE_URL there; Ctrl-C stops it", highlight=False)

    with contextlib.suppress(KeyboardInterrupt):
        serve_simulator(host=host, port=port, config=config, on_ready=ready)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
