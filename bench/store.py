"""Benchmark: storing a batch's answers alone (``storage.store_batch_answers``: rows built, inserted, prompts settled).

N answers (default 50,000) stored in slices of 5,000, as the ingest stores them, into a fresh SQLite file whose
prompts are recorded and batched first; only the store is timed. No download, no parsing, no simulator:
the CPU of the result rows and their settle, by thread. Each variant runs in a fresh child process, the
variants alternating, repeated; medians of process CPU seconds (and of the event-loop and other threads'),
each as a ratio to the first variant's run beside it.

    python bench/store.py [--answers 50000] [--repeat 3] [--code LABEL=DIR ...] [--postgres SERVER_URL]

``--postgres postgresql+asyncpg://user@host:5432/postgres`` stores into a database made anew on that server for each
run; the server's backends' CPU (read from /proc: the server must run on this machine) is added to the process's.

``--code LABEL=DIR`` (repeatable) measures the ``storage`` and ``llm_dispatch`` found in DIR, so an older tree
can be measured in the same session (the first one given is the baseline of the ratios), for example:

    git worktree add /tmp/client-old c46dcca
    python bench/store.py --code old=/tmp/client-old --code new=.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

from _child import processes_cpu, report, run_measured, tree_python  # bench/ is the script's folder, first on sys.path

MODEL = "gpt-4o-mini"
SLICE = 5_000  # jobs._collect.STORE_SLICE


def _thread_cpu() -> tuple[float, float]:
    """CPU seconds of the main thread and of all the others (aiosqlite's connection thread)."""
    tick = os.sysconf("SC_CLK_TCK")
    main_id = threading.main_thread().native_id
    main = others = 0.0
    for task in Path("/proc/self/task").iterdir():
        fields = task.joinpath("stat").read_text().rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / tick
        if int(task.name) == main_id:
            main += cpu
        else:
            others += cpu
    return main, others


async def store(count: int) -> dict[str, float]:
    from llm_dispatch import storage
    from llm_dispatch.flows._setup import tune_gc
    from llm_dispatch.core import ChatResult
    from llm_dispatch.core._types import dedupe_key  # older trees do not export it

    tune_gc()  # as the flow that ingests does
    server = os.environ.get("BENCH_POSTGRES")
    url = f"sqlite+aiosqlite:///{tempfile.mkdtemp()}/store.db" if not server else await _fresh_postgres(server)
    engine = storage.create_engine(url)
    try:
        await storage.migrate(engine)
        sessions = storage.session_factory(engine)
        job_id = await storage.create_job(sessions, name="bench-store", fingerprint="0" * 64, input_path=None,
                                          model=MODEL, settings={})

        def prompts() -> Any:
            for i in range(count):
                messages = [{"role": "user", "content": f"Benchmark question number {i}"}]
                yield storage.NewPrompt(custom_id=f"c-{i}", position=i, model=MODEL, messages=messages, params={},
                                        dedupe_key=dedupe_key(model=MODEL, messages=messages, params={}),
                                        planned_route="batch", route_reason="bench")

        await storage.add_prompts(sessions, job_id=job_id, prompts=prompts())
        ids = await storage.unfinished_prompt_ids(sessions, job_id=job_id, planned_route="batch")
        await storage.create_batch_record(sessions, job_id=job_id, model=MODEL, members=[(p, f"c{p}") for p in ids],
                                          file_path=None)
        answers = [
            ([pid], ChatResult(text=f"The answer to question {i}.", finish_reason="stop", prompt_tokens=20 + i % 7,
                               completion_tokens=30 + i % 40, cached_tokens=0, model="gpt-4o-mini-2024-07-18",
                               response_id=f"chatcmpl-{i}", latency_s=0.0))
            for i, pid in enumerate(ids)
        ]
        # Priced as the flows price (a tree from before the cost ledger takes neither argument).
        priced: dict[str, Any] = {}
        parameters = inspect.signature(storage.store_batch_answers).parameters
        if "prices" in parameters:
            from llm_dispatch.core import PriceTable

            priced = {"model": MODEL, "prices": PriceTable.load()}
        elif "pricer" in parameters:  # a tree from before the one price formula
            from llm_dispatch.core import PriceTable, RowPricer  # type: ignore[attr-defined]

            priced = {"model": MODEL, "pricer": RowPricer(PriceTable.load())}

        server_before = await _server_cpu(engine) if server else 0.0
        main_before, others_before = _thread_cpu()
        cpu, wall = time.process_time(), time.perf_counter()
        for start in range(0, count, SLICE):
            await storage.store_batch_answers(sessions, job_id=job_id, answers=answers[start:start + SLICE],
                                              latency_s=60.0, **priced)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        main_after, others_after = _thread_cpu()
        server_cpu = await _server_cpu(engine) - server_before if server else 0.0
        counts = await storage.job_counts(sessions, job_id=job_id)
        if counts != {"succeeded": count}:
            raise SystemExit(f"stored {counts}, expected {count} succeeded")
    finally:
        await engine.dispose()
    return {"cpu": cpu, "main": main_after - main_before, "others": others_after - others_before, "wall": wall,
            "server": server_cpu}


async def _fresh_postgres(server: str) -> str:
    """A database made anew on the PostgreSQL server at ``server`` (``--postgres``)."""
    import asyncpg
    from sqlalchemy.engine import make_url

    admin = await asyncpg.connect(server.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        await admin.execute('DROP DATABASE IF EXISTS "bench_store"')
        await admin.execute('CREATE DATABASE "bench_store"')
    finally:
        await admin.close()
    return make_url(server).set(database="bench_store").render_as_string(hide_password=False)


async def _server_cpu(engine: Any) -> float:
    """CPU seconds of the PostgreSQL backends serving the bench's database (same machine: read from /proc)."""
    from sqlalchemy import text

    async with engine.connect() as conn:
        pids = (await conn.execute(text("SELECT pid FROM pg_stat_activity WHERE datname = current_database()"))).scalars()
        return processes_cpu(pids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--answers", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--code", action="append", metavar="LABEL=DIR",
                        help="a tree whose storage to benchmark (default: store=this checkout)")
    parser.add_argument("--postgres", metavar="URL",
                        help="store into a database made anew on this PostgreSQL server (its backends' CPU measured too)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.postgres:
        os.environ["BENCH_POSTGRES"] = args.postgres
    if args.child:
        report(asyncio.run(store(args.answers)))
        return

    trees = dict(item.split("=", 1) for item in args.code) if args.code else {"store": str(ROOT)}
    results: dict[str, list[dict[str, float]]] = {label: [] for label in trees}
    print(f"{args.answers:,} answers in slices of {SLICE:,}, {args.repeat} runs each, {os.cpu_count()} cores")
    for run in range(args.repeat):
        for label, directory in trees.items():
            code = str(Path(directory).resolve())
            python, extra = tree_python(Path(code))
            argv = [__file__, "--child", "--answers", str(args.answers)]
            results[label].append(run_measured(argv, env={**os.environ, **extra}, what=f"{label} ({code})",
                                               cwd=Path(code), python=python))
        print(f"  run {run + 1}: " + ", ".join(
            f"{label} {r[-1]['cpu']:.2f} s CPU (main {r[-1]['main']:.2f}, server {r[-1].get('server', 0):.2f}, wall "
            f"{r[-1]['wall']:.2f} s)" for label, r in results.items()), flush=True)

    base = next(iter(results.values()))
    print(f"\nmedians of {args.repeat} runs; ratios paired with the first variant's run beside them")
    print(f"  {'variant':<10} {'CPU s':>7} {'main s':>7} {'others s':>9} {'server s':>9} {'rows/CPU-s':>11} "
          f"{'CPU/first':>10} {'wall s':>7} {'rows/s':>8}")
    for label, runs in results.items():
        # The bench process's CPU and, on PostgreSQL, its server backends' (what the database did for it).
        cpu = statistics.median(r["cpu"] + r.get("server", 0.0) for r in runs)
        ratio = statistics.median((r["cpu"] + r.get("server", 0.0)) / (b["cpu"] + b.get("server", 0.0))
                                  for r, b in zip(runs, base))
        wall = statistics.median(r["wall"] for r in runs)
        print(f"  {label:<10} {cpu:7.2f} {statistics.median(r['main'] for r in runs):7.2f} "
              f"{statistics.median(r['others'] for r in runs):9.2f} "
              f"{statistics.median(r.get('server', 0.0) for r in runs):9.2f} {args.answers / cpu:11,.0f} {ratio:9.3f}x "
              f"{wall:7.2f} {args.answers / wall:8,.0f}")


if __name__ == "__main__":
    main()
