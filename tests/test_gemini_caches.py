"""Gemini's explicit cached contents: the wire as google-genai writes it (respx, the production send path), the
simulator's cachedContents over real sockets, the plan's choice between explicit and implicit caching, a run's caches
made once, reused after a lost create, deleted when sent, and their cost in the job's."""

from __future__ import annotations

import contextlib
import json
import os
from datetime import UTC, datetime, timedelta
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import respx

from llm_dispatch import storage
from llm_dispatch.core import (
    CachePlan,
    ChatRequest,
    ExplicitCaches,
    GeminiCaches,
    LLMClient,
    PriceTable,
    WorkItem,
    cache_display_name,
    cached_content_body,
    can_reference,
    find_prefix_groups,
    plan_caches,
    provider_lookup,
    referencing_cache,
    send_all,
)
from llm_dispatch.simulator import anthropic_base_url

from conftest import StartSim, cli, rows, write_prompts

MODEL = "gemini-2.5-flash"
KEY = "AIza-gemini-cache-test-0123456789"
BASE = "https://generativelanguage.googleapis.test"
RUBRIC = "Grade the answer by the rubric below, point by point. " * 300  # ~3,300 tokens
TOOL = {"type": "function", "function": {"name": "grade", "parameters": {"type": "object"}}}


def ask(item: str, **params: Any) -> ChatRequest:
    return ChatRequest(model=MODEL, messages=[{"role": "system", "content": RUBRIC},
                                              {"role": "user", "content": item}], params={"max_tokens": 16, **params})


def groups_of(requests: list[ChatRequest]) -> Any:
    return find_prefix_groups(enumerate(requests), provider_of=provider_lookup())


@pytest.fixture(scope="module")
def prices() -> PriceTable:
    return PriceTable.load()


# --- the wire ------------------------------------------------------------------------------------


