"""Benchmark: what holding a budget costs the real-time lane: the realtime-dispatch flow without a budget and with
one far above what the job costs (``--budget``; ``--variants named`` adds a named one, ``--budget-name``: the same
lease, under another name).

100,000 prompts against the simulator (its own process) at 200 ms latency, concurrency 400. Each variant runs in
a fresh child process, the variants alternating, repeated; medians are reported, with the machine's load.

    python bench/budget.py [--prompts 100000] [--latency 0.2] [--concurrency 400] [--repeat 3] [--variants ...]

Each request's worst case is reserved before it is sent (taken from the database a block of ``concurrency``
requests' worth at a time) and each flush of the result writer settles the stored costs of its rows in its own
transaction: the bench shows what that adds to a run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import sys
import time
from pathlib import Path

from _child import report, run_measured  # bench/ is the script's folder, first on sys.path
from realtime import add_child_arguments, child_argv, prompts_workdir

VARIANTS = ("none", "budget", "named")


async def flow(*, base_url: str, prompts: Path, concurrency: int, db: str, variant: str) -> dict[str, float]:
    import logging

    from prefect import flow as prefect_flow

    from llm_dispatch import storage
    from llm_dispatch.flows.realtime import realtime_dispatch

    logging.getLogger("prefect").setLevel(logging.WARNING)

    @prefect_flow(name="bench-warm-up")
    async def warm_up(note: str) -> None:
        return None

    await warm_up(note="warm")
    held: dict[str, object] = {}
    if variant == "budget":
        held = {"budget": 1000.0}
    elif variant == "named":
        async with storage.open_database(db) as sessions:
            await storage.set_budget(sessions, name="bench", limit_pico_usd=1000 * 10**12, per="day")
        held = {"budget_name": "bench"}
    started = time.perf_counter()
    summary = await realtime_dispatch(prompts=str(prompts), base_url=base_url, database_url=db,
                                      concurrency=concurrency, dedupe=False, **held)  # type: ignore[arg-type]
    elapsed = time.perf_counter() - started
    count = summary.counts.get("succeeded", 0)
    assert count == summary.prompts, f"flow: {summary.counts}"
    spent = -1.0
    if summary.budget is not None:
        assert not summary.budget.stopped and summary.budget.reserved == 0, summary.budget
        spent = float(summary.budget.spent)
    return {"seconds": elapsed, "count": count, "send_seconds": summary.send_s, "spent": spent}


def child(args: argparse.Namespace) -> None:
    result = asyncio.run(flow(base_url=args.base_url, prompts=Path(args.prompts_file), concurrency=args.c,
                              db=args.db, variant=args.child))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    result["cpu_seconds"] = usage.ru_utime + usage.ru_stime
    report(result)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=100_000)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--concurrency", type=int, default=400)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=["none", "budget"])
    add_child_arguments(parser, kinds=VARIANTS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return

    from llm_dispatch.simulator import Simulator, SimulatorConfig

    with prompts_workdir(args.prompts, prefix="bench-budget-") as (workdir, prompts):
        # A loaded machine starts Prefect's temporary server in more than its default 20 s.
        env = {**os.environ, "PREFECT_LOGGING_LEVEL": "WARNING", "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "300",
               "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
        with Simulator.in_process(SimulatorConfig(latency=args.latency)) as base_url:
            print(f"{args.prompts} prompts, simulator latency {args.latency * 1000:.0f} ms, concurrency "
                  f"{args.concurrency}, {args.repeat} runs each, {os.cpu_count()} cores, load "
                  f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} at start", flush=True)
            results: dict[str, list[dict[str, float]]] = {variant: [] for variant in args.variants}
            for run in range(args.repeat):
                for variant in args.variants:
                    db = f"sqlite+aiosqlite:///{workdir / f'bench-{variant}-{run}.db'}"
                    argv = child_argv(__file__, variant, base_url=base_url, prompts=prompts,
                                      concurrency=args.concurrency, db=db)
                    results[variant].append(run_measured(argv, env=env, what=f"{variant} run", cwd=workdir,
                                                         timeout=1800))
                    print(f"  run {run + 1} {variant:6s} {results[variant][-1]['count'] / results[variant][-1]['seconds']:7.1f} "
                          f"req/s", flush=True)
            print(f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())} at end")
            base = statistics.median(r["count"] / r["seconds"] for r in results[args.variants[0]])
            labels = {"none": "no budget", "budget": "--budget (the job's own)", "named": "--budget-name (a named one)"}
            for variant in args.variants:
                label = labels[variant]
                rates = [r["count"] / r["seconds"] for r in results[variant]]
                send = statistics.median(r["count"] / r["send_seconds"] for r in results[variant])
                cpu = statistics.median(r["cpu_seconds"] for r in results[variant])
                print(f"  {label:30s} {statistics.median(rates):7.1f} req/s end to end ({statistics.median(rates) / base:.3f}x "
                      f"{labels[args.variants[0]]}; runs {', '.join(f'{rate:.0f}' for rate in rates)}), send phase {send:7.1f} req/s, "
                      f"CPU {cpu:.1f} s")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
