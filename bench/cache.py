"""Benchmark: the cache plan against no plan, on the simulator's documented caches (``core.cache_rules``).

    python bench/cache.py shared [--prompts 10000] [--concurrency 400] [--latency 1.0] [--models M ...]
    python bench/cache.py groups        # 50 groups of 200 prompts + 2,000 unique ones: the plan per group
    python bench/cache.py own           # prompts that set their own breakpoints: left as given, warmed first
    python bench/cache.py batch [--prompts 10000] [--models M ...]  # the same file through the Batch API lane
    python bench/cache.py gemini [--prompts 2000] [--prefix-tokens 5000] [--repeats 3] [--models gemini-3.8-flash]
                                 [--implicit-hit-rate 1.0]

``shared``: PROMPTS prompts sharing a ~3,000-token instruction, sent real-time through ``send_all`` at CONCURRENCY
to a simulator (its own process) answering in LATENCY seconds; for each model, with the plan and with it off, with
the simulator's overflow (15 requests a minute per prefix and key, as OpenAI's guide names) and without. Each row:
cost (the catalog's prices over what each answer reports), the cached share of input, the cache writes, wall time.
Every variant is the same prompts, measured one after the other against one simulator reset between runs.

``batch``: PROMPTS prompts sharing the same instruction, per model, through ``llm-dispatch run FILE --simulate
--route all-batch --json`` (the Batch API lane as a user runs it: recorded, estimated, batch files built with the
plan, the simulator's batches, answers ingested) with the plan and with ``--no-cache-plan``, each a fresh process
and database. Each row: the estimate (uncached and with the plan), the stored cost, the cached share of input, the
cache writes, wall time. The simulator answers a Message Batch ``batch_cache_wave`` requests at a time (its
default), an OpenAI batch one line after another.
``gemini``: PROMPTS Gemini prompts sharing a ~PREFIX_TOKENS-token instruction, three ways: the plan as it chooses
(an explicit cached content where it pays), the same plan held to implicit caching, and no plan; the cost adds the
explicit cache's create and storage (as the run's ledger records it) to the answers'. Medians of REPEATS runs each.
IMPLICIT_HIT_RATE: the share of warm requests the simulator's implicit caching serves (Google promises none).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from llm_dispatch.core import (
    ChatRequest,
    CacheRecord,
    ChatResult,
    ExplicitCaches,
    GeminiCaches,
    LLMClient,
    PriceTable,
    WorkItem,
    find_prefix_groups,
    from_pico,
    plan_caches,
    provider_lookup,
    send_all,
)
from llm_dispatch.simulator import Simulator, SimulatorConfig, anthropic_base_url

MODELS = ("gpt-6.2-sol", "claude-sonnet-5-5")
WORDS = ("rubric", "criterion", "evidence", "score", "reason", "clarity", "accuracy", "tone", "source", "claim")


def instruction(tokens: int, *, seed: int = 0) -> str:
    """About ``tokens`` tokens of instruction text (distinct per ``seed``)."""
    words = [f"{WORDS[(i * 7 + seed) % len(WORDS)]}{seed}" for i in range(int(tokens / 1.6))]
    return "Grade the answer below. " + " ".join(words)


def prompt(model: str, system: str | None, item: str) -> ChatRequest:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": item}]
    return ChatRequest(model=model, messages=messages, params={"max_tokens": 16})


class Sink:
    """Keeps every answer's usage, priced at the catalog."""

    def __init__(self, prices: PriceTable) -> None:
        self.prices = prices
        self.results: list[ChatResult] = []
        self.failures = 0

    async def success(self, *, prompt_ids: Sequence[int], result: ChatResult, route: str = "realtime",
                      model: str | None = None, reask: int = 0) -> None:
        self.results.append(result)

    async def failure(self, *, prompt_ids: Sequence[int], error: BaseException, final: bool = True,
                      model: str | None = None, reask: int = 0) -> None:
        self.failures += 1

    async def release(self, *, prompt_ids: Sequence[int]) -> int:
        return 0

    def figures(self, model: str) -> dict[str, Any]:
        cost = 0
        prompt = cached = written = 0
        for result in self.results:
            charge = self.prices.price(model=model, route="realtime", prompt_tokens=result.prompt_tokens,
                                       completion_tokens=result.completion_tokens, cached_tokens=result.cached_tokens,
                                       cache_creation_tokens=result.cache_creation_tokens,
                                       cache_creation_extended_tokens=result.cache_creation_extended_tokens)
            cost += charge.cost if charge else 0
            prompt += result.prompt_tokens
            cached += result.cached_tokens
            written += result.cache_creation_tokens
        return {"answers": len(self.results), "failed": self.failures, "cost_usd": float(from_pico(cost)),
                "cached_share": cached / prompt if prompt else 0.0, "cache_write_tokens": written}


