"""A declared provider goes by its wire everywhere a wire's rules apply: the cache plan (an Anthropic- or Gemini-wire
host gets that wire's caching, an OpenAI-compatible host no prompt_cache_key), Gemini Batch Mode (a declared
Gemini-wire host's batches, under the model name its API knows), and the lanes a prompt is recorded for (a host
with no Batch API is planned real-time, so its estimate is the price it is sent at)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
import respx

from llm_dispatch.core import (
    ChatRequest,
    GeminiBatchApi,
    LLMClient,
    Provider,
    ProviderTable,
    RoutingRules,
    iter_prompts,
    find_prefix_groups,
    plan_caches,
    write_batch_files,
)
from llm_dispatch.jobs._prompt_rows import batchless_providers, new_prompts

RUBRIC = "Grade the answer by the rubric below, point by point. " * 300  # ~3,300 tokens
TABLE = ProviderTable(declared=[
    Provider(name="myclaude", wire="anthropic", base_url="https://claude.example", models=("house-claude",)),
    Provider(name="mygem", wire="gemini", base_url="https://gem.example"),
    Provider(name="vllm", wire="openai", base_url="http://vllm.example/v1", batch_api=False),
])


def group_plan(model: str) -> tuple[str, ChatRequest]:
    requests = [ChatRequest(model=model, messages=[{"role": "system", "content": RUBRIC},
                                                   {"role": "user", "content": f"item {i}"}],
                            params={"max_tokens": 16}) for i in range(20)]
    plan = plan_caches(find_prefix_groups(enumerate(requests), provider_of=TABLE.cache_rules_of),
                       total_prompts=20, concurrency=10)
    [group] = plan.groups
    return group.action, plan.prepare(requests[1])[0]


def test_a_declared_anthropic_wire_host_gets_a_breakpoint_never_a_prompt_cache_key() -> None:
    action, sent = group_plan("myclaude/claude-sonnet-4-5")
    assert action == "breakpoint"
    assert "prompt_cache_key" not in sent.params
    assert sent.messages[0]["content"][-1]["cache_control"] == {"type": "ephemeral"}


def test_a_declared_openai_compatible_host_is_warmed_first_and_sent_as_written() -> None:
    action, sent = group_plan("vllm/llama-3.3-70b")
    assert action == "implicit"
    assert "prompt_cache_key" not in sent.params and sent.messages[0]["content"] == RUBRIC
    assert group_plan("gpt-4o-mini")[0] == "keys"  # OpenAI's own API keeps its keys


async def test_a_declared_gemini_wire_host_creates_its_batch_under_the_model_name_its_api_knows(
        tmp_path: Path) -> None:
    router = respx.Router(base_url="https://gem.example", assert_all_called=True)
    route = router.post("/v1beta/models/gemini-2.5-flash:batchGenerateContent").respond(200, json={
        "name": "batches/b1", "metadata": {"displayName": "llm-dispatch:jjjjjjjj:7", "state": "BATCH_STATE_PENDING",
                                           "createTime": "2026-11-28T12:00:01Z", "model": "models/gemini-2.5-flash"}})
    client = LLMClient(provider="mygem", wire="gemini", base_url="https://gem.example", api_key="AIza-test",
                       transport=httpx.MockTransport(router.async_handler))
    [file] = write_batch_files([("p1", ChatRequest(model="gemini-2.5-flash", messages=[{"role": "user", "content": "Hi"}]))],
                               directory=tmp_path)

    class Record:
        id, job_id, model, endpoint = 7, "j" * 8, "mygem/gemini-2.5-flash", "chat"
        created_at, request_total = datetime(2026, 11, 28, 12, tzinfo=UTC), 1
        provider_batch_id = output_file_id = error_file_id = None

    async def nothing_lost() -> None:
        return None

    backend = GeminiBatchApi(client)
    assert await backend.upload(file.path) is None
    await backend.create(record=Record(), path=file.path, input_file_id=None, metadata={}, max_retries=0,  # type: ignore[arg-type]
                         find_lost=nothing_lost)
    assert json.loads(route.calls.last.request.content)["batch"]["displayName"] == "llm-dispatch:jjjjjjjj:7"
    await client.aclose()


def test_a_bulk_prompt_of_a_host_without_a_batch_api_is_planned_real_time(tmp_path: Path) -> None:
    path = tmp_path / "bulk.jsonl"
    path.write_text("".join(json.dumps({"id": f"{model}-{i}", "prompt": "q", "model": model, "urgency": "bulk"}) + "\n"
                            for model in ("vllm/llama-3.3-70b", "gpt-4o-mini") for i in range(2)))
    specs = list(iter_prompts(path, default_model="gpt-4o-mini", model_providers=TABLE))
    without = batchless_providers(TABLE)
    assert set(without) == {"vllm"}
    rows = list(new_prompts(specs, rules=RoutingRules(), now=datetime.now(UTC), without_batches=without))
    assert {(row.provider, row.planned_route) for row in rows} == {("vllm", "realtime"), ("openai", "batch")}
    assert {row.route_reason for row in rows if row.provider == "vllm"} == {
        "vllm has no Batch API (batch_api = false in the providers file); sent real-time"}
