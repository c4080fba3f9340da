"""Benchmark: rate limits as providers send them, the client (``LLMClient`` + ``send_all``) vs aiohttp + Semaphore.

Each scenario runs the baseline (aiohttp + Semaphore, per-request retries: Retry-After honoured, else backoff
``min(0.5 * 2**n, 8)`` with jitter, 5 retries, holding its slot while it waits) and the client with no rate
configured, each in a fresh child process, alternating, repeated; the simulator runs in its own process.

    python bench/ratelimits.py [--repeat 3] [--scenario sporadic mixed rpm tpm shared]

Per variant (medians): throughput (answers a second), the share of requests answered 429, prompts answered (and
answered more than once), prompts whose 400 was retried, prompts that waited the same interval (within 1 ms)
twice in a row, and the highest share of 429s over 100 consecutive answers. Quota rows also give the throughput
as a share of the quota (the simulator's count of what it admitted, against its limit).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from _child import report, run_measured  # bench/ is the script's folder, first on sys.path

ROOT = Path(__file__).resolve().parent.parent
MAX_TOKENS = 64
MAX_RETRIES = 5
EQUAL_S = 0.001
WINDOW = 100


@dataclass(frozen=True)
class Scenario:
    name: str
    what: str
    sim: dict[str, Any]
    prompts: int
    concurrency: int = 100
    runs: int = 1  # runs at once on the one simulator (sharing its quota)
    marked_400: int = 0  # prompts that always answer 400
    quota: str | None = None  # "rpm" or "tpm": the row's throughput is also given against it


SCENARIOS = {
    s.name: s for s in (
        Scenario("sporadic", "20% 429 (Retry-After 0.2 s), 200 ms, c=100, 5,000 prompts",
                 {"latency": 0.2, "rate_429": 0.2, "retry_after": 0.2}, 5000),
        Scenario("mixed", "20% 429 (Retry-After 1 s) + 5% 500 + 1% 400, 50 ms, 300 prompts",
                 {"latency": 0.05, "rate_429": 0.2, "retry_after": 1.0, "rate_500": 0.05}, 300, marked_400=3),
        Scenario("rpm", "RPM quota 6,000/min enforced per second (100/s), 200 ms, 3,000 prompts",
                 {"latency": 0.2, "rpm": 6000, "quota_window": 1.0}, 3000, quota="rpm"),
        Scenario("tpm", "TPM quota 480,000/min enforced per second (~100 prompts/s), 200 ms, 3,000 prompts",
                 {"latency": 0.2, "tpm": 480_000, "quota_window": 1.0}, 3000, quota="tpm"),
        Scenario("shared", "two runs on one RPM quota of 100/s, 1,500 prompts each, 200 ms",
                 {"latency": 0.2, "rpm": 6000, "quota_window": 1.0}, 1500, runs=2, quota="rpm"),
    )
}


def bodies(scenario: Scenario, run: int) -> list[dict[str, Any]]:
    out = []
    for i in range(scenario.prompts):
        text = f"Run {run}, benchmark question {i}: what is {i} squared?"
        if i < scenario.marked_400:
            text += " [[sim:400]]"
        out.append({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": text}], "max_tokens": MAX_TOKENS})
    return out


@dataclass
class Attempts:
    """Every attempt seen, per prompt body: (sent at, answered at, status)."""

    by_body: dict[bytes, list[tuple[float, float, int]]] = field(default_factory=lambda: defaultdict(list))

    def add(self, body: bytes, started: float, ended: float, status: int) -> None:
        self.by_body[body].append((started, ended, status))

    def summary(self) -> dict[str, float]:
        every = sorted((a for tries in self.by_body.values() for a in tries), key=lambda a: a[1])
        statuses = [a[2] for a in every]
        limited = [s == 429 for s in statuses]
        peak = max((sum(limited[i:i + WINDOW]) / WINDOW for i in range(0, max(1, len(limited) - WINDOW + 1))),
                   default=0.0)
        equal = retried_400 = 0
        for tries in self.by_body.values():
            waits = [nxt[0] - cur[1] for cur, nxt in zip(tries, tries[1:])]
            equal += any(abs(b - a) < EQUAL_S for a, b in zip(waits, waits[1:]))
            retried_400 += any(cur[2] == 400 for cur in tries[:-1])
        return {"attempts": len(statuses), "answered_429": sum(limited), "peak_429_share": peak,
                "equal_waits": equal, "retried_400": retried_400}


class RecordingTransport(httpx.AsyncBaseTransport):
    """The client's own transport, noting each attempt."""

    def __init__(self, inner: httpx.AsyncBaseTransport, attempts: Attempts) -> None:
        self._inner = inner
        self._attempts = attempts

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        started = time.perf_counter()
        status = 0
        try:
            response = await self._inner.handle_async_request(request)
            status = response.status_code
            return response
        finally:
            self._attempts.add(request.content, started, time.perf_counter(), status)

    async def aclose(self) -> None:
        await self._inner.aclose()