@respx.mock
async def test_the_create_and_the_request_naming_it_are_googles_shapes() -> None:
    created = {"name": "cachedContents/abc123", "displayName": "llm-dispatch:job-1:g1", "model": f"models/{MODEL}",
               "expireTime": "2030-01-01T00:00:00Z", "usageMetadata": {"totalTokenCount": 3312}}
    create = respx.post(f"{BASE}/v1beta/cachedContents").mock(return_value=httpx.Response(200, json=created))
    generate = respx.post(f"{BASE}/v1beta/models/{MODEL}:generateContent").mock(return_value=httpx.Response(200, json={
        "candidates": [{"content": {"role": "model", "parts": [{"text": "B"}]}, "finishReason": "STOP"}],
        "usageMetadata": {"promptTokenCount": 3320, "candidatesTokenCount": 1, "cachedContentTokenCount": 3312}}))
    delete = respx.delete(f"{BASE}/v1beta/cachedContents/abc123").mock(return_value=httpx.Response(200, json={}))
    request = ask("Answer: 42", tools=[TOOL], tool_choice="auto")
    async with LLMClient(provider="gemini", base_url=BASE, api_key=KEY,
                         transport=httpx.AsyncHTTPTransport()) as client:
        api = GeminiCaches(client)
        body = cached_content_body(ChatRequest(model=MODEL, messages=request.messages[:1], params=request.params),
                                   ttl_s=3900.4, display_name="llm-dispatch:job-1:g1")
        cache = await api.create(body)
        answer = await client.chat(referencing_cache(request, name=cache.name, prefix_messages=1))
        await api.delete(cache.name)
    sent = json.loads(create.calls.last.request.content)
    assert sent == {"model": f"models/{MODEL}", "systemInstruction": {"parts": [{"text": RUBRIC}], "role": "user"},
                    "tools": [{"functionDeclarations": [{"name": "grade", "parametersJsonSchema": {"type": "object"}}]}],
                    "toolConfig": {"functionCallingConfig": {"mode": "AUTO"}}, "ttl": "3900s",
                    "displayName": "llm-dispatch:job-1:g1"}
    assert create.calls.last.request.headers["x-goog-api-key"] == KEY
    assert (cache.tokens, cache.expire_time) == (3312, datetime(2030, 1, 1, tzinfo=UTC))
    # The request names the cache and repeats none of what it holds.
    asked = json.loads(generate.calls.last.request.content)
    assert asked == {"contents": [{"role": "user", "parts": [{"text": "Answer: 42"}]}], "cachedContent": cache.name,
                     "generationConfig": {"maxOutputTokens": 16}}
    assert answer.cached_tokens == 3312 and delete.call_count == 1
    # What follows the cached part must be user turns: a tool result would lose the call that names its function.
    tool_turn = ChatRequest(model=MODEL, messages=[
        {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                              "function": {"name": "grade", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "7"}])
    assert not can_reference(tool_turn, prefix_messages=1) and can_reference(request, prefix_messages=1)


# --- the simulator, over sockets -----------------------------------------------------------------


async def test_the_simulator_keeps_caches_as_google_does(start_sim: StartSim) -> None:
    # Implicit caching set to miss every time: what a request reads cached is the explicit cache's alone.
    url = anthropic_base_url(await start_sim(api_key=KEY, gemini_implicit_hit_rate=0.0))
    async with LLMClient(provider="gemini", base_url=url, api_key=KEY) as client:
        api = GeminiCaches(client)
        cache = await api.create(cached_content_body(ChatRequest(model=MODEL, messages=[
            {"role": "system", "content": RUBRIC}]), ttl_s=600, display_name="llm-dispatch:j:g"))
        assert cache.name.startswith("cachedContents/") and cache.tokens > 3000
        assert (await api.find("llm-dispatch:j:g")) == cache and await api.get(cache.name) == cache
        first = await client.chat(referencing_cache(ask("Answer: 1"), name=cache.name, prefix_messages=1))
        plain = [await client.chat(ask("Answer: 1")) for _ in range(2)]
        assert first.cached_tokens == cache.tokens and first.prompt_tokens == plain[0].prompt_tokens
        assert [answer.cached_tokens for answer in plain] == [0, 0]
        kept = await api.update(cache.name, ttl_s=7200)
        assert kept is not None and kept.expire_time is not None and cache.expire_time is not None
        assert kept.expire_time > cache.expire_time
        async with httpx.AsyncClient(headers={"x-goog-api-key": KEY}, timeout=60) as raw:
            again = await raw.post(f"{url}/v1beta/models/{MODEL}:generateContent", json={
                "cachedContent": cache.name, "systemInstruction": {"parts": [{"text": "x"}]},
                "contents": [{"role": "user", "parts": [{"text": "hi"}]}]})
            assert again.status_code == 400 and "system_instruction" in again.json()["error"]["message"]
            # An expiry in the past: gone, as Google forgets an expired cache.
            past = (datetime.now(UTC) - timedelta(minutes=1)).isoformat().replace("+00:00", "Z")
            assert (await raw.patch(f"{url}/v1beta/{cache.name}", json={"expireTime": past})).status_code == 200
            gone = await raw.post(f"{url}/v1beta/models/{MODEL}:generateContent", json={
                "cachedContent": cache.name, "contents": [{"role": "user", "parts": [{"text": "hi"}]}]})
            assert gone.status_code == 404 and gone.json()["error"]["status"] == "NOT_FOUND"
            stats = (await raw.get(f"{url}/_sim/stats")).json()
        assert await api.get(cache.name) is None
        await api.delete(cache.name)  # already gone: no error
    assert stats["gemini_caches"] == 1


# --- the plan ------------------------------------------------------------------------------------


def test_the_plan_makes_an_explicit_cache_for_a_big_group_and_not_for_a_short_one(prices: PriceTable) -> None:
    big = [ask(f"Answer: {n}") for n in range(2000)]
    plan = plan_caches(groups_of(big), total_prompts=2000, concurrency=100, prices=prices)
    [group] = plan.groups
    assert group.action == "explicit" and group.warm_up and group.ttl_s is not None and group.ttl_s > 300
    assert group.planned_cost is not None and group.uncached_cost is not None
    assert group.planned_cost < group.uncached_cost and "vs $" in group.reason and "implicit" in group.reason
    short = [ask(f"Answer: {n}") for n in range(3)]
    plan = plan_caches(groups_of(short), total_prompts=3, concurrency=100, prices=prices)
    assert plan.groups[0].action == "implicit" and "with an explicit cache" in plan.groups[0].reason
    # A model with no storage price is never given one.
    unpriced = [ChatRequest(model="gemini-3.5-flash-lite", messages=[{"role": "system", "content": RUBRIC * 2},
                                                                     request.messages[1]]) for request in big]
    plan = plan_caches(groups_of(unpriced), total_prompts=2000, concurrency=100, prices=prices)
    assert plan.groups[0].action == "implicit" and "no storage price" in plan.groups[0].reason


def test_on_the_batch_lane_a_cache_must_outlive_the_batch(prices: PriceTable) -> None:
    few = plan_caches(groups_of([ask(f"Answer: {n}") for n in range(20)]), total_prompts=20, concurrency=1,
                      prices=prices, lane="batch")
    assert few.groups[0].action == "none" and "as written" in few.groups[0].reason
    requests = [ask(f"Answer: {n}") for n in range(3000)]
    many = plan_caches(groups_of(requests), total_prompts=3000, concurrency=1, prices=prices, lane="batch")
    [group] = many.groups
    assert group.action == "explicit" and not group.warm_up and group.ttl_s is not None and group.ttl_s >= 48 * 3600
    # Without a cache made for it, a line goes as written.
    assert many.prepare(requests[0]) == (requests[0], None)


# --- a run's caches ------------------------------------------------------------------------------


class _Sink:
    def __init__(self) -> None:
        self.results: list[Any] = []

    async def success(self, *, prompt_ids: Any, result: Any, **_: Any) -> None:
        self.results.append(result)

    async def failure(self, **_: Any) -> None:
        raise AssertionError("no request should fail")

    async def release(self, **_: Any) -> None:
        return None


async def _job(sessions: storage.Sessions) -> str:
    return await storage.create_job(sessions, name="caches", input_path="in.jsonl", fingerprint="f" * 64,
                                    model=MODEL, settings={})


async def test_a_run_makes_its_cache_once_reuses_a_lost_create_and_deletes_it(
        start_sim: StartSim, db_url: str, prices: PriceTable) -> None:
    url = anthropic_base_url(await start_sim(api_key=KEY, latency=0.01))
    requests = [ask(f"Answer: {n}") for n in range(40)]
    async with storage.open_database(db_url) as sessions:
        job_id = await _job(sessions)
        async with LLMClient(provider="gemini", base_url=url, api_key=KEY) as client:
            api = GeminiCaches(client)
            ledger = storage.CachedContentLedger(sessions)
            plan = plan_caches(groups_of(requests), total_prompts=40, concurrency=8, prices=prices)
            [group] = plan.groups
            assert group.action == "explicit"
            # A run that was killed after asking for the cache, before its answer was stored: the row says
            # "creating", and the cache exists at Google under our displayName.
            display = cache_display_name(job_id=job_id, group_key=group.group.key)
            await ledger.creating(job_id=job_id, group_key=group.group.key, model=MODEL, display_name=display,
                                  ttl_s=600)
            lost = await api.create(cached_content_body(ChatRequest(model=MODEL, messages=requests[0].messages[:1]),
                                                        ttl_s=600, display_name=display))
            plan.explicit = ExplicitCaches(job_id=job_id, api_of=lambda _model: api, ledger=ledger, prices=prices)
            sink = _Sink()
            await send_all(client=client, items=[WorkItem(prompt_ids=[n], request=request)
                                                 for n, request in enumerate(requests)],
                           sink=sink, concurrency=8, cache_plan=plan)  # type: ignore[arg-type]
            assert (plan.explicit.created, plan.explicit.reused) == (0, 1)
            assert all(result.cached_tokens == lost.tokens for result in sink.results) and len(sink.results) == 40
            # Killed before the delete: the next run finds the named cache live and reuses it (its TTL set again).
            resumed = ExplicitCaches(job_id=job_id, api_of=lambda _model: api, ledger=ledger, prices=prices)
            again = await resumed.reference(requests[0], group=group.group, ttl_s=900)
            assert again is not None and again.params["cachedContent"] == lost.name
            assert (resumed.created, resumed.reused) == (0, 1)
            await plan.explicit.close()
            assert await api.get(lost.name) is None
        [(name, deleted, cost)] = rows(db_url, "SELECT name, deleted, cost_pico_usd FROM cached_contents")
        assert name == lost.name and deleted and cost > 0
        [(key, model, provider, stored, unpriced)] = await storage.cache_storage_costs(sessions, job_id=job_id)
        assert (key, model, provider, stored, unpriced) == (group.group.key, MODEL, "gemini", cost, 0)


async def test_a_cache_that_cannot_be_made_leaves_the_group_as_written(start_sim: StartSim, db_url: str,
                                                                       prices: PriceTable) -> None:
    url = anthropic_base_url(await start_sim(api_key=KEY, latency=0.01))
    requests = [ask(f"Answer: {n}") for n in range(12)]

    class Refusing(GeminiCaches):
        async def create(self, body: dict[str, Any]) -> Any:
            from llm_dispatch.core import BadRequestError  # noqa: PLC0415
            raise BadRequestError("refused", status_code=400)

    async with storage.open_database(db_url) as sessions:
        job_id = await _job(sessions)
        async with LLMClient(provider="gemini", base_url=url, api_key=KEY) as client:
            plan: CachePlan = plan_caches(groups_of(requests), total_prompts=12, concurrency=4, prices=prices)
            plan.explicit = ExplicitCaches(job_id=job_id, api_of=lambda _model: Refusing(client),
                                           ledger=storage.CachedContentLedger(sessions), prices=prices)
            sink = _Sink()
            await send_all(client=client, items=[WorkItem(prompt_ids=[n], request=request)
                                                 for n, request in enumerate(requests)],
                           sink=sink, concurrency=4, cache_plan=plan)  # type: ignore[arg-type]
        assert len(sink.results) == 12 and plan.explicit.created == 0


# --- through the command -------------------------------------------------------------------------


def run_rubric(tmp_path: Path, prefect_api: str, *, prompts: int, urgency: str, options: tuple[str, ...]) -> Any:
    """``llm-dispatch run FILE --simulate`` in a process of its own over ``prompts`` gemini prompts sharing the
    rubric as their system instruction; (the process, the run's database URL)."""
    records = [{"id": f"p{n}", "model": MODEL, "messages": [{"role": "system", "content": RUBRIC},
                                                              {"role": "user", "content": f"Answer: {n}"}],
                "params": {"max_tokens": 8}, "urgency": urgency} for n in range(prompts)]
    path = write_prompts(tmp_path / "gemini-rubric.jsonl", records)
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("LLM_DISPATCH_", "OPENAI_", "ANTHROPIC_", "GEMINI_", "GOOGLE_"))}
    done = cli("run", str(path), "--simulate", "--sim-latency", "0.02", "--json", *options, cwd=tmp_path,
               env={**env, "PREFECT_API_URL": prefect_api, "LLM_DISPATCH_BATCH_POLL_INTERVAL": "0.2"})
    return done, f"sqlite+aiosqlite:///{tmp_path / 'llm_dispatch.db'}"