@dataclass
class Variant:
    model: str
    plan: bool
    overflow: bool


async def run_variant(variant: Variant, *, requests: list[ChatRequest], base_url: str, concurrency: int,
                      latency: float, prices: PriceTable) -> dict[str, Any]:
    host = anthropic_base_url(base_url)  # the admin routes are the host's
    async with httpx.AsyncClient() as admin:
        for response in (await admin.post(f"{host}/_sim/reset"),
                         await admin.post(f"{host}/_sim/config",
                                          json={"cache_overflow_rpm": 15 if variant.overflow else None})):
            response.raise_for_status()
    provider = provider_lookup()(variant.model)
    url = anthropic_base_url(base_url) if provider == "anthropic" else base_url
    items = [WorkItem(prompt_ids=(number,), request=request) for number, request in enumerate(requests)]
    plan = None
    if variant.plan:
        groups = find_prefix_groups(enumerate(requests), provider_of=provider_lookup())
        plan = plan_caches(groups, total_prompts=len(requests), concurrency=concurrency, prices=prices,
                           latency_s=latency)
    sink = Sink(prices)
    async with LLMClient(provider=provider, base_url=url, api_key="k", concurrency=concurrency,
                         request_timeout=120) as client:
        started = time.perf_counter()
        await send_all(client=client, items=items, sink=sink, concurrency=concurrency, cache_plan=plan)
        wall = time.perf_counter() - started
    figures = sink.figures(variant.model)
    figures.update(model=variant.model, plan="on" if variant.plan else "off",
                   overflow="15/min" if variant.overflow else "none", wall_s=round(wall, 2))
    if plan is not None:
        figures["plan"] = ", ".join(f"{p.action} {p.reason}" for p in plan.groups)
        used = [plan.keys_used(p.group.key) for p in plan.groups]
        if any(keys is not None for keys in used):
            figures["keys_used"] = used
    return figures


async def shared(args: argparse.Namespace, base_url: str, prices: PriceTable) -> None:
    system = instruction(3000)
    for model in args.models:
        requests = [prompt(model, system, f"Answer {n}: the river is {n} km long.") for n in range(args.prompts)]
        for overflow in (False, True):
            for planned in (True, False):
                row = await run_variant(Variant(model, planned, overflow), requests=requests, base_url=base_url,
                                        concurrency=args.concurrency, latency=args.latency, prices=prices)
                print(json.dumps(row), flush=True)


async def groups(args: argparse.Namespace, base_url: str, prices: PriceTable) -> None:
    for model in args.models:
        requests = [prompt(model, instruction(3000, seed=group), f"Item {group}.{n}")
                    for group in range(50) for n in range(200)]
        requests += [prompt(model, None, f"A unique question {n} " + instruction(40, seed=1000 + n))
                     for n in range(2000)]
        found = find_prefix_groups(enumerate(requests), provider_of=provider_lookup())
        plan = plan_caches(found, total_prompts=len(requests), concurrency=args.concurrency, prices=prices,
                           latency_s=args.latency)
        for group_plan in plan.groups[:3]:
            print(json.dumps({"model": model, "group": group_plan.group.key, "prompts": group_plan.group.prompts,
                              "prefix_tokens": group_plan.group.prefix_tokens, "action": group_plan.action,
                              "why": group_plan.reason}))
        print(json.dumps({"model": model, "groups": len(plan.groups), "unique": len(requests) - sum(
            g.group.prompts for g in plan.groups), "actions": sorted({g.action for g in plan.groups}),
            "prefix_uncached_usd": float(from_pico(plan.uncached_cost)),
            "prefix_planned_usd": float(from_pico(plan.planned_cost)),
            "saved_usd": float(from_pico(plan.uncached_cost - plan.planned_cost))}), flush=True)
        for planned in (True, False):
            row = await run_variant(Variant(model, planned, True), requests=requests, base_url=base_url,
                                    concurrency=args.concurrency, latency=args.latency, prices=prices)
            row.pop("plan", None)
            print(json.dumps(row), flush=True)


