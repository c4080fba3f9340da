"""Benchmark: the HTTP client alone (no Prefect, no database) vs plain aiohttp + Semaphore.

N chat requests (default 10,000) at concurrency 400 against the bundled simulator in its own process.
Each variant runs in a fresh child process, the variants alternating, repeated; it reports medians of
wall time and of the child's CPU seconds per 10,000 requests (the send loop only: imports, start-up
and a warm-up round are outside the clock), each as a ratio to the baseline run beside it, and the
client's CPU beyond aiohttp's own (client minus baseline).

    python bench/client.py [--requests 10000] [--concurrency 400] [--latency 0.2] [--repeat 5]

``--code LABEL=DIR`` (repeatable) benchmarks the ``llm_dispatch`` found in DIR, so an older tree can
be measured in the same session, for example:

    git worktree add /tmp/client-old c46dcca
    python bench/client.py --code old=/tmp/client-old --code new=.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

try:
    from llm_dispatch.core import ChatRequest, LLMClient
except ImportError:  # a tree from before one import root, on PYTHONPATH (see _child.tree_python)
    from llm_dispatch import ChatRequest, LLMClient  # type: ignore[attr-defined,no-redef]

from _child import report, run_measured, tree_python  # bench/ is the script's folder, first on sys.path

PER = 10_000  # CPU and wall time are reported per this many requests
WARM_UP = 500


def requests(count: int) -> list[ChatRequest]:
    return [
        ChatRequest(model="gpt-4o-mini", messages=[{"role": "user", "content": f"Benchmark question {i}: what is {i} squared?"}],
                    params={"max_tokens": 64})
        for i in range(count)
    ]


async def run_baseline(*, base_url: str, count: int, concurrency: int) -> tuple[float, float]:
    import aiohttp

    url = f"{base_url}/chat/completions"
    headers = {"Authorization": "Bearer sk-bench"}
    semaphore = asyncio.Semaphore(concurrency)

    async def one(session: aiohttp.ClientSession, request: ChatRequest) -> None:
        async with semaphore, session.post(url, json=request.body(), headers=headers) as response:
            body = await response.json()
            assert body["choices"][0]["message"]["content"]

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:
        await asyncio.gather(*(one(session, r) for r in requests(WARM_UP)))
        batch = requests(count)
        return await _timed(asyncio.gather(*(one(session, r) for r in batch)))


async def run_client(*, base_url: str, count: int, concurrency: int) -> tuple[float, float]:
    async with LLMClient(base_url=base_url, api_key="sk-bench", concurrency=concurrency) as client:
        await asyncio.gather(*(client.chat(r) for r in requests(WARM_UP)))
        batch = requests(count)
        return await _timed(asyncio.gather(*(client.chat(r) for r in batch)))


async def _timed(work: asyncio.Future[object]) -> tuple[float, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    await work
    return time.perf_counter() - wall, time.process_time() - cpu


def child(args: argparse.Namespace) -> None:
    run = run_baseline if args.child == "baseline" else run_client
    wall, cpu = asyncio.run(run(base_url=args.base_url, count=args.requests, concurrency=args.concurrency))
    report({"wall": wall * PER / args.requests, "cpu": cpu * PER / args.requests})


def run_child(kind: str, code: Path, *, base_url: str, args: argparse.Namespace) -> dict[str, float]:
    python, extra = tree_python(code)
    argv = [__file__, "--child", kind, "--base-url", base_url, "--requests", str(args.requests),
            "--concurrency", str(args.concurrency)]
    return run_measured(argv, env={**os.environ, **extra}, what=f"{kind} ({code})", python=python)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=400)
    parser.add_argument("--latency", type=float, default=0.2, help="simulated latency, seconds")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--code", action="append", metavar="LABEL=DIR",
                        help="a tree whose llm_dispatch to benchmark (default: client=this checkout)")
    parser.add_argument("--child", choices=["baseline", "client"])
    parser.add_argument("--base-url")
    args = parser.parse_args()
    if args.child:
        child(args)
        return

    # Here, not at the top: a child measuring an older tree imports that tree's llm_dispatch, which this
    # checkout's simulator may no longer work with.
    from llm_dispatch.simulator import Simulator, SimulatorConfig

    trees = dict(item.split("=", 1) for item in args.code) if args.code else {"client": str(ROOT)}
    variants = [("baseline", "baseline", ROOT)] + [(label, "client", Path(d).resolve()) for label, d in trees.items()]
    results: dict[str, list[dict[str, float]]] = {label: [] for label, _, _ in variants}
    with Simulator.in_process(SimulatorConfig(latency=args.latency)) as base_url:
        print(f"{args.requests} requests, concurrency {args.concurrency}, simulator latency {args.latency * 1000:.0f} ms "
              f"(ideal {args.concurrency / args.latency:.0f} req/s), {args.repeat} runs each, {os.cpu_count()} cores")
        for run in range(args.repeat):
            for label, kind, code in variants:
                results[label].append(run_child(kind, code, base_url=base_url, args=args))
            print(f"  run {run + 1}: " + ", ".join(
                f"{label} {r[-1]['wall']:.2f} s wall / {r[-1]['cpu']:.2f} s CPU" for label, r in results.items()),
                flush=True)

    base = results["baseline"]
    print(f"\nper {PER:,} requests (medians of {args.repeat} runs; ratios paired with the baseline run beside them)")
    print(f"  {'variant':<10} {'wall s':>7} {'CPU s':>7} {'wall/base':>10} {'CPU/base':>9} {'CPU beyond aiohttp s':>21}")
    for label, runs in results.items():
        wall = statistics.median(r["wall"] for r in runs)
        cpu = statistics.median(r["cpu"] for r in runs)
        wall_ratio = statistics.median(r["wall"] / b["wall"] for r, b in zip(runs, base))
        cpu_ratio = statistics.median(r["cpu"] / b["cpu"] for r, b in zip(runs, base))
        beyond = statistics.median(r["cpu"] - b["cpu"] for r, b in zip(runs, base))
        print(f"  {label:<10} {wall:7.2f} {cpu:7.2f} {wall_ratio:9.3f}x {cpu_ratio:8.3f}x {beyond:21.2f}")


if __name__ == "__main__":
    main()