@pytest.mark.prefect
def test_a_run_on_the_simulator_reads_its_explicit_cache_and_counts_its_storage(prefect_api: str,
                                                                                tmp_path: Path) -> None:
    done, db_url = run_rubric(tmp_path, prefect_api, prompts=60, urgency="urgent", options=("--budget", "1"))
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["counts"] == {"succeeded": 60}
    [(name, deleted, cost)] = rows(db_url, "SELECT name, deleted, cost_pico_usd FROM cached_contents")
    assert name.startswith("cachedContents/") and deleted and cost > 0
    [(cached, prompt)] = rows(db_url, "SELECT SUM(cached_tokens), SUM(prompt_tokens) FROM results")
    assert cached / prompt > 0.9
    [(answers,)] = rows(db_url, "SELECT SUM(cost_pico_usd) FROM results")
    assert summary["cost"]["total"] == pytest.approx((answers + cost) / 1e12, abs=1e-6)
    # The group's report counts the cache in what it paid, and the saving after it.
    [group] = summary["cache"]
    assert group["cache_cost"] == pytest.approx(cost / 1e12, abs=1e-6)
    assert group["cost"] == pytest.approx((answers + cost) / 1e12, abs=1e-6) and group["saved"] > 0
    # The budget held the cache's create and storage before it was made, and spent what the cache cost then (its
    # TTL's storage: it counts no refund for a cache deleted early); nothing is left reserved.
    [(spent, reserved)] = rows(db_url, "SELECT spent_pico_usd, reserved_pico_usd FROM budget_periods")
    assert reserved == 0 and answers + cost <= spent <= answers + cost * 2