async def own(args: argparse.Namespace, base_url: str, prices: PriceTable) -> None:
    model = next(m for m in args.models if m.startswith("claude"))
    system = [{"type": "text", "text": instruction(3000), "cache_control": {"type": "ephemeral", "ttl": "1h"}}]
    requests = [ChatRequest(model=model, messages=[{"role": "system", "content": system},
                                                   {"role": "user", "content": f"Item {n}"}],
                            params={"max_tokens": 16}) for n in range(200)]
    found = find_prefix_groups(enumerate(requests), provider_of=provider_lookup())
    plan = plan_caches(found, total_prompts=len(requests), concurrency=args.concurrency, prices=prices)
    prepared, _ = plan.prepare(requests[0])
    print(json.dumps({"model": model, "action": plan.groups[0].action, "why": plan.groups[0].reason,
                      "request_unchanged": prepared == requests[0]}))
    for planned in (True, False):
        row = await run_variant(Variant(model, planned, False), requests=requests, base_url=base_url,
                                concurrency=args.concurrency, latency=args.latency, prices=prices)
        row.pop("plan", None)
        print(json.dumps(row), flush=True)


def batch_lane(args: argparse.Namespace) -> None:
    system = instruction(3000)
    command = str(Path(sys.executable).with_name("llm-dispatch"))
    with tempfile.TemporaryDirectory() as scratch:
        for model in args.models:
            path = Path(scratch) / f"{model}.jsonl"
            with path.open("w", encoding="utf-8") as handle:
                for n in range(args.prompts):
                    handle.write(json.dumps({"id": n, "model": model, "params": {"max_tokens": 16}, "messages": [
                        {"role": "system", "content": system},
                        {"role": "user", "content": f"Answer {n}: the river is {n} km long."}]}) + "\n")
            for planned in (True, False):
                db = Path(scratch) / f"{model}-{planned}.db"
                env = {**os.environ, "PREFECT_HOME": str(Path(scratch) / "prefect")}
                started = time.perf_counter()
                done = subprocess.run(
                    [command, "run", str(path), "--simulate", "--route", "all-batch", "--json",
                     "--cache-plan" if planned else "--no-cache-plan",
                     "--database-url", f"sqlite+aiosqlite:///{db}"],
                    capture_output=True, text=True, env=env, timeout=3600)
                wall = time.perf_counter() - started
                if done.returncode != 0:
                    raise SystemExit(f"{model} plan={planned}: exit {done.returncode}\n{done.stderr[-3000:]}")
                summary = json.loads(done.stdout)
                with sqlite3.connect(db) as con:
                    answers, prompt, cached, written, cost = con.execute(
                        "SELECT COUNT(*), SUM(prompt_tokens), SUM(cached_tokens), SUM(cache_creation_tokens), "
                        "SUM(cost_pico_usd) FROM results WHERE status = 'succeeded'").fetchone()
                estimate = summary["estimate"]
                cache = estimate.get("cache") or {}
                print(json.dumps({
                    "model": model, "lane": "batch", "plan": "on" if planned else "off", "answers": answers,
                    "cost_usd": float(from_pico(cost or 0)), "cached_share": round(cached / prompt, 4) if prompt else 0,
                    "cache_write_tokens": written or 0, "estimate_uncached_usd": estimate["total"],
                    "estimate_planned_usd": estimate["planned_total"],
                    "plan_per_group": [f"{g['action']} ({g['reason']})" for g in cache.get("groups", [])],
                    "wall_s": round(wall, 1)}), flush=True)
            path.unlink()
