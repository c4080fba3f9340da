"""Throughput of the bundled simulator: it must never be what limits a benchmark of the client.

Starts the simulator in its own process, then drives it from this process with a fixed number of
chat requests at a fixed concurrency over aiohttp. Prints, per run, requests per second and the
simulator's own CPU time per request (from ``/_sim/stats``), whose inverse is the rate one core of
simulator could serve; then the medians. On a shared machine the client's core, not the
simulator, is usually what runs out first.

    python bench/simulator_throughput.py                      # 3 runs x 20,000 requests, 100 concurrent
    python bench/simulator_throughput.py --runs 5 --requests 50000 --concurrency 200 --latency 0.05
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import aiohttp


from llm_dispatch.simulator import Simulator, SimulatorConfig

_BODY = json.dumps(
    {
        "model": "gpt-4o-mini",
        "messages": [
            {"role": "system", "content": "You are a concise assistant."},
            {"role": "user", "content": "Summarise the plot of a short story about a lighthouse keeper in two lines."},
        ],
        "max_tokens": 256,
    }
).encode()
_HEADERS = {"Content-Type": "application/json", "Authorization": "Bearer sk-bench"}


async def _drive(*, base_url: str, requests: int, concurrency: int) -> tuple[float, float, float, int]:
    """Send ``requests`` chat requests, ``concurrency`` at a time.

    Returns (wall seconds, simulator CPU seconds, client CPU seconds, answers that were not 200).
    """
    url = f"{base_url}/chat/completions"
    stats_url = base_url.removesuffix("/v1") + "/_sim/stats"
    remaining = requests
    failures = 0
    connector = aiohttp.TCPConnector(limit=concurrency)
    # No cookies, no decompression: the client's own CPU is the scarce thing on a small machine.
    async with aiohttp.ClientSession(
        connector=connector, cookie_jar=aiohttp.DummyCookieJar(), auto_decompress=False
    ) as session:

        async def simulator_cpu() -> float:
            async with session.get(stats_url) as response:
                return float((await response.json())["process_cpu_s"])

        async def worker() -> None:
            nonlocal remaining, failures
            while remaining > 0:
                remaining -= 1
                # The body is encoded once, for the same reason.
                async with session.post(url, data=_BODY, headers=_HEADERS) as response:
                    await response.read()
                    if response.status != 200:
                        failures += 1

        cpu_before = await simulator_cpu()
        client_cpu_before = time.process_time()
        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        seconds = time.perf_counter() - started
        client_cpu = time.process_time() - client_cpu_before
        return seconds, await simulator_cpu() - cpu_before, client_cpu, failures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--latency", type=float, default=0.0, help="simulated latency, seconds")
    args = parser.parse_args()

    rates: list[float] = []
    cpu_per_request: list[float] = []
    client_cpu_per_request: list[float] = []
    with Simulator.in_process(config=SimulatorConfig(latency=args.latency)) as base_url:
        # Warm up connections and both processes' code paths before timing.
        asyncio.run(_drive(base_url=base_url, requests=min(2_000, args.requests), concurrency=args.concurrency))
        for run in range(1, args.runs + 1):
            seconds, cpu_s, client_cpu_s, failures = asyncio.run(
                _drive(base_url=base_url, requests=args.requests, concurrency=args.concurrency)
            )
            rates.append(args.requests / seconds)
            cpu_per_request.append(cpu_s / args.requests)
            client_cpu_per_request.append(client_cpu_s / args.requests)
            print(
                f"run {run}: {args.requests} requests in {seconds:.2f} s = {rates[-1]:,.0f} req/s; CPU per request: "
                f"simulator {cpu_per_request[-1] * 1e6:.0f} us, client {client_cpu_per_request[-1] * 1e6:.0f} us "
                f"({failures} non-200)"
            )
    cpu = statistics.median(cpu_per_request)
    print(
        f"median: {statistics.median(rates):,.0f} req/s; CPU per request: simulator {cpu * 1e6:.0f} us "
        f"(~{1 / cpu:,.0f} req/s per simulator core), client {statistics.median(client_cpu_per_request) * 1e6:.0f} us "
        f"({args.requests} requests, {args.concurrency} concurrent, latency {args.latency:g} s)"
    )


if __name__ == "__main__":
    main()