@pytest.mark.prefect
def test_a_batch_names_its_groups_cache_made_before_its_lines(prefect_api: str, tmp_path: Path) -> None:
    done, db_url = run_rubric(tmp_path, prefect_api, prompts=1500, urgency="bulk", options=("--wait", "--budget", "5"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["counts"] == {"succeeded": 1500}
    [(name, deleted, cost, ttl, tokens)] = rows(db_url, "SELECT name, deleted, cost_pico_usd, ttl_s, tokens "
                                                        "FROM cached_contents")
    assert name.startswith("cachedContents/") and not deleted and cost > 0 and ttl >= 48 * 3600
    # Every line read the cache, the first too (implicit caching would have missed on it).
    assert rows(db_url, "SELECT route, cached_tokens, COUNT(*) FROM results GROUP BY 1, 2") == [
        ("batch", tokens, 1500)]
    # The submission's budget held the cache's create and its storage for the batch's life before it was made,
    # and spent it; nothing is left reserved.
    [(answers,)] = rows(db_url, "SELECT SUM(cost_pico_usd) FROM results")
    [(spent, reserved)] = rows(db_url, "SELECT spent_pico_usd, reserved_pico_usd FROM budget_periods")
    assert reserved == 0 and spent >= answers + cost


@contextlib.asynccontextmanager
async def cache_api(start_sim: StartSim, db_url: str) -> AsyncIterator[tuple[storage.Sessions, str, GeminiCaches]]:
    """A job in a fresh database and the simulator's cachedContents API: (sessions, job id, the API)."""
    url = anthropic_base_url(await start_sim(api_key=KEY))
    async with storage.open_database(db_url) as sessions:
        job_id = await _job(sessions)
        async with LLMClient(provider="gemini", base_url=url, api_key=KEY) as client:
            yield sessions, job_id, GeminiCaches(client)


async def test_a_jobs_two_halves_keep_their_caches_apart(start_sim: StartSim, db_url: str,
                                                          prices: PriceTable) -> None:
    """dispatch runs both halves at once: the real-time half's cache of a group is not the one batch lines read, so
    deleting it (or its shorter TTL) leaves the batch's alone."""
    requests = [ask(f"Answer: {n}") for n in range(40)]
    [group] = plan_caches(groups_of(requests), total_prompts=40, concurrency=8, prices=prices).groups
    async with cache_api(start_sim, db_url) as (sessions, job_id, api):
        halves = [ExplicitCaches(job_id=job_id, api_of=lambda _model: api, ledger=storage.CachedContentLedger(
            sessions), prices=prices, lane=lane) for lane in ("batch", "realtime")]
        batch, realtime = [await half.reference(requests[0], group=group.group, ttl_s=ttl)
                           for half, ttl in zip(halves, (48 * 3600.0, 300.0))]
        assert batch is not None and realtime is not None
        assert batch.params["cachedContent"] != realtime.params["cachedContent"]
        await halves[1].close()
        assert await api.get(batch.params["cachedContent"]) is not None
        assert await api.get(realtime.params["cachedContent"]) is None
        keys = sorted(key for key, *_ in await storage.cache_storage_costs(sessions, job_id=job_id))
        assert keys == [group.group.key, f"{group.group.key}:batch"]


async def test_a_cache_the_group_outlasts_is_kept_longer_and_shards_keep_their_own(start_sim: StartSim, db_url: str,
                                                                                    prices: PriceTable) -> None:
    """A group sent more slowly than planned (a slow model, rate limits) would outlive its cache's TTL and every later
    request would name a cache Google no longer has: near its end the cache is kept ``ttl_s`` longer, the storage
    counted. Two shards of one job each make and delete a cache of their own."""
    requests = [ask(f"Answer: {n}") for n in range(40)]
    [group] = plan_caches(groups_of(requests), total_prompts=40, concurrency=8, prices=prices).groups
    async with cache_api(start_sim, db_url) as (sessions, job_id, api):
        shards = [ExplicitCaches(job_id=job_id, api_of=lambda _model: api, prices=prices, shard=(index, 2),
                                 ledger=storage.CachedContentLedger(sessions)) for index in (0, 1)]
        first, second = [await shard.reference(requests[0], group=group.group, ttl_s=600.0) for shard in shards]
        assert first is not None and second is not None
        name = first.params["cachedContent"]
        assert name != second.params["cachedContent"]
        [before] = [cost for key, *_, cost, _ in await storage.cache_storage_costs(sessions, job_id=job_id)
                    if key.endswith(":s0of2")]
        # The first shard's cache near its end, as if the group had taken longer than planned.
        key = next(iter(shards[0]._live))
        model, _, created, tokens, _ = shards[0]._live[key]
        shards[0]._live[key] = (model, name, created, tokens, datetime.now(UTC) + timedelta(seconds=60))
        again = await shards[0].reference(requests[1], group=group.group, ttl_s=600.0)
        assert again is not None and again.params["cachedContent"] == name
        kept = await api.get(name)
        assert kept is not None and kept.expire_time is not None
        assert kept.expire_time > datetime.now(UTC) + timedelta(seconds=500)
        [after] = [cost for key, *_, cost, _ in await storage.cache_storage_costs(sessions, job_id=job_id)
                   if key.endswith(":s0of2")]
        assert after > before
        await shards[0].close()
        assert await api.get(name) is None and await api.get(second.params["cachedContent"]) is not None
        await shards[1].close()
