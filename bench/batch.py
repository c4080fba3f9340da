"""Benchmark: the Batch API path (build + upload + create, then ingest) for 100,000 (or 1M) prompts vs plain baselines.

Runs against the simulator in its own process (``batch_processing_seconds`` small) with a fresh SQLite
file per repeat, or with ``--postgres SERVER_URL`` a database made anew on that PostgreSQL server per child. Each repeat runs two fresh child processes, alternating: the batch path, then the
baselines (over the same bytes the path downloaded). Medians over the repeats are reported.

    python bench/batch.py [--prompts 100000] [--repeats 3] [--batch-seconds 1.5] [--json [PATH]]
    python bench/batch.py --prompts 1000000 --repeats 1   # issue 13's 1M all-batch job (20 files of 50,000)
    python bench/batch.py --prompts 100000 --repeats 1 --profile /tmp/batch-prof   # cProfile of one run
    python bench/batch.py --prompts 100000 --repeats 1 --profile /tmp/batch-prof --py-spy   # py-spy, every thread
    python bench/batch.py --providers openai,gemini   # the batch path per provider, alternating (issue 37)
    python bench/batch.py --prompts 50000 --postgres postgresql+asyncpg://postgres@127.0.0.1:5432/postgres
    python bench/batch.py --submit-only --code main=/work/main --code new=. [--postgres URL]   # submit vs the plain script

With ``--providers`` each repeat runs the batch path once per provider, in turn, and no baselines: Gemini's
through Batch Mode's file path (its batch uploaded through the Files API's resumable protocol, whatever its size,
the responses file downloaded), OpenAI's through its files and batches.

Per repeat, the batch path does:

1. setup (not a target): ``storage.create_job`` + ``storage.add_prompts`` (every prompt routed ``batch``);
2. submit (target <= 15 s at 100k, <= 60 s at 1M): ``jobs.submit_prompts``: read the prompts a page at a
   time, look for reusable answers, write the JSONL files (50,000 lines each at OpenAI's limits), record each
   batch as its file is complete, upload, create;
3. wait (not a target): ``poll_batch`` until every batch is terminal;
4. ingest (target >= 30,000 rows/s): ``jobs.ingest_batch`` over every batch, output download
   included (timed apart as well); then ``storage.job_counts`` must say every prompt succeeded.

Peak RSS (target <= 400 MB at 100k, <= 300 MB at 1M) is the batch-path child's ``ru_maxrss`` (its whole life,
setup included; the table also gives the submit's and the wait + ingest's own peaks, VmHWM reset between
them); the simulator's is its own process's.
Baselines: the same JSONL written with ``json.dumps`` (plus a raw ``SELECT`` of the prompts, through the engine the
tool makes, and a raw aiohttp upload of each file and create of its batch), the output files parsed with
``json.loads``, and a SQLAlchemy Core executemany insert of the result rows (plus the prompts' status update) into the
same schema. CPU seconds are each child's own (the simulator's apart).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import io
import json
import math
import os
import pstats
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

from _child import processes_cpu, tree_python  # noqa: E402  (bench/ is the script's folder, first on sys.path)

MODEL = "gpt-4o-mini"
GEMINI_MODEL = "gemini-2.5-flash"
PARAMS = {"max_tokens": 64}
ENDPOINT = "/v1/chat/completions"
POLL_INTERVAL = 0.2
WAIT_TIMEOUT = 600.0
CHILD_TIMEOUT = 1800

# (submit s, ingest rows/s, peak RSS MB) by job size; a size between two takes the larger one's.
TARGETS: dict[int, tuple[float, float, float]] = {
    100_000: (15.0, 30_000.0, 400.0),
    1_000_000: (60.0, 30_000.0, 300.0),  # issue 13: the 1M all-batch job; issue 40: 30,000 rows/s
}


def targets_for(count: int) -> tuple[float, float, float]:
    return next((TARGETS[size] for size in sorted(TARGETS) if count <= size), TARGETS[max(TARGETS)])


def _content(i: int) -> str:
    return f"Benchmark question number {i}: what is {i} squared, and why?"


def _messages(i: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": _content(i)}]


def _prompts(count: int, *, distinct: int | None = None, model: str = MODEL) -> Iterator[Any]:
    """NewPrompts as the CLI would store them after routing: distinct (no line shared or reused), or with
    ``distinct`` requests, prompt i asking question i % distinct (identical prompts share one line)."""
    from llm_dispatch import storage
    from llm_dispatch.core import dedupe_key

    for i in range(count):
        messages = _messages(i % distinct if distinct else i)
        yield storage.NewPrompt(
            custom_id=f"c-{i}", position=i, model=model, messages=messages, params=dict(PARAMS),
            dedupe_key=dedupe_key(model=model, messages=messages, params=PARAMS),
            planned_route="batch", route_reason="bench",
        )


# --- memory and CPU accounting ----------------------------------------------------------------


def _status_kb(field: str, pid: int | str = "self") -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return float(line.split()[1])
    except OSError:
        return None
    return None


def _reset_peak_rss() -> bool:
    """Reset this process's VmHWM (Linux >= 4.0), so a phase's own peak can be read."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _ru_maxrss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _thread_cpu() -> dict[str, float]:
    """CPU seconds per live thread of this process, keyed by Python thread name."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    cpu: dict[str, float] = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            fields = task.joinpath("stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        name = names.get(int(task.name), f"tid-{task.name}")
        cpu[name] = cpu.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return cpu


def _group_threads(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """CPU of a phase: the event-loop thread, aiosqlite's threads, asyncio.to_thread workers, the rest."""
    groups = {"main": 0.0, "sqlite": 0.0, "to_thread": 0.0, "other": 0.0}
    for name, seconds in after.items():
        delta = seconds - before.get(name, 0.0)
        if name == "MainThread":
            groups["main"] += delta
        elif name.startswith("asyncio_"):
            groups["to_thread"] += delta
        elif name.startswith("Thread-") or "aiosqlite" in name.lower():
            groups["sqlite"] += delta  # aiosqlite connections are unnamed threading.Thread subclasses
        else:
            groups["other"] += delta
    return {k: round(v, 2) for k, v in groups.items()}


