"""Benchmark: storing a batch's answers alone (``storage.store_batch_answers``: rows built, inserted, prompts settled).

N answers (default 50,000) stored in slices of 5,000, as the ingest stores them, into a fresh SQLite file whose
prompts are recorded and batched first; only the store is timed. No download, no parsing, no simulator:
the CPU of the result rows and their settle, by thread. Each variant runs in a fresh child process, the
variants alternating, repeated; medians of process CPU seconds (and of the event-loop and other threads'),
each as a ratio to the first variant's run beside it.

    python bench/store.py [--answers 50000] [--repeat 3] [--code LABEL=DIR ...]

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

from _child import report, run_measured, tree_python  # bench/ is the script's folder, first on sys.path

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
    engine = storage.create_engine(f"sqlite+aiosqlite:///{tempfile.mkdtemp()}/store.db")
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

        main_before, others_before = _thread_cpu()
        cpu, wall = time.process_time(), time.perf_counter()
        for start in range(0, count, SLICE):
            await storage.store_batch_answers(sessions, job_id=job_id, answers=answers[start:start + SLICE],
                                              latency_s=60.0, **priced)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        main_after, others_after = _thread_cpu()
        counts = await storage.job_counts(sessions, job_id=job_id)
        if counts != {"succeeded": count}:
            raise SystemExit(f"stored {counts}, expected {count} succeeded")
    finally:
        await engine.dispose()
    return {"cpu": cpu, "main": main_after - main_before, "others": others_after - others_before, "wall": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--answers", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--code", action="append", metavar="LABEL=DIR",
                        help="a tree whose storage to benchmark (default: store=this checkout)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
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
            f"{label} {r[-1]['cpu']:.2f} s CPU (main {r[-1]['main']:.2f})" for label, r in results.items()), flush=True)

    base = next(iter(results.values()))
    print(f"\nmedians of {args.repeat} runs; ratios paired with the first variant's run beside them")
    print(f"  {'variant':<10} {'CPU s':>7} {'main s':>7} {'others s':>9} {'rows/CPU-s':>11} {'CPU/first':>10}")
    for label, runs in results.items():
        cpu = statistics.median(r["cpu"] for r in runs)
        ratio = statistics.median(r["cpu"] / b["cpu"] for r, b in zip(runs, base))
        print(f"  {label:<10} {cpu:7.2f} {statistics.median(r['main'] for r in runs):7.2f} "
              f"{statistics.median(r['others'] for r in runs):9.2f} {args.answers / cpu:11,.0f} {ratio:9.3f}x")


if __name__ == "__main__":
    main()