async def run_baseline(*, base_url: str, items: list[dict[str, Any]], concurrency: int, attempts: Attempts) -> dict:
    import random

    import aiohttp

    sem = asyncio.Semaphore(concurrency)
    answered: dict[int, int] = defaultdict(int)

    async def one(session: aiohttp.ClientSession, index: int, body: dict[str, Any]) -> None:
        raw = json.dumps(body).encode()
        async with sem:
            for n in range(MAX_RETRIES + 1):
                started = time.perf_counter()
                try:
                    async with session.post(f"{base_url}/chat/completions", data=raw,
                                            headers={"Content-Type": "application/json"}) as response:
                        await response.read()
                        status, headers = response.status, response.headers
                except aiohttp.ClientError:
                    status, headers = 0, {}
                attempts.add(raw, started, time.perf_counter(), status)
                if status == 200:
                    answered[index] += 1
                    return
                if status not in (0, 408, 409, 429) and status < 500:
                    return
                if "retry-after-ms" in headers:
                    delay = float(headers["retry-after-ms"]) / 1000
                elif "retry-after" in headers:
                    delay = float(headers["retry-after"])
                else:
                    delay = min(0.5 * 2**n, 8.0) * (1 - 0.25 * random.random())
                await asyncio.sleep(delay)

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:
        await asyncio.gather(*(one(session, i, body) for i, body in enumerate(items)))
    return {"answered": len(answered), "answered_twice": sum(c > 1 for c in answered.values())}


async def run_client(*, base_url: str, items: list[dict[str, Any]], concurrency: int, attempts: Attempts) -> dict:
    from llm_dispatch.core import ChatRequest, LLMClient, WorkItem, default_transport, send_all

    answered: dict[int, int] = defaultdict(int)

    class Sink:
        async def success(self, *, prompt_ids, result, route="realtime", model=None) -> None:  # noqa: ANN001
            for prompt_id in prompt_ids:
                answered[prompt_id] += 1

        async def failure(self, *, prompt_ids, error, final=True, model=None) -> None:  # noqa: ANN001
            return None

    work = [WorkItem((i,), ChatRequest(model=b["model"], messages=b["messages"], params={"max_tokens": MAX_TOKENS}))
            for i, b in enumerate(items)]
    transport = RecordingTransport(default_transport(concurrency=concurrency, tls=False), attempts)
    async with LLMClient(base_url=base_url, api_key="sk-bench", concurrency=concurrency, transport=transport) as client:
        await send_all(client=client, items=work, sink=Sink(), concurrency=concurrency)
    return {"answered": len(answered), "answered_twice": sum(c > 1 for c in answered.values())}


def child(args: argparse.Namespace) -> None:
    scenario = SCENARIOS[args.scenario[0]]
    items = bodies(scenario, args.run)
    attempts = Attempts()
    run = run_baseline if args.child == "baseline" else run_client
    import aiohttp  # noqa: F401 - imports before the clock, as in a process that has sent before
    import llm_dispatch.core  # noqa: F401

    started_at = time.time()
    started = time.perf_counter()
    result = asyncio.run(run(base_url=args.base_url, items=items, concurrency=scenario.concurrency, attempts=attempts))
    elapsed = time.perf_counter() - started
    report({**result, **attempts.summary(), "seconds": elapsed, "started_at": started_at,
            "ended_at": started_at + elapsed})


