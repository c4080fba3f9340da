"""Benchmark: how soon the ``dispatch`` flow sends the first request of a large mixed job, and what the whole run
costs: half the prompts urgent (real-time), half bulk (the Batch API, submitted without waiting).

Each tree's run is a fresh child process (its own interpreter: ``bench/_child.py``'s ``tree_python``), the trees
alternating, repeated; the simulator runs in this process. The child times the flow call from its start to the
first chat request (``LLMClient.chat`` stamped, nothing else changed) and to its end, and reports its whole-process
CPU seconds (every thread, imports included).

    PREFECT_API_URL=... python bench/dispatch_start.py [--prompts 100000] [--concurrency 400] [--repeat 2] \\
        [--trees /work/main /work/wt-x]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path

from _child import report, run_measured, tree_python  # bench/ is the script's folder, first on sys.path

ROOT = Path(__file__).resolve().parent.parent
MODEL = "gpt-4o-mini"


def make_mixed(path: Path, count: int) -> None:
    with path.open("w", encoding="utf-8") as handle:
        for i in range(count):
            handle.write(json.dumps({"id": i, "prompt": f"Benchmark question number {i}: what is {i} squared?",
                                     "model": MODEL, "params": {"max_tokens": 64},
                                     "urgency": "urgent" if i % 2 else "bulk"}) + "\n")


async def child_run(*, base_url: str, prompts: str, concurrency: int, db: str) -> dict[str, float]:
    import logging

    from prefect import flow as prefect_flow
    from pydantic import SecretStr

    from llm_dispatch.core.http._client import LLMClient
    from llm_dispatch.flows.dispatch import dispatch

    logging.getLogger("prefect").setLevel(logging.WARNING)
    first: list[float] = []
    chat = LLMClient.chat

    async def stamped(self: LLMClient, *args: object, **kwargs: object) -> object:
        if not first:
            first.append(time.perf_counter())
        return await chat(self, *args, **kwargs)  # type: ignore[arg-type]

    LLMClient.chat = stamped  # type: ignore[method-assign]

    @prefect_flow(name="bench-warm-up")
    async def warm_up(note: str) -> None:
        return None

    await warm_up(note="warm")
    started = time.perf_counter()
    summary = await dispatch(prompts=prompts, base_url=base_url, database_url=SecretStr(db), concurrency=concurrency)
    elapsed = time.perf_counter() - started
    return {"seconds": elapsed, "first_request_s": first[0] - started if first else float("nan"),
            "succeeded": summary.report.counts.get("succeeded", 0), "batched": summary.report.counts.get("batched", 0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=100_000)
    parser.add_argument("--concurrency", type=int, default=400)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--trees", nargs="+", type=Path, default=[ROOT])
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--base-url")
    parser.add_argument("--prompts-file")
    parser.add_argument("--c", type=int)
    parser.add_argument("--db")
    args = parser.parse_args()
    if args.child:
        result = asyncio.run(child_run(base_url=args.base_url, prompts=args.prompts_file, concurrency=args.c,
                                       db=args.db))
        usage = resource.getrusage(resource.RUSAGE_SELF)
        result["cpu_seconds"] = usage.ru_utime + usage.ru_stime
        result["peak_rss_mb"] = usage.ru_maxrss / 1024
        report(result)
        return

    from llm_dispatch.simulator import Simulator, SimulatorConfig

    with tempfile.TemporaryDirectory(prefix="bench-dispatch-") as tmp, \
            Simulator.in_process(SimulatorConfig(latency=args.latency)) as base_url:
        workdir = Path(tmp)
        prompts = workdir / "mixed.jsonl"
        make_mixed(prompts, args.prompts)
        print(f"{args.prompts} prompts (half urgent, half bulk), simulator latency {args.latency * 1000:.0f} ms, "
              f"concurrency {args.concurrency}, {args.repeat} runs per tree, {os.cpu_count()} cores")
        results: dict[Path, list[dict[str, float]]] = {tree: [] for tree in args.trees}
        for run in range(args.repeat):
            for number, tree in enumerate(args.trees):
                python, extra = tree_python(tree)
                db = f"sqlite+aiosqlite:///{workdir / f'dispatch-{number}-{run}.db'}"
                env = {**os.environ, **extra, "PREFECT_LOGGING_LEVEL": "WARNING"}
                argv = [__file__, "--child", "--base-url", base_url, "--prompts-file", str(prompts),
                        "--c", str(args.concurrency), "--db", db]
                found = run_measured(argv, env=env, what=f"{tree} run", cwd=workdir, python=python, timeout=3600)
                print(f"  {tree}: run {run + 1}: first request {found['first_request_s']:.2f} s, whole flow "
                      f"{found['seconds']:.1f} s, CPU {found['cpu_seconds']:.1f} s, {found['succeeded']:.0f} answered, "
                      f"{found['batched']:.0f} batched, load {os.getloadavg()[0]:.1f}", flush=True)
                results[tree].append(found)
        for tree, runs in results.items():
            print(f"{tree}: median first request {statistics.median(r['first_request_s'] for r in runs):.2f} s, "
                  f"flow {statistics.median(r['seconds'] for r in runs):.1f} s, "
                  f"CPU {statistics.median(r['cpu_seconds'] for r in runs):.1f} s, "
                  f"peak RSS {max(r['peak_rss_mb'] for r in runs):.0f} MB")


if __name__ == "__main__":
    main()