class MemoryLedger:
    """``core.CacheLedger`` in memory: the bench needs no database, only what each cache cost."""

    def __init__(self) -> None:
        self.costs: dict[str, int] = {}

    async def recorded(self, *, job_id: str, group_key: str) -> CacheRecord | None:
        return None

    async def creating(self, **_: Any) -> None:
        return None

    async def created(self, *, group_key: str, cost: int | None, **_: Any) -> None:
        self.costs[group_key] = cost or 0

    async def ended(self, *, group_key: str, cost: int | None, **_: Any) -> None:
        self.costs[group_key] = cost or 0


async def gemini(args: argparse.Namespace, base_url: str, prices: PriceTable) -> None:
    system = instruction(args.prefix_tokens)
    host = anthropic_base_url(base_url)
    for model in args.models:
        requests = [prompt(model, system, f"Answer {n}: the river is {n} km long.") for n in range(args.prompts)]
        items = [WorkItem(prompt_ids=(number,), request=request) for number, request in enumerate(requests)]
        found = find_prefix_groups(enumerate(requests), provider_of=provider_lookup())
        for way in ("explicit", "implicit", "off"):
            runs = []
            for _ in range(args.repeats):
                async with httpx.AsyncClient() as admin:
                    (await admin.post(f"{host}/_sim/reset")).raise_for_status()
                    (await admin.post(f"{host}/_sim/config", json={
                        "gemini_implicit_hit_rate": args.implicit_hit_rate})).raise_for_status()
                plan = None if way == "off" else plan_caches(found, total_prompts=len(requests),
                                                              concurrency=args.concurrency, prices=prices,
                                                              latency_s=args.latency)
                ledger = MemoryLedger()
                sink = Sink(prices)
                async with LLMClient(provider="gemini", base_url=host, api_key="k", concurrency=args.concurrency,
                                     request_timeout=120) as client:
                    if plan is not None and way == "explicit":
                        plan.explicit = ExplicitCaches(job_id=f"bench-{datetime.now():%H%M%S%f}",
                                                       api_of=lambda _model, c=client: GeminiCaches(c),
                                                       ledger=ledger, prices=prices)
                    elif plan is not None:
                        plan.groups = [replace(g, action="implicit") if g.action == "explicit" else g
                                       for g in plan.groups]
                    started, cpu = time.perf_counter(), time.process_time()
                    await send_all(client=client, items=items, sink=sink, concurrency=args.concurrency,
                                   cache_plan=plan)
                    if plan is not None and plan.explicit is not None:
                        await plan.explicit.close()
                    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
                figures = sink.figures(model)
                cache_cost = float(from_pico(sum(ledger.costs.values())))
                runs.append({**figures, "cache_cost_usd": cache_cost,
                             "cost_usd": round(figures["cost_usd"] + cache_cost, 6), "wall_s": wall, "cpu_s": cpu,
                             "plan": "" if plan is None else plan.groups[0].action})
            row = {key: statistics.median(run[key] for run in runs) for key in
                   ("cost_usd", "cache_cost_usd", "cached_share", "wall_s", "cpu_s")}
            print(json.dumps({"model": model, "way": way, "implicit_hit_rate": args.implicit_hit_rate, "plan": runs[0]["plan"], "answers": runs[0]["answers"],
                              "failed": runs[0]["failed"], "repeats": len(runs),
                              **{key: round(value, 6) for key, value in row.items()}}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("shared", "groups", "own", "batch", "gemini"))
    parser.add_argument("--prompts", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=400)
    parser.add_argument("--latency", type=float, default=1.0)
    parser.add_argument("--models", nargs="+", default=None)
    parser.add_argument("--prefix-tokens", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--implicit-hit-rate", type=float, default=1.0)
    args = parser.parse_args()
    if args.models is None:
        args.models = ["gemini-3.8-flash"] if args.what == "gemini" else list(MODELS)
    if args.what == "batch":
        batch_lane(args)
        return
    prices = PriceTable.load()
    with Simulator.in_process(SimulatorConfig(latency=args.latency)) as base_url:
        asyncio.run({"shared": shared, "groups": groups, "own": own, "gemini": gemini}[args.what](args, base_url, prices))


if __name__ == "__main__":
    main()