def measure(kind: str, scenario: Scenario, *, base_url: str, root: str) -> dict[str, float]:
    """One variant on one scenario: its runs at once, summed; the quota's share from the simulator's count."""
    httpx.post(f"{root}/_sim/reset", timeout=5).raise_for_status()
    env = dict(os.environ)
    argv = [__file__, "--child", kind, "--scenario", scenario.name, "--base-url", base_url]

    async def together() -> list[dict[str, Any]]:
        return await asyncio.gather(*(asyncio.to_thread(run_measured, [*argv, "--run", str(r)], env=env,
                                                        what=f"{kind} {scenario.name}")
                                      for r in range(scenario.runs)))

    runs = asyncio.run(together())
    stats = httpx.get(f"{root}/_sim/stats", timeout=5).raise_for_status().json()
    span = max(r["ended_at"] for r in runs) - min(r["started_at"] for r in runs)
    total = {key: sum(r[key] for r in runs) for key in
             ("answered", "answered_twice", "attempts", "answered_429", "equal_waits", "retried_400")}
    total.update(seconds=span, rate=total["answered"] / span, peak_429_share=max(r["peak_429_share"] for r in runs),
                 share_429=total["answered_429"] / max(1, total["attempts"]))
    if scenario.quota == "rpm":
        total["of_quota"] = stats["completions"] / span / (scenario.sim["rpm"] / 60)
    elif scenario.quota == "tpm":
        charged = stats["prompt_tokens"] + MAX_TOKENS * stats["completions"]
        total["of_quota"] = charged / span / (scenario.sim["tpm"] / 60)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--scenario", nargs="+", choices=list(SCENARIOS), default=list(SCENARIOS))
    parser.add_argument("--child", choices=["baseline", "client"])
    parser.add_argument("--base-url")
    parser.add_argument("--run", type=int, default=0)
    args = parser.parse_args()
    if args.child:
        child(args)
        return

    from llm_dispatch.simulator import Simulator, SimulatorConfig

    print(f"{args.repeat} runs of each variant per scenario, medians; {os.cpu_count()} cores")
    header = (f"  {'variant':<9} {'answers/s':>9} {'vs base':>8} {'of quota':>8} {'429 share':>9} {'answered':>9} "
              f"{'twice':>5} {'400 retried':>11} {'equal waits':>11} {'peak 429/100':>12}")
    for name in args.scenario:
        scenario = SCENARIOS[name]
        results: dict[str, list[dict[str, float]]] = {"baseline": [], "client": []}
        with Simulator.in_process(SimulatorConfig(seed=1, **scenario.sim)) as base_url:
            root = base_url.removesuffix("/v1")
            for _ in range(args.repeat):
                for kind in results:
                    results[kind].append(measure(kind, scenario, base_url=base_url, root=root))
        print(f"\n{scenario.name}: {scenario.what}" + (f" x {scenario.runs} runs at once" if scenario.runs > 1 else ""))
        print(header)
        for kind, runs in results.items():
            med = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
            ratio = statistics.median(r["rate"] / b["rate"] for r, b in zip(runs, results["baseline"]))
            quota = f"{med['of_quota']:.2f}x" if "of_quota" in med else "-"
            print(f"  {kind:<9} {med['rate']:9.1f} {ratio:7.2f}x {quota:>8} {med['share_429']:8.1%} "
                  f"{med['answered']:6.0f}/{scenario.prompts * scenario.runs:<5} {med['answered_twice']:2.0f} "
                  f"{med['retried_400']:11.0f} {med['equal_waits']:11.0f} {med['peak_429_share']:11.0%}", flush=True)


if __name__ == "__main__":
    main()
