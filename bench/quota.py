"""Benchmark: a Gemini quota as Google sends it (429 RESOURCE_EXHAUSTED with a google.rpc.RetryInfo retryDelay, no
rate-limit headers), met by the client (``LLMClient`` + ``send_all``, nothing configured).

The simulator (its own process) enforces a requests-per-minute quota over a sliding window and answers a request
over it with Gemini's 429, its ``retryDelay`` the wait until the window frees a place. The client (a fresh process
per run) sends Gemini prompts at a fixed concurrency. A quota stated per minute is counted over the window given
(``--window``): 60 s is Google's minute, a shorter one the same quota quantised (as ``bench/ratelimits.py`` does),
so a run of a few thousand prompts meets the quota tens of times in about a minute.

    python bench/quota.py [--prompts 2000] [--concurrency 100] [--rpm 2000] [--window 6 1] [--repeat 3]

Per window, medians over the runs: seconds, answers a second, the **share of the quota used** (requests answered
against the most the quota admits in the run's time: a window's worth at the start, then a window's worth per
window), the **share of requests answered 429** (of every attempt), the most 429s in any 100 consecutive answers,
and prompts left unanswered.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from typing import Any

import httpx

from _child import report, run_measured  # bench/ is the script's folder, first on sys.path
from ratelimits import Attempts, RecordingTransport

MODEL = "gemini-3.5-flash-lite"
MAX_TOKENS = 64
LATENCY = 0.2


async def run_client(*, base_url: str, prompts: int, concurrency: int, attempts: Attempts) -> dict[str, Any]:
    from llm_dispatch.core import ChatRequest, LLMClient, WorkItem, default_transport, send_all

    answered: set[int] = set()

    class Sink:
        async def success(self, *, prompt_ids, result, route="realtime", model=None, reask=0) -> None:  # noqa: ANN001
            answered.update(prompt_ids)

        async def failure(self, *, prompt_ids, error, final=True, model=None, reask=0) -> None:  # noqa: ANN001
            return None

        async def release(self, *, prompt_ids) -> int:  # noqa: ANN001
            return len(prompt_ids)

    work = [WorkItem((i,), ChatRequest(model=MODEL, messages=[{"role": "user", "content": f"Question {i}: what is "
                                                                                           f"{i} squared?"}],
                                       params={"max_tokens": MAX_TOKENS}))
            for i in range(prompts)]
    transport = RecordingTransport(default_transport(concurrency=concurrency, tls=False), attempts)
    async with LLMClient(provider="gemini", base_url=base_url, api_key="gemini-bench", concurrency=concurrency,
                         transport=transport) as client:
        await send_all(client=client, items=work, sink=Sink(), concurrency=concurrency)  # type: ignore[arg-type]
    return {"answered": len(answered)}


def child(args: argparse.Namespace) -> None:
    attempts = Attempts()
    import llm_dispatch.core  # noqa: F401 - imported before the clock, as in a process that has sent before

    started = time.perf_counter()
    result = asyncio.run(run_client(base_url=args.base_url, prompts=args.prompts, concurrency=args.concurrency,
                                    attempts=attempts))
    report({**result, **attempts.summary(), "seconds": time.perf_counter() - started})


def measure(args: argparse.Namespace, *, window: float, base_url: str) -> dict[str, float]:
    httpx.post(f"{base_url}/_sim/reset", timeout=5).raise_for_status()
    argv = [__file__, "--child", "--base-url", base_url, "--prompts", str(args.prompts), "--concurrency",
            str(args.concurrency)]
    run = run_measured(argv, env=dict(os.environ), what=f"client, window {window:g} s")
    stats = httpx.get(f"{base_url}/_sim/stats", timeout=5).raise_for_status().json()
    per_window = max(1, round(args.rpm * window / 60))
    most = per_window * (1 + run["seconds"] / window)
    return {**run, "rate": run["answered"] / run["seconds"], "of_quota": stats["generate_contents"] / most,
            "share_429": run["answered_429"] / max(1, run["attempts"]), "unanswered": args.prompts - run["answered"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--rpm", type=int, default=2000, help="the quota, requests a minute")
    parser.add_argument("--window", type=float, nargs="+", default=[6.0, 1.0],
                        help="seconds the quota is counted over (60: Google's minute)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--base-url")
    args = parser.parse_args()
    if args.child:
        child(args)
        return

    from llm_dispatch.simulator import Simulator, SimulatorConfig, anthropic_base_url

    print(f"{args.prompts:,} Gemini prompts at concurrency {args.concurrency}, quota {args.rpm:,} requests a "
          f"minute, {LATENCY:g} s latency; {args.repeat} runs each, medians; {os.cpu_count()} cores")
    print(f"  {'window':>7} {'seconds':>8} {'answers/s':>9} {'of quota':>8} {'429 share':>9} {'peak 429/100':>12} "
          f"{'unanswered':>10}")
    for window in args.window:
        config = SimulatorConfig(seed=1, latency=LATENCY, rpm=args.rpm, quota_window=window)
        runs = []
        with Simulator.in_process(config) as url:
            for _ in range(args.repeat):
                runs.append(measure(args, window=window, base_url=anthropic_base_url(url)))
        med = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
        print(f"  {window:6g}s {med['seconds']:8.1f} {med['rate']:9.1f} {med['of_quota']:7.2f}x "
              f"{med['share_429']:8.1%} {med['peak_429_share']:11.0%} {med['unanswered']:10.0f}", flush=True)


if __name__ == "__main__":
    main()
