"""Benchmark: the realtime-dispatch flow end to end vs a plain aiohttp baseline (``concurrency`` workers).

10,000 prompts against the simulator (its own process) at 200 ms latency, concurrency 100 and 400.
Each variant runs in a fresh child process, alternating, repeated; medians are reported.

    python bench/realtime.py [--prompts 10000] [--latency 0.2] [--concurrency 100 400] [--repeat 3] [--record-first]
                             [--timeout 900]

``--record-first`` stores a new job whole before its first request (the flow otherwise sends its
first chunks while the rest is stored): how much sending while recording is worth.

The flow's time covers the whole flow call (Prefect creating the flow run, validating and recording the
prompts, planning, sending, persisting every result, the summary); process start-up (imports, and
Prefect's API: an ephemeral server takes ~10 s) is warmed up before the clock starts, as in a
process that has run a flow before. Besides the ratios it prints the flow's phases and each variant's
whole-process CPU seconds (every thread, imports included: ``getrusage``), and their ratio run by run.

The children inherit ``PREFECT_API_URL``: to measure against a running server on PostgreSQL (as the
README recommends; its SQLite-backed ephemeral server answers some writes 503 under load, and Prefect's
client backs off ~2 s each time), start one and point the bench at it:

    PREFECT_API_DATABASE_CONNECTION_URL=postgresql+asyncpg://postgres@127.0.0.1:5432/prefect_rtbench \
        prefect server start --host 127.0.0.1 --port 4299 &
    PREFECT_API_URL=http://127.0.0.1:4299/api python bench/realtime.py
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
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from _child import report, run_measured  # bench/ is the script's folder, first on sys.path

ROOT = Path(__file__).resolve().parent.parent


# The model of every benchmark's prompts and of the baselines' requests alike: a chat model without reasoning, so
# the flow is measured doing the baseline's work (the default model, a reasoning one, would spend the 64 tokens
# thinking and store every answer as truncated).
MODEL = "gpt-4o-mini"


def make_prompts(path: Path, count: int) -> None:
    with path.open("w", encoding="utf-8") as handle:
        for i in range(count):
            handle.write(json.dumps({"id": i, "prompt": f"Benchmark question number {i}: what is {i} squared?",
                                     "model": MODEL, "params": {"max_tokens": 64}}) + "\n")


@contextmanager
def prompts_workdir(count: int, *, prefix: str) -> Iterator[tuple[Path, Path]]:
    """A scratch folder (the runs' databases go there too) and COUNT benchmark prompts written in it."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        workdir = Path(tmp)
        prompts = workdir / "prompts.jsonl"
        make_prompts(prompts, count)
        yield workdir, prompts


def add_child_arguments(parser: argparse.ArgumentParser, *, kinds: Sequence[str]) -> None:
    """The flags by which a parent has a child run one kind of flow over a prompts file (``child_argv``)."""
    parser.add_argument("--child", choices=kinds)
    parser.add_argument("--base-url")
    parser.add_argument("--prompts-file")
    parser.add_argument("--c", type=int)
    parser.add_argument("--db")


def child_argv(script: str, kind: str, *, base_url: str, prompts: Path, concurrency: int, db: str) -> list[str]:
    """``script``'s arguments for a child that runs ``kind`` (read by ``add_child_arguments``' flags)."""
    return [script, "--child", kind, "--base-url", base_url, "--prompts-file", str(prompts), "--c", str(concurrency),
            "--db", db]


async def baseline(*, base_url: str, prompts: Path, concurrency: int) -> dict[str, float]:
    import aiohttp

    bodies = [{"model": MODEL, "messages": [{"role": "user", "content": json.loads(line)["prompt"]}], "max_tokens": 64}
              for line in prompts.read_text().splitlines()]
    ok = 0

    # ``concurrency`` workers taking the next body in turn: a task per prompt behind a semaphore does not hold at
    # 1,000,000 (the first round of a million task steps outlasts aiohttp's 30 s connect timeout on a busy machine,
    # and cancelling the rest then removes each waiter from a million-long deque).
    async def worker(session: aiohttp.ClientSession, queue: Iterator[dict]) -> None:
        nonlocal ok
        for body in queue:
            async with session.post(f"{base_url}/chat/completions", json=body) as response:
                data = await response.json()
                ok += bool(data["choices"][0]["message"]["content"])

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        started = time.perf_counter()
        queue = iter(bodies)
        await asyncio.gather(*(worker(session, queue) for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    assert ok == len(bodies), f"baseline: only {ok} of {len(bodies)} succeeded"
    return {"seconds": elapsed, "count": len(bodies)}


async def flow(*, base_url: str, prompts: Path, concurrency: int, db: str, record_first: bool) -> dict[str, float]:
    import logging

    from prefect import flow as prefect_flow

    from llm_dispatch.flows import realtime as realtime_module
    from llm_dispatch.flows.realtime import realtime_dispatch

    if record_first:
        # A head as large as any job: the whole input is stored before the first chunk is planned.
        realtime_module.lane_count = lambda settings: 1 << 40  # type: ignore[assignment]

    logging.getLogger("prefect").setLevel(logging.WARNING)

    @prefect_flow(name="bench-warm-up")
    async def warm_up(note: str) -> None:
        return None

    # Process start-up before the clock: Prefect's API, and what Prefect imports on a first flow run
    # with parameters (fastapi's encoder, ~0.2 s here), as in any process that has run a flow before.
    await warm_up(note="warm")
    started = time.perf_counter()
    summary = await realtime_dispatch(prompts=str(prompts), base_url=base_url, database_url=db,
                                      concurrency=concurrency, dedupe=False)
    elapsed = time.perf_counter() - started
    count = summary.counts.get("succeeded", 0)
    assert count == summary.prompts, f"flow: {summary.counts}"
    return {"seconds": elapsed, "count": count, "send_seconds": summary.send_s,
            **{f"phase_{name}": value for name, value in summary.phases_s.items()}}


def child(args: argparse.Namespace) -> None:
    from _rss import maybe_sampler

    prompts = Path(args.prompts_file)
    with maybe_sampler(args.rss_log):
        if args.child == "baseline":
            result = asyncio.run(baseline(base_url=args.base_url, prompts=prompts, concurrency=args.c))
        else:
            result = asyncio.run(flow(base_url=args.base_url, prompts=prompts, concurrency=args.c, db=args.db,
                                      record_first=args.record_first))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    result["peak_rss_mb"] = usage.ru_maxrss / 1024
    result["cpu_seconds"] = usage.ru_utime + usage.ru_stime
    report(result)


def run_child(
    kind: str, *, base_url: str, prompts: Path, concurrency: int, workdir: Path, run: int, record_first: bool = False,
    rss_log: str | None = None, timeout: float = 900,
) -> dict[str, float]:
    db = f"sqlite+aiosqlite:///{workdir / f'bench-{kind}-{concurrency}-{run}.db'}"
    env = {**os.environ, "PREFECT_LOGGING_LEVEL": "WARNING"}
    argv = [*child_argv(__file__, kind, base_url=base_url, prompts=prompts, concurrency=concurrency, db=db),
            *(["--record-first"] if record_first else []), *(["--rss-log", rss_log] if rss_log else [])]
    return run_measured(argv, env=env, what=f"{kind} run", cwd=workdir, timeout=timeout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=10_000)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[100, 400])
    parser.add_argument("--repeat", type=int, default=3)
    add_child_arguments(parser, kinds=["baseline", "flow"])
    parser.add_argument("--record-first", action="store_true", help="store a new job whole before sending")
    parser.add_argument("--rss-log", help="(child) write RSS samples over time to this JSON-lines file")
    parser.add_argument("--timeout", type=float, default=900, help="seconds each child may take (1M prompts: ~3600)")
    args = parser.parse_args()
    if args.child:
        child(args)
        return

    from llm_dispatch.simulator import Simulator, SimulatorConfig

    with prompts_workdir(args.prompts, prefix="bench-realtime-") as (workdir, prompts):
        with Simulator.in_process(SimulatorConfig(latency=args.latency)) as base_url:
            print(f"{args.prompts} prompts, simulator latency {args.latency * 1000:.0f} ms, {args.repeat} runs each, "
                  f"{os.cpu_count()} cores")
            for concurrency in args.concurrency:
                ideal = concurrency / args.latency
                results: dict[str, list[dict[str, float]]] = {"baseline": [], "flow": []}
                for run in range(args.repeat):
                    for kind in ("baseline", "flow"):
                        results[kind].append(run_child(kind, base_url=base_url, prompts=prompts,
                                                       concurrency=concurrency, workdir=workdir, run=run,
                                                       record_first=args.record_first, timeout=args.timeout))
                rate = {k: statistics.median(r["count"] / r["seconds"] for r in v) for k, v in results.items()}
                ratios = [f["count"] / f["seconds"] / (b["count"] / b["seconds"]) for f, b in zip(results["flow"], results["baseline"])]
                send_ratios = [f["count"] / f["send_seconds"] / (b["count"] / b["seconds"])
                               for f, b in zip(results["flow"], results["baseline"])]
                rss = max(r["peak_rss_mb"] for r in results["flow"])
                phases = {name.removeprefix("phase_"): statistics.median(r[name] for r in results["flow"])
                          for name in results["flow"][0] if name.startswith("phase_")}
                outside = statistics.median(r["seconds"] - sum(r[n] for n in r if n.startswith("phase_"))
                                            for r in results["flow"])
                print(f"\nconcurrency {concurrency} (ideal {ideal:.0f} req/s)")
                print(f"  baseline aiohttp, C workers {rate['baseline']:7.1f} req/s  ({rate['baseline'] / ideal:.2f}x ideal)")
                print(f"  realtime-dispatch flow      {rate['flow']:7.1f} req/s  ({rate['flow'] / ideal:.2f}x ideal)")
                print(f"  flow / baseline (end to end) median {statistics.median(ratios):.3f}x  "
                      f"(runs: {', '.join(f'{r:.3f}' for r in ratios)})")
                print(f"  send phase / baseline       median {statistics.median(send_ratios):.3f}x  "
                      f"(runs: {', '.join(f'{r:.3f}' for r in send_ratios)}; the flow's time without "
                      "validating, recording and planning the prompts)")
                print("  flow phases (median s)      " + ", ".join(f"{k} {v:.3f}" for k, v in phases.items())
                      + f", outside them (flow start and finish, summary) {outside:.3f}")
                cpu = {k: [r["cpu_seconds"] for r in v] for k, v in results.items()}
                cpu_ratios = [f / b for f, b in zip(cpu["flow"], cpu["baseline"])]
                print(f"  whole-process CPU seconds   flow {statistics.median(cpu['flow']):.1f} "
                      f"(runs: {', '.join(f'{c:.1f}' for c in cpu['flow'])}), baseline "
                      f"{statistics.median(cpu['baseline']):.1f} (runs: {', '.join(f'{c:.1f}' for c in cpu['baseline'])})")
                print(f"  flow CPU / baseline CPU     median {statistics.median(cpu_ratios):.3f}x  "
                      f"(runs: {', '.join(f'{r:.3f}' for r in cpu_ratios)})")
                print(f"  wall seconds                flow {statistics.median(r['seconds'] for r in results['flow']):.1f}, "
                      f"baseline {statistics.median(r['seconds'] for r in results['baseline']):.1f}")
                print(f"  flow peak RSS               {rss:.0f} MB (max of runs); baseline "
                      f"{max(r['peak_rss_mb'] for r in results['baseline']):.0f} MB")


if __name__ == "__main__":
    main()