def _sim_cpu(base_url: str) -> float:
    import httpx

    stats = httpx.get(base_url.removesuffix("/v1") + "/_sim/stats", timeout=10).raise_for_status().json()
    return float(stats["process_cpu_s"])


class _Profile:
    """cProfile of the event-loop thread, switched on around the timed phases only (``--profile``); with
    ``py_spy``, py-spy sampling every thread of this process instead (collapsed stacks, ``{name}.txt``)."""

    def __init__(self, directory: Path | None, *, py_spy: bool = False) -> None:
        self.directory = directory
        self.py_spy = py_spy

    def run(self, name: str) -> Any:
        import contextlib

        @contextlib.contextmanager
        def phase() -> Iterator[None]:
            if self.directory is None:
                yield
                return
            if self.py_spy:
                with _py_spy(self.directory / f"{name}.txt"):
                    yield
                return
            profiler = cProfile.Profile()
            profiler.enable()
            try:
                yield
            finally:
                profiler.disable()
                self.directory.mkdir(parents=True, exist_ok=True)
                profiler.dump_stats(self.directory / f"{name}.prof")

        return phase()


@contextlib.contextmanager
def _py_spy(path: Path) -> Iterator[None]:
    """py-spy sampling this process (every thread, GIL or not) while the body runs, its stacks written to ``path``."""
    import signal

    path.parent.mkdir(parents=True, exist_ok=True)
    spy = Path(sys.executable).with_name("py-spy")
    proc = subprocess.Popen([str(spy), "record", "--pid", str(os.getpid()), "--rate", "250", "--threads",
                             "--format", "raw", "--output", str(path), "--nonblocking"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(1.0)  # attached before the phase starts
    try:
        yield
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)


def _print_stacks(path: Path, *, top: int = 30) -> None:
    """The top functions of py-spy's collapsed stacks: samples where each is the leaf (self), and where it is on
    the stack (inclusive), with each thread's share."""
    per_thread: dict[str, int] = {}
    leaf: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        n = int(count)
        frames = stack.split(";")
        thread, frames = frames[0], [f.strip() for f in frames[1:]]
        total += n
        per_thread[thread] = per_thread.get(thread, 0) + n
        if frames:
            leaf[frames[-1]] = leaf.get(frames[-1], 0) + n
        for frame in set(frames):
            inclusive[frame] = inclusive.get(frame, 0) + n
    print(f"\n===== {path.stem}: {total} samples (py-spy, every thread) =====")
    for thread, n in sorted(per_thread.items(), key=lambda item: -item[1]):
        print(f"  {n / total:6.1%}  {thread}")
    for title, table in (("self", leaf), ("inclusive", inclusive)):
        print(f"  --- top {top} by {title}")
        for frame, n in sorted(table.items(), key=lambda item: -item[1])[:top]:
            print(f"  {n / total:6.1%}  {frame}")


# --- the database (child process) --------------------------------------------------------------


async def _database_url(*, workdir: Path, name: str) -> str:
    """A fresh database for one child: a SQLite file in the work directory, or, with ``--postgres SERVER_URL`` (in
    BENCH_POSTGRES), a database made on that server under a name of this process's own (its id in it), so two
    benchmarks sharing a server never touch each other's; ``_drop_database`` removes it when the child is done."""
    server = os.environ.get("BENCH_POSTGRES")
    if not server:
        return f"sqlite+aiosqlite:///{workdir / f'{name}.db'}"
    import asyncpg
    from sqlalchemy.engine import make_url

    database = f"bench_{os.getpid()}_" + name.replace("-", "_")
    admin = await asyncpg.connect(server.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{database}"')
        await admin.execute(f'CREATE DATABASE "{database}"')
    finally:
        await admin.close()
    return make_url(server).set(database=database).render_as_string(hide_password=False)


async def _drop_database(url: str) -> None:
    """Remove a child's PostgreSQL database (a SQLite file is left to the work directory's clean-up)."""
    server = os.environ.get("BENCH_POSTGRES")
    if not server:
        return
    import asyncpg
    from sqlalchemy.engine import make_url

    admin = await asyncpg.connect(server.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{make_url(url).database}"')
    finally:
        await admin.close()


def _server_cpu(url: str) -> float:
    """CPU seconds so far of the PostgreSQL server processes connected to this child's database (its backends, on
    this machine); 0 on SQLite."""
    if not os.environ.get("BENCH_POSTGRES"):
        return 0.0
    from sqlalchemy.engine import make_url

    database = make_url(url).database
    found = subprocess.run(["psql", os.environ["BENCH_POSTGRES"].replace("postgresql+asyncpg://", "postgresql://"),
                            "-Atc", f"SELECT pid FROM pg_stat_activity WHERE datname = '{database}'"],
                           capture_output=True, text=True, check=True).stdout.split()
    return processes_cpu(found)


# --- the batch path (child process) -----------------------------------------------------------


async def batch_path(
    *, base_url: str, count: int, workdir: Path, run: int, profile: Path | None, flush_rows: int | None,
    distinct: int | None = None, provider: str = "openai", py_spy: bool = False, submit_only: bool = False,
) -> dict[str, Any]:
    import logging

    from llm_dispatch import storage
    from llm_dispatch.core import TERMINAL_BATCH_STATUSES, GeminiBatchApi, LLMClient, PriceTable
    from llm_dispatch.jobs import ingest_batch, poll_batch
    from llm_dispatch.jobs import Clients, submit_prompts

    logging.basicConfig(level=logging.WARNING)
    profiler = _Profile(profile, py_spy=py_spy)
    out: dict[str, Any] = {"provider": provider}
    model = GEMINI_MODEL if provider == "gemini" else MODEL
    # The ingest's writer as the flows make it (each answer priced into the cost ledger as it is stored),
    # unless --flush-rows tries another batch size.
    prices = PriceTable.load()
    writer_options: dict[str, Any] = {"prices": prices}
    if flush_rows is not None:
        writer_options["flush_rows"] = flush_rows
    url = await _database_url(workdir=workdir, name=f"batch-{run}")
    engine = storage.create_engine(url)
    directory = workdir / f"files-{run}"
    try:
        await storage.migrate(engine)
        sessions = storage.session_factory(engine)

        # 1. setup: record the prompts.
        started = time.perf_counter()
        job_id = await storage.create_job(sessions, name="bench-batch", fingerprint=f"{run:064d}", input_path=None,
                                          model=model, settings={})
        await storage.add_prompts(sessions, job_id=job_id, prompts=_prompts(count, distinct=distinct, model=model))
        recorded = await storage.unfinished_prompt_count(sessions, job_id=job_id, planned_route="batch")
        out["record_s"] = time.perf_counter() - started
        assert recorded == count, f"recorded {recorded} of {count} prompts"
        out["rss_after_setup_mb"] = (_status_kb("VmRSS") or 0) / 1024
        out["peak_rss_setup_mb"] = max(_ru_maxrss_mb(), (_status_kb("VmHWM") or 0) / 1024)
        out["peak_reset"] = _reset_peak_rss()

        root = base_url if provider == "openai" else base_url.removesuffix("/v1")
        async with LLMClient(base_url=root, api_key=None, provider=provider) as client:
            clients = Clients.of(client)
            if provider == "gemini":
                # Batch Mode's file path at any size: the Files API upload, the responses file downloaded.
                clients._batch_apis["gemini"] = GeminiBatchApi(client, inline_max_bytes=0)
            # Time the output download inside ingest_batch without touching its code.
            download_s = 0.0
            downloaded_bytes = 0
            api = clients.batch_api(provider)
            limits = api.limits()
            download = api.download_file

            async def timed_download(file_id: str, *, to: Path, timeout: float | None = None) -> Path:
                nonlocal download_s, downloaded_bytes
                begun = time.perf_counter()
                try:
                    path = await download(file_id, to=to, timeout=timeout)
                finally:
                    download_s += time.perf_counter() - begun
                downloaded_bytes += path.stat().st_size
                return path

            api.download_file = timed_download  # type: ignore[method-assign,assignment]

            # 2. build + upload + create.
            sim_before, threads_before, cpu_before = _sim_cpu(base_url), _thread_cpu(), time.process_time()
            server_before = _server_cpu(url)
            started = time.perf_counter()
            with profiler.run("submit"):
                async with storage.ResultWriter(sessions, job_id=job_id, prices=prices) as writer:
                    outcome = await submit_prompts(sessions=sessions, clients=clients, writer=writer,
                                                   job_id=job_id, directory=directory)
            out["submit_s"] = time.perf_counter() - started
            out["submit_cpu_s"] = time.process_time() - cpu_before
            out["submit_server_cpu_s"] = _server_cpu(url) - server_before
            out["submit_threads_cpu_s"] = _group_threads(threads_before, _thread_cpu())
            out["submit_sim_cpu_s"] = _sim_cpu(base_url) - sim_before
            out["peak_rss_submit_mb"] = (_status_kb("VmHWM") or 0) / 1024  # since the reset after setup
            _reset_peak_rss()
            lines = min(count, distinct or count)
            expected_batches = math.ceil(lines / limits.max_requests)
            if len(outcome.batch_ids) != expected_batches or outcome.lines != lines or outcome.reused:
                raise SystemExit(f"submit: {len(outcome.batch_ids)} batches (expected {expected_batches}), "
                                 f"{outcome.lines} lines, {outcome.reused} reused, of {count} prompts")
            out["batches"] = len(outcome.batch_ids)
            out["input_bytes"] = sum(p.stat().st_size for p in (directory / job_id).glob("in-*.jsonl"))
            if submit_only:
                return out

            # 3. wait for the provider.
            started = time.perf_counter()
            records = []
            for batch_id in outcome.batch_ids:
                record = await storage.get_batch(sessions, batch_id=batch_id)
                assert record is not None
                while record.status not in TERMINAL_BATCH_STATUSES:
                    if time.perf_counter() - started > WAIT_TIMEOUT:
                        raise SystemExit(f"batch {batch_id} still {record.status} after {WAIT_TIMEOUT:.0f} s")
                    await asyncio.sleep(POLL_INTERVAL)
                    record = await poll_batch(sessions=sessions, clients=clients, record=record)
                if record.status != "completed":
                    raise SystemExit(f"batch {batch_id} ended {record.status}: {record.errors}")
                records.append(record)
            out["wait_s"] = time.perf_counter() - started

            # 4. ingest every batch.
            sim_before, threads_before, cpu_before = _sim_cpu(base_url), _thread_cpu(), time.process_time()
            succeeded = 0
            started = time.perf_counter()
            with profiler.run("ingest"):
                for record in records:
                    async with storage.ResultWriter(sessions, job_id=job_id, **writer_options) as writer:
                        got = await ingest_batch(sessions=sessions, clients=clients, writer=writer, record=record,
                                                 directory=directory, max_submissions=3)
                    succeeded += got.succeeded
            out["ingest_s"] = time.perf_counter() - started
            out["ingest_cpu_s"] = time.process_time() - cpu_before
            out["ingest_threads_cpu_s"] = _group_threads(threads_before, _thread_cpu())
            out["ingest_sim_cpu_s"] = _sim_cpu(base_url) - sim_before
            out["peak_rss_ingest_mb"] = (_status_kb("VmHWM") or 0) / 1024  # wait + ingest, when the reset works
            out["download_s"] = download_s
            out["output_bytes"] = downloaded_bytes
            out["ingested"] = succeeded

        counts = await storage.job_counts(sessions, job_id=job_id)
        if counts != {"succeeded": count} or succeeded != count:
            raise SystemExit(f"ingest: job counts {counts}, {succeeded} reported succeeded; expected {count} succeeded")
        out["output_files"] = [str(p) for p in sorted((directory / job_id).glob("batch-*-output.jsonl"))]
    finally:
        await engine.dispose()
        await _drop_database(url)
    # Since the reset after setup: submit, then (reset again) wait and ingest.
    out["peak_rss_phases_mb"] = max(out.get("peak_rss_submit_mb", 0.0), (_status_kb("VmHWM") or 0) / 1024)
    out["peak_rss_mb"] = max(out.get("peak_rss_setup_mb", 0.0), _ru_maxrss_mb(), out["peak_rss_phases_mb"])
    return out


# --- baselines (child process) ----------------------------------------------------------------


async def baselines(*, base_url: str, count: int, workdir: Path, run: int, output_files: list[str] | None,
                    ) -> dict[str, Any]:
    import aiohttp
    from sqlalchemy import bindparam, func, insert, select, update

    from llm_dispatch import storage
    from llm_dispatch.core import BatchLimits
    from llm_dispatch.storage import Prompt, Result
    from llm_dispatch.storage._models import utcnow

    out: dict[str, Any] = {}
    per_file = BatchLimits().max_requests
    url = await _database_url(workdir=workdir, name=f"baseline-{run}")
    engine = storage.create_engine(url)
    try:
        await storage.migrate(engine)
        sessions = storage.session_factory(engine)
        job_id = await storage.create_job(sessions, name="bench-baseline", fingerprint=f"{run:064d}",
                                          input_path=None, model=MODEL, settings={})
        await storage.add_prompts(sessions, job_id=job_id, prompts=_prompts(count))

        # Submit side: read the prompts back, write the JSONL, upload it and create its batch.
        submit_cpu = time.process_time()
        started = time.perf_counter()
        async with engine.connect() as connection:
            rows = (await connection.execute(
                select(Prompt.id, Prompt.model, Prompt.messages, Prompt.params)
                .where(Prompt.job_id == job_id).order_by(Prompt.position))).all()
        out["read_s"] = time.perf_counter() - started

        directory = workdir / f"baseline-{run}"
        directory.mkdir(parents=True, exist_ok=True)
        paths: list[Path] = []
        started = time.perf_counter()
        for start in range(0, len(rows), per_file):
            path = directory / f"in-{start // per_file:05d}.jsonl"
            with path.open("w", encoding="utf-8") as handle:
                for row in rows[start : start + per_file]:
                    body = {**row.params, "model": row.model, "messages": row.messages}
                    handle.write(json.dumps({"custom_id": f"p{row.id}", "method": "POST", "url": ENDPOINT,
                                             "body": body}) + "\n")
            paths.append(path)
        out["write_jsonl_s"] = time.perf_counter() - started
        del rows

        async def upload(session: aiohttp.ClientSession, path: Path) -> None:
            with path.open("rb") as handle:
                form = aiohttp.FormData()
                form.add_field("purpose", "batch")
                form.add_field("file", handle, filename=path.name, content_type="application/jsonl")
                async with session.post(f"{base_url}/files", data=form) as response:
                    response.raise_for_status()
                    file_id = (await response.json())["id"]
            # And the batch made of it, as the tool's submit does.
            create = {"input_file_id": file_id, "endpoint": ENDPOINT, "completion_window": "24h"}
            async with session.post(f"{base_url}/batches", json=create) as response:
                response.raise_for_status()
                await response.read()

        started = time.perf_counter()
        async with aiohttp.ClientSession() as session:
            await asyncio.gather(*(upload(session, path) for path in paths))
        out["upload_s"] = time.perf_counter() - started
        out["submit_cpu_s"] = time.process_time() - submit_cpu
        if output_files is None:  # --submit-only
            return out

        # Ingest side: parse the very output the batch path downloaded, insert the rows, settle the prompts.
        ingest_cpu = time.process_time()
        started = time.perf_counter()
        results: list[dict[str, Any]] = []
        for name in output_files:
            with open(name, "rb") as handle:
                for raw in handle:
                    record = json.loads(raw)
                    body = record["response"]["body"]
                    choice = body["choices"][0]
                    usage = body["usage"]
                    results.append({
                        "prompt_id": int(record["custom_id"][1:]), "job_id": job_id, "created_at": utcnow(),
                        "route": "batch", "status": "succeeded", "text": choice["message"]["content"],
                        "finish_reason": choice["finish_reason"], "prompt_tokens": usage["prompt_tokens"],
                        "completion_tokens": usage["completion_tokens"],
                        "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0),
                        "latency_ms": 0.0, "attempts": 1, "response_model": body["model"], "response_id": body["id"],
                        "http_status": 200, "error_class": None, "error_message": None,
                    })
        out["parse_s"] = time.perf_counter() - started
        if len(results) != count:
            raise SystemExit(f"baseline: {len(results)} output lines, expected {count}")

        started = time.perf_counter()
        async with engine.begin() as connection:
            await connection.execute(insert(Result.__table__), results)
        out["insert_s"] = time.perf_counter() - started

        table = Prompt.__table__
        settle = (update(table).where(table.c.id == bindparam("b_id"))
                  .values(status="succeeded", attempts=table.c.attempts + 1, updated_at=bindparam("b_now")))
        now = utcnow()
        started = time.perf_counter()
        async with engine.begin() as connection:
            await connection.execute(settle, [{"b_id": r["prompt_id"], "b_now": now} for r in results])
        out["update_s"] = time.perf_counter() - started
        out["ingest_cpu_s"] = time.process_time() - ingest_cpu
        async with engine.connect() as connection:
            done = (await connection.execute(
                select(func.count()).select_from(table).where(table.c.status == "succeeded"))).scalar_one()
        if done != count:
            raise SystemExit(f"baseline: {done} prompts settled, expected {count}")
    finally:
        await engine.dispose()
        await _drop_database(url)
    out["peak_rss_mb"] = _ru_maxrss_mb()
    return out


# --- orchestration ----------------------------------------------------------------------------


def child(args: argparse.Namespace) -> None:
    from llm_dispatch.flows._setup import tune_gc

    # As the flows running these steps do (wait-for-batches, collect-batches); the baselines get it too.
    tune_gc()
    workdir = Path(args.workdir)
    if args.child == "path":
        result = asyncio.run(batch_path(base_url=args.base_url, count=args.prompts, workdir=workdir, run=args.run,
                                        profile=Path(args.profile) if args.profile else None,
                                        flush_rows=args.flush_rows, distinct=args.distinct,
                                        provider=args.provider or "openai", py_spy=args.py_spy,
                                        submit_only=args.submit_only))
    else:
        result = asyncio.run(baselines(base_url=args.base_url, count=args.prompts, workdir=workdir, run=args.run,
                                       output_files=None if args.submit_only else json.loads(args.output_files)))
    print("RESULT " + json.dumps(result), flush=True)


def run_child(kind: str, *, base_url: str, count: int, workdir: Path, run: int, extra: list[str],
              tree: Path | None = None) -> dict[str, Any]:
    """One child process; ``tree``: under the interpreter that imports that tree's llm-dispatch (``--code``)."""
    python, added = tree_python(tree) if tree is not None else (sys.executable, {})
    env = {**os.environ, "PREFECT_LOGGING_LEVEL": "WARNING", **added}
    proc = subprocess.run(
        [python, __file__, "--child", kind, "--base-url", base_url, "--prompts", str(count),
         "--workdir", str(workdir), "--run", str(run), *extra],
        env=env, capture_output=True, text=True, cwd=workdir, timeout=CHILD_TIMEOUT,
    )
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise SystemExit(f"{kind} run {run} failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return json.loads(line.removeprefix("RESULT "))


def _simulator_peak_rss_mb() -> float | None:
    """VmHWM of our simulator child (found among this process's children)."""
    for task in Path("/proc/self/task").iterdir():
        try:
            children = task.joinpath("children").read_text().split()
        except OSError:
            continue
        for pid in children:
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"-m\0simulator\0" in cmdline:
                peak = _status_kb("VmHWM", pid)
                return peak / 1024 if peak is not None else None
    return None


def _print_profile(directory: Path, *, top: int = 30) -> None:
    for name in ("submit", "ingest"):
        if (directory / f"{name}.txt").exists():
            _print_stacks(directory / f"{name}.txt", top=top)
        path = directory / f"{name}.prof"
        if not path.exists():
            continue
        for key in ("tottime", "cumulative"):
            stream = io.StringIO()
            stats = pstats.Stats(str(path), stream=stream)
            stats.strip_dirs().sort_stats(key).print_stats(top)
            print(f"\n===== {name}: top {top} by {key} (event-loop thread only) =====")
            print("\n".join(stream.getvalue().splitlines()[4:]))


def summarise(runs: list[dict[str, Any]], *, count: int) -> dict[str, Any]:
    def med(values: list[float]) -> float:
        return statistics.median(values)

    path = [r["path"] for r in runs]
    base = [r["baseline"] for r in runs]
    target_submit, target_rows, target_rss = targets_for(count)
    rows_s = [p["ingested"] / p["ingest_s"] for p in path]
    submit_base = [b["read_s"] + b["write_jsonl_s"] + b["upload_s"] for b in base]
    ingest_base = [b["parse_s"] + b["insert_s"] + b["update_s"] for b in base]
    ratio = lambda xs, ys: [x / y for x, y in zip(xs, ys)]  # noqa: E731
    keys_path = ["record_s", "submit_s", "submit_cpu_s", "submit_sim_cpu_s", "wait_s", "ingest_s", "ingest_cpu_s",
                 "ingest_sim_cpu_s", "download_s"]
    keys_base = ["read_s", "write_jsonl_s", "upload_s", "parse_s", "insert_s", "update_s", "submit_cpu_s", "ingest_cpu_s"]
    summary = {
        "prompts": count,
        "repeats": len(runs),
        "cores": os.cpu_count(),
        "batches": path[0]["batches"],
        "input_mb": path[0]["input_bytes"] / 2**20,
        "output_mb": path[0]["output_bytes"] / 2**20,
        "median": {
            **{k: med([p[k] for p in path]) for k in keys_path},
            "ingest_rest_s": med([p["ingest_s"] - p["download_s"] for p in path]),
            "ingest_rows_per_s": med(rows_s),
            **{f"baseline_{k}": med([b[k] for b in base]) for k in keys_base},
            "baseline_submit_s": med(submit_base),
            "baseline_ingest_s": med(ingest_base),
            "baseline_ingest_rows_per_s": med([count / s for s in ingest_base]),
            "submit_vs_write_jsonl": med(ratio([p["submit_s"] for p in path], [b["write_jsonl_s"] for b in base])),
            "submit_vs_baseline": med(ratio([p["submit_s"] for p in path], submit_base)),
            "ingest_vs_insert": med(ratio([p["ingest_s"] for p in path], [b["insert_s"] for b in base])),
            "ingest_vs_baseline": med(ratio([p["ingest_s"] for p in path], ingest_base)),
        },
        "peak_rss_mb": max(p["peak_rss_mb"] for p in path),
        "peak_rss_phases_mb": max(p["peak_rss_phases_mb"] for p in path),
        "peak_rss_submit_mb": max(p.get("peak_rss_submit_mb", 0.0) for p in path),
        "peak_rss_ingest_mb": max(p.get("peak_rss_ingest_mb", 0.0) for p in path),
        "rss_after_setup_mb": max(p["rss_after_setup_mb"] for p in path),
        "baseline_peak_rss_mb": max(b["peak_rss_mb"] for b in base),
        "submit_threads_cpu_s": path[len(path) // 2]["submit_threads_cpu_s"],
        "ingest_threads_cpu_s": path[len(path) // 2]["ingest_threads_cpu_s"],
        "targets": {"submit_s": target_submit, "ingest_rows_per_s": target_rows, "peak_rss_mb": target_rss},
        "runs": [{k: v for k, v in r["path"].items() if k != "output_files"} | {"baseline": r["baseline"]} for r in runs],
    }
    m = summary["median"]
    summary["met"] = {
        "submit_s": m["submit_s"] <= target_submit,
        "ingest_rows_per_s": m["ingest_rows_per_s"] >= target_rows,
        "peak_rss_mb": summary["peak_rss_mb"] <= target_rss,
    }
    return summary


def print_table(summary: dict[str, Any]) -> None:
    m = summary["median"]
    t = summary["targets"]
    runs = summary["runs"]
    ok = lambda met: "ok" if met else "MISSED"  # noqa: E731
    each = lambda key: ", ".join(f"{r[key]:.2f}" for r in runs)  # noqa: E731
    print(f"\n{summary['prompts']:,} prompts -> {summary['batches']} batches ({summary['input_mb']:.1f} MB in, "
          f"{summary['output_mb']:.1f} MB out); medians of {summary['repeats']} runs, {summary['cores']} cores")
    print(f"  {'phase':<36}{'median':>12}  {'target':>14}  runs")
    print(f"  {'record prompts (setup)':<36}{m['record_s']:>10.2f} s  {'':>14}  {each('record_s')}")
    print(f"  {'build + upload + create':<36}{m['submit_s']:>10.2f} s  {'<= ' + format(t['submit_s'], 'g') + ' s':>10} {ok(summary['met']['submit_s']):>3}"
          f"  {each('submit_s')}")
    print(f"  {'  CPU: bench process / simulator':<36}{m['submit_cpu_s']:>10.2f} s  {'':>14}  "
          f"sim {m['submit_sim_cpu_s']:.2f} s; threads {summary['submit_threads_cpu_s']}")
    print(f"  {'wait for batches (poll)':<36}{m['wait_s']:>10.2f} s  {'':>14}  {each('wait_s')}")
    print(f"  {'ingest (download + store + settle)':<36}{m['ingest_s']:>10.2f} s  {'':>14}  {each('ingest_s')}")
    print(f"  {'  of which download':<36}{m['download_s']:>10.2f} s  {'':>14}  {each('download_s')}")
    print(f"  {'  of which parse + write + settle':<36}{m['ingest_rest_s']:>10.2f} s")
    print(f"  {'  CPU: bench process / simulator':<36}{m['ingest_cpu_s']:>10.2f} s  {'':>14}  "
          f"sim {m['ingest_sim_cpu_s']:.2f} s; threads {summary['ingest_threads_cpu_s']}")
    print(f"  {'ingest rate':<36}{m['ingest_rows_per_s']:>8,.0f} rows/s  {'>= ' + format(t['ingest_rows_per_s'], ',.0f'):>9} "
          f"{ok(summary['met']['ingest_rows_per_s']):>3}  "
          + ", ".join(f"{r['ingested'] / r['ingest_s']:,.0f}" for r in runs))
    print(f"  {'peak RSS, batch-path process':<36}{summary['peak_rss_mb']:>9.0f} MB  {'<= ' + format(t['peak_rss_mb'], 'g') + ' MB':>10} "
          f"{ok(summary['met']['peak_rss_mb']):>3}  (submit..ingest alone {summary['peak_rss_phases_mb']:.0f} MB: "
          f"submit {summary.get('peak_rss_submit_mb', 0):.0f}, wait + ingest {summary.get('peak_rss_ingest_mb', 0):.0f}; "
          f"after setup {summary['rss_after_setup_mb']:.0f} MB)")
    sim = summary.get("simulator_peak_rss_mb")
    if sim is not None:
        print(f"  {'peak RSS, simulator (own process)':<36}{sim:>9.0f} MB  (not counted)")
    print("\n  baselines (same bytes, same schema, medians)")
    print(f"    read prompts (Core SELECT)        {m['baseline_read_s']:8.2f} s")
    print(f"    write JSONL (json.dumps)          {m['baseline_write_jsonl_s']:8.2f} s   "
          f"submit / this = {m['submit_vs_write_jsonl']:.1f}x")
    print(f"    upload + create (raw aiohttp)     {m['baseline_upload_s']:8.2f} s")
    print(f"    read + write + upload + create    {m['baseline_submit_s']:8.2f} s   "
          f"submit / this = {m['submit_vs_baseline']:.2f}x; CPU {m['baseline_submit_cpu_s']:.2f} s "
          f"(submit's {m['submit_cpu_s']:.2f} s)")
    print(f"    parse output (json.loads)         {m['baseline_parse_s']:8.2f} s")
    print(f"    insert results (Core executemany) {m['baseline_insert_s']:8.2f} s   "
          f"ingest / this = {m['ingest_vs_insert']:.1f}x")
    print(f"    settle prompts (Core executemany) {m['baseline_update_s']:8.2f} s")
    print(f"    parse + insert + settle           {m['baseline_ingest_s']:8.2f} s   "
          f"= {m['baseline_ingest_rows_per_s']:,.0f} rows/s; ingest / this = {m['ingest_vs_baseline']:.2f}x; CPU "
          f"{m['baseline_ingest_cpu_s']:.2f} s (ingest's {m['ingest_cpu_s']:.2f} s)")
    print(f"  load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


def repeated_requests(args: argparse.Namespace, *, base_url: str, workdir: Path, extra: list[str]) -> None:
    """The batch path on a job whose prompts repeat: each identical request one line, its answer stored for each."""
    target_submit, target_rows, target_rss = targets_for(args.prompts)
    print(f"{args.prompts:,} prompts making {args.distinct:,} distinct requests, {args.repeats} runs, "
          f"{os.cpu_count()} cores", flush=True)
    runs = []
    for run in range(args.repeats):
        path = run_child("path", base_url=base_url, count=args.prompts, workdir=workdir, run=run, extra=extra)
        runs.append(path)
        print(f"  run {run + 1}: submit {path['submit_s']:.2f} s ({path['batches']} batches), ingest "
              f"{path['ingest_s']:.2f} s ({path['ingested'] / path['ingest_s']:,.0f} prompts settled/s), peak RSS "
              f"{path['peak_rss_mb']:.0f} MB (submit {path['peak_rss_submit_mb']:.0f}, ingest "
              f"{path['peak_rss_ingest_mb']:.0f})", flush=True)
        for suffix in ("", "-wal", "-shm"):
            workdir.joinpath(f"batch-{run}.db{suffix}").unlink(missing_ok=True)
    submit = statistics.median(r["submit_s"] for r in runs)
    rows = statistics.median(r["ingested"] / r["ingest_s"] for r in runs)
    rss = max(r["peak_rss_mb"] for r in runs)
    print(f"  median submit {submit:.2f} s (target <= {target_submit:g}), ingest {rows:,.0f} prompts/s (target >= "
          f"{target_rows:,.0f}), peak RSS {rss:.0f} MB (target <= {target_rss:g})")


def side_by_side(args: argparse.Namespace, *, base_url: str, workdir: Path, extra: list[str]) -> None:
    """The batch path of each provider in turn, every repeat (so load on the machine falls on each alike): medians of
    submit seconds, ingest rows/s and the child's peak RSS per provider."""
    providers = [name.strip() for name in args.providers.split(",") if name.strip()]
    print(f"{args.prompts:,} prompts per provider, {args.repeats} runs alternating {', '.join(providers)}, simulator "
          f"batch_processing_seconds {args.batch_seconds:g}, {os.cpu_count()} cores", flush=True)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in providers}
    for run in range(args.repeats):
        for index, provider in enumerate(providers):
            number = run * len(providers) + index
            path = run_child("path", base_url=base_url, count=args.prompts, workdir=workdir, run=number,
                             extra=[*extra, "--provider", provider])
            runs[provider].append(path)
            print(f"  run {run + 1} {provider}: submit {path['submit_s']:.2f} s ({path['batches']} batches, "
                  f"{path['input_bytes'] / 1e6:.1f} MB), ingest {path['ingest_s']:.2f} s "
                  f"({path['ingested'] / path['ingest_s']:,.0f} rows/s, download {path['download_s']:.2f} s), peak RSS "
                  f"{path['peak_rss_mb']:.0f} MB", flush=True)
            for suffix in ("", "-wal", "-shm"):
                workdir.joinpath(f"batch-{number}.db{suffix}").unlink(missing_ok=True)
    print(f"{'provider':<10} {'submit s':>9} {'ingest rows/s':>14} {'peak RSS MB':>12}")
    for provider, done in runs.items():
        print(f"{provider:<10} {statistics.median(r['submit_s'] for r in done):>9.2f} "
              f"{statistics.median(r['ingested'] / r['ingest_s'] for r in done):>14,.0f} "
              f"{statistics.median(r['peak_rss_mb'] for r in done):>12.0f}")


def submit_comparison(args: argparse.Namespace, *, base_url: str, workdir: Path, extra: list[str]) -> None:
    """Submit alone (build + upload + create; no wait, no ingest) of each tree (``--code``, or this one), then the
    plain script's read + write + upload + create, every repeat in turn: medians of wall and CPU seconds (the
    process's, and the PostgreSQL server's backends' for its database) and each tree's ratio to the script."""
    trees = ({label: Path(path).resolve() for label, path in (item.split("=", 1) for item in args.code)}
             if args.code else {"this": ROOT})
    backend = "PostgreSQL" if args.postgres else "SQLite"
    print(f"submit of {args.prompts:,} prompts on {backend}, {args.repeats} runs alternating "
          f"{', '.join(trees)}, plain script; {os.cpu_count()} cores", flush=True)
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label in [*trees, "plain"]}
    number = 0
    for run in range(args.repeats):
        for label, tree in trees.items():
            path = run_child("path", base_url=base_url, count=args.prompts, workdir=workdir, run=number,
                             extra=[*extra, "--submit-only"], tree=tree)
            runs[label].append({"wall": path["submit_s"], "cpu": path["submit_cpu_s"],
                                "server": path.get("submit_server_cpu_s", 0.0)})
            number += 1
        base = run_child("baseline", base_url=base_url, count=args.prompts, workdir=workdir, run=number,
                         extra=["--submit-only"])
        number += 1
        runs["plain"].append({"wall": base["read_s"] + base["write_jsonl_s"] + base["upload_s"],
                              "cpu": base["submit_cpu_s"], "server": 0.0})
        print(f"  run {run + 1}: " + "; ".join(
            f"{label} {done[-1]['wall']:.2f} s (CPU {done[-1]['cpu']:.2f} s, server {done[-1]['server']:.2f} s)"
            for label, done in runs.items()) + f"; load {os.getloadavg()[0]:.1f}", flush=True)
        for name in workdir.glob("*.db*"):
            name.unlink(missing_ok=True)
    med = {label: {k: statistics.median(r[k] for r in done) for k in ("wall", "cpu", "server")}
           for label, done in runs.items()}
    plain = med["plain"]
    print(f"  {'':<8}{'wall s':>9}{'CPU s':>9}{'server s':>10}{'wall / plain':>14}{'CPU+server / plain':>20}")
    for label, m in med.items():
        print(f"  {label:<8}{m['wall']:>9.2f}{m['cpu']:>9.2f}{m['server']:>10.2f}{m['wall'] / plain['wall']:>13.2f}x"
              f"{(m['cpu'] + m['server']) / plain['cpu']:>19.2f}x")
    print(f"  target: within 1.5x of the plain script; load average at the end: "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-seconds", type=float, default=1.5, help="the simulator's batch_processing_seconds")
    parser.add_argument("--json", nargs="?", const="-", metavar="PATH", help="also write the figures as JSON (- = stdout)")
    parser.add_argument("--profile", metavar="DIR", help="cProfile the timed phases of one batch-path run instead")
    parser.add_argument("--py-spy", action="store_true",
                        help="with --profile: sample every thread with py-spy (installed in this venv) instead")
    parser.add_argument("--flush-rows", type=int, metavar="N",
                        help="ResultWriter flush_rows for the ingest (default: the writer's own default)")
    parser.add_argument("--postgres", metavar="URL",
                        help="each run's database on this PostgreSQL server (made anew per run) instead of SQLite")
    parser.add_argument("--distinct", type=int, metavar="N",
                        help="N distinct requests, each made by prompts/N prompts (the batch path alone, no baselines)")
    parser.add_argument("--providers", metavar="A,B",
                        help="the batch path per provider (openai, gemini), alternating each repeat; no baselines")
    parser.add_argument("--submit-only", action="store_true",
                        help="time the submit alone against the plain script's (no wait, no ingest)")
    parser.add_argument("--code", action="append", metavar="LABEL=DIR",
                        help="with --submit-only: the submit of each tree's llm_dispatch (its .venv), alternating")
    parser.add_argument("--provider", help=argparse.SUPPRESS)
    parser.add_argument("--child", choices=["path", "baseline"], help=argparse.SUPPRESS)
    parser.add_argument("--base-url", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    parser.add_argument("--run", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--output-files", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.postgres:
        os.environ["BENCH_POSTGRES"] = args.postgres  # the children's databases
    if args.child:
        child(args)
        return

    from llm_dispatch.simulator import Simulator, SimulatorConfig

    config = SimulatorConfig(batch_processing_seconds=args.batch_seconds)
    with tempfile.TemporaryDirectory(prefix="bench-batch-") as tmp, Simulator.in_process(config) as base_url:
        workdir = Path(tmp)
        path_extra = [] if args.flush_rows is None else ["--flush-rows", str(args.flush_rows)]
        if args.providers:
            side_by_side(args, base_url=base_url, workdir=workdir, extra=path_extra)
            return
        if args.submit_only:
            submit_comparison(args, base_url=base_url, workdir=workdir, extra=path_extra)
            return
        if args.distinct:
            repeated_requests(args, base_url=base_url, workdir=workdir, extra=[*path_extra, "--distinct", str(args.distinct)])
            return
        if args.profile:
            profile = Path(args.profile).resolve()
            result = run_child("path", base_url=base_url, count=args.prompts, workdir=workdir, run=0,
                               extra=["--profile", str(profile), *(["--py-spy"] if args.py_spy else []),
                                      *path_extra])
            print(json.dumps({k: v for k, v in result.items() if k != "output_files"}, indent=1))
            _print_profile(profile)
            return
        print(f"{args.prompts:,} prompts, {args.repeats} runs, simulator batch_processing_seconds "
              f"{args.batch_seconds:g}, {os.cpu_count()} cores", flush=True)
        runs: list[dict[str, Any]] = []
        for run in range(args.repeats):
            path = run_child("path", base_url=base_url, count=args.prompts, workdir=workdir, run=run, extra=path_extra)
            base = run_child("baseline", base_url=base_url, count=args.prompts, workdir=workdir, run=run,
                             extra=["--output-files", json.dumps(path["output_files"])])
            runs.append({"path": path, "baseline": base})
            print(f"  run {run + 1}: submit {path['submit_s']:.2f} s (CPU {path['submit_cpu_s']:.2f} s), ingest "
                  f"{path['ingest_s']:.2f} s ({path['ingested'] / path['ingest_s']:,.0f} rows/s, CPU "
                  f"{path['ingest_cpu_s']:.2f} s, download {path['download_s']:.2f} s), peak RSS "
                  f"{path['peak_rss_mb']:.0f} MB; baseline submit "
                  f"{base['read_s'] + base['write_jsonl_s'] + base['upload_s']:.2f} s (CPU {base['submit_cpu_s']:.2f} s), "
                  f"ingest {base['parse_s'] + base['insert_s'] + base['update_s']:.2f} s (CPU "
                  f"{base['ingest_cpu_s']:.2f} s); load {os.getloadavg()[0]:.1f}", flush=True)
            for name in (f"batch-{run}.db", f"baseline-{run}.db"):  # keep the temp dir small
                for suffix in ("", "-wal", "-shm"):
                    workdir.joinpath(name + suffix).unlink(missing_ok=True)
        summary = summarise(runs, count=args.prompts)
        summary["simulator_peak_rss_mb"] = _simulator_peak_rss_mb()
        summary["ingest_flush_rows"] = args.flush_rows or "default"
    print_table(summary)
    if args.json:
        text = json.dumps(summary, indent=1)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text + "\n")
    missed = [k for k, v in summary["met"].items() if not v]
    if missed:
        print(f"\ntargets missed: {', '.join(missed)} (run with --profile DIR to see where the time goes)")


if __name__ == "__main__":
    main()
