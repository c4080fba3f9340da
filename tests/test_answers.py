"""Answers stored as what they are (issue 24, item 5): tool calls, refusals, truncated answers and reasoning tokens,
both providers. The client's parse on its production path (respx), the simulator's answers over real sockets, and
what a real flow run stores, reports, exports and sends again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import respx

from llm_dispatch.core import to_json
from llm_dispatch import storage
from llm_dispatch.core import ChatRequest, LLMClient
from llm_dispatch.simulator import anthropic_base_url

from conftest import FakeTime, Sim, StartSim, make_client, rows, write_prompts

TOOL = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                         "parameters": {"type": "object", "required": ["city", "days"],
                                                        "properties": {"city": {"type": "string"},
                                                                       "days": {"type": "integer"}}}}}
CLAUDE = "claude-haiku-4-5"


def ask(text: str, *, model: str = "gpt-4o-mini", **params: Any) -> ChatRequest:
    return ChatRequest(model=model, messages=[{"role": "user", "content": text}], params=params)


# --- the client's parse, on its production path ------------------------------------------------


async def test_an_openai_tool_call_refusal_and_reasoning_are_read_from_the_body(
    router: respx.Router, fake_time: FakeTime
) -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}}
    usage = {"prompt_tokens": 20, "completion_tokens": 90, "total_tokens": 110,
             "completion_tokens_details": {"reasoning_tokens": 64}}
    router.post("/chat/completions", name="chat").mock(side_effect=[
        httpx.Response(200, json={"id": "a", "model": "gpt-5.4", "usage": usage, "choices": [
            {"index": 0, "finish_reason": "tool_calls",
             "message": {"role": "assistant", "content": None, "refusal": None, "tool_calls": [call]}}]}),
        httpx.Response(200, json={"id": "b", "model": "gpt-5.4", "usage": usage, "choices": [
            {"index": 0, "finish_reason": "stop",
             "message": {"role": "assistant", "content": None, "refusal": "I can't help with that."}}]}),
    ])
    async with make_client(router, fake_time) as client:
        called = await client.chat(ask("weather?", tools=[TOOL]))
        refused = await client.chat(ask("something harmful"))
    assert (called.text, called.finish_reason, called.tool_calls, called.refusal) == (None, "tool_calls", [call], None)
    assert (called.completion_tokens, called.reasoning_tokens) == (90, 64)
    assert (refused.text, refused.refusal) == (None, "I can't help with that.")


async def test_an_anthropic_tool_use_keeps_its_input_and_a_refusal_its_stop_details() -> None:
    answers = iter([
        {"id": "msg_1", "type": "message", "role": "assistant", "model": CLAUDE, "stop_reason": "tool_use",
         "content": [{"type": "thinking", "thinking": "", "signature": "s"},
                     {"type": "text", "text": "Let me look."},
                     {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                      "input": {"city": "Oslo", "days": 3, "units": {"temp": "C"}}}],
         "usage": {"input_tokens": 30, "output_tokens": 120, "output_tokens_details": {"thinking_tokens": 80}}},
        {"id": "msg_2", "type": "message", "role": "assistant", "model": CLAUDE, "stop_reason": "refusal",
         "content": [], "stop_details": {"type": "refusal", "category": "cyber",
                                         "explanation": "This request was declined."},
         "usage": {"input_tokens": 30, "output_tokens": 0}},
    ])
    transport = httpx.MockTransport(lambda request: httpx.Response(200, json=next(answers)))
    async with LLMClient(provider="anthropic", base_url="https://anthropic.test", api_key="k",
                         transport=transport) as client:
        called = await client.chat(ask("weather?", model=CLAUDE, tools=[TOOL]))
        refused = await client.chat(ask("something harmful", model=CLAUDE))
    assert called.text == "Let me look." and called.finish_reason == "tool_use"
    [tool_call] = called.tool_calls or []
    assert tool_call["id"] == "toolu_1" and tool_call["function"]["name"] == "get_weather"
    # The input, whole, as the arguments' JSON text: what an assistant turn in a prompt file carries back.
    assert json.loads(tool_call["function"]["arguments"]) == {"city": "Oslo", "days": 3, "units": {"temp": "C"}}
    assert (called.completion_tokens, called.reasoning_tokens) == (120, 80)
    assert refused.refusal == "This request was declined. (category: cyber)"
    assert (refused.text, refused.finish_reason, refused.completion_tokens) == (None, "refusal", 0)
    assert (called.maybe_billed, refused.maybe_billed) == (1, 0)  # refused before any output: not billed


# --- the simulator answers as today's APIs do, over real sockets ---------------------------------


async def test_the_simulator_answers_tools_refusals_reasoning_and_tiers_in_openais_shapes(start_sim: StartSim) -> None:
    url = await start_sim()
    async with LLMClient(base_url=url) as client:
        called = await client.chat(ask("What is the weather in Oslo?", tools=[TOOL]))
        refused = await client.chat(ask("[[sim:refuse]] something harmful"))
        thought = await client.chat(ask("Prove it.", model="gpt-5.4", max_completion_tokens=2000))
        short = await client.chat(ask("Prove it at length.", model="gpt-5.4", max_completion_tokens=40))
    [call] = called.tool_calls or []
    assert called.finish_reason == "tool_calls" and called.text is None
    assert call["function"]["name"] == "get_weather"
    assert set(json.loads(call["function"]["arguments"])) == {"city", "days"}
    assert refused.refusal and refused.text is None
    # A reasoning model's reasoning is part of its completion tokens, within max_completion_tokens...
    assert 0 < thought.reasoning_tokens < thought.completion_tokens <= 2000 and thought.finish_reason == "stop"
    # ...and a cap too small for thought and answer is spent thinking: the answer is cut.
    assert short.finish_reason == "length" and short.completion_tokens == 40 and short.reasoning_tokens == 40
    async with httpx.AsyncClient() as raw:
        body = (await raw.post(f"{url}/chat/completions", json={
            "model": "gpt-4o-mini", "service_tier": "fast", "messages": [{"role": "user", "content": "hi"}]})).json()
    assert body["service_tier"] == "priority"  # fast is reported as priority, as OpenAI does


async def test_the_simulator_answers_tool_use_refusal_and_thinking_in_anthropics_shapes(start_sim: StartSim) -> None:
    url = anthropic_base_url(await start_sim())
    async with LLMClient(provider="anthropic", base_url=url, api_key="k") as client:
        called = await client.chat(ask("What is the weather in Oslo?", model=CLAUDE, max_tokens=500, tools=[TOOL]))
        refused = await client.chat(ask("[[sim:refuse]] something harmful", model=CLAUDE, max_tokens=500))
        thought = await client.chat(ask("Prove it.", model=CLAUDE, max_tokens=4000,
                                        thinking={"type": "enabled", "budget_tokens": 2000}))
    [call] = called.tool_calls or []
    assert called.finish_reason == "tool_use" and call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "alpha", "days": 1}
    assert refused.finish_reason == "refusal" and "category: cyber" in (refused.refusal or "")
    assert refused.completion_tokens == 0  # refused before any output: nothing billed
    assert 0 < thought.reasoning_tokens < thought.completion_tokens


# --- what a run stores, reports, exports and sends again ----------------------------------------


@pytest.mark.prefect
async def test_a_run_stores_each_kind_of_answer_and_never_reuses_a_refusal(
    prefect_api: str, sim: Sim, db_url: str, tmp_path: Path
) -> None:
    from llm_dispatch.cli.reports import export
    from llm_dispatch.core import Settings
    from llm_dispatch.flows.realtime import realtime_dispatch

    records = [
        {"id": "plain", "prompt": "Name a river."},
        # The default model (gpt-6-luna) calls function tools on Chat Completions only without reasoning.
        {"id": "tool", "prompt": "Weather in Oslo?", "params": {"tools": [TOOL], "reasoning_effort": "none"}},
        {"id": "claude-tool", "prompt": "Weather in Oslo?", "model": CLAUDE, "params": {"tools": [TOOL], "max_tokens": 300}},
        {"id": "refused", "prompt": "[[sim:refuse]] something harmful"},
        {"id": "refused-again", "prompt": "[[sim:refuse]] something harmful"},
        {"id": "claude-refused", "prompt": "[[sim:refuse]] something harmful", "model": CLAUDE, "params": {"max_tokens": 300}},
        {"id": "cut", "prompt": "Tell me everything.", "params": {"max_tokens": 3}},
        {"id": "reasoned", "prompt": "Prove it.", "model": "gpt-5.4", "params": {"max_completion_tokens": 3000}},
    ]
    path = write_prompts(tmp_path / "kinds.jsonl", records)
    run = {"base_url": sim.base_url, "anthropic_base_url": sim.root, "database_url": db_url}

    summary = to_json(await realtime_dispatch(prompts=str(path), **run))
    assert summary["counts"] == {"succeeded": 5, "refused": 3}
    stats = summary["stats"]
    assert (stats["refused"], stats["truncated"], stats["tool_calls"]) == (3, 1, 2)
    assert stats["reasoning_tokens"] > 0
    # The two identical refused prompts made one request (and share its refusal): 7 requests for 8 prompts.
    assert sim.stats()["requests_total"] == 7
    stored = {cid: (status, route, refusal, cost) for cid, status, route, refusal, cost in rows(db_url, """
        SELECT p.custom_id, r.status, r.route, r.refusal, r.cost_pico_usd FROM results r JOIN prompts p ON p.id = r.prompt_id""")}
    assert stored["refused"][:2] == ("refused", "realtime") and stored["refused-again"][:2] == ("refused", "reused")
    assert stored["refused"][2] and "category: cyber" in stored["claude-refused"][2]
    assert stored["refused"][3] > 0, "a refusal is paid: its cost is stored"
    # Anthropic bills no request refused before any output (its Fable 5 page): stored at 0, its usage kept.
    assert stored["claude-refused"][3] == 0

    out = tmp_path / "export.jsonl"
    await export(settings=Settings(database_url=db_url), job_id=summary["job_id"], fmt="jsonl", output=out,
                 fields=["all"])
    exported = {row["id"]: row for row in map(json.loads, out.read_text().splitlines())}
    assert exported["tool"]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert json.loads(exported["claude-tool"]["tool_calls"][0]["function"]["arguments"])["city"] == "alpha"
    assert exported["cut"]["truncated"] is True and exported["plain"]["truncated"] is False
    assert exported["refused"]["status"] == "refused" and exported["refused"]["refusal"]
    assert exported["reasoned"]["reasoning_tokens"] > 0

    # The same input again sends nothing: a refusal is an answer, not a failure...
    again = to_json(await realtime_dispatch(prompts=str(path), retry_failed="all", **run))
    assert again["sent_prompts"] == 0 and sim.stats()["requests_total"] == 7
    # ...and another job with the identical prompt asks it afresh: a refusal is never reused.
    other = write_prompts(tmp_path / "other.jsonl", [{"id": "x", "prompt": "[[sim:refuse]] something harmful"}])
    await realtime_dispatch(prompts=str(other), **run)
    assert sim.stats()["requests_total"] == 8
    # --retry-refused asks the refused prompts again (one request for the identical two).
    retried = to_json(await realtime_dispatch(prompts=str(path), retry_refused=True, **run))
    assert retried["sent_prompts"] == 3 and sim.stats()["requests_total"] == 10
    assert retried["counts"] == {"succeeded": 5, "refused": 3}


@pytest.mark.prefect
def test_the_cli_table_counts_refusals_apart(prefect_api: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from llm_dispatch.cli.main import app

    monkeypatch.chdir(tmp_path)
    write_prompts(tmp_path / "p.jsonl", [{"id": "a", "prompt": "hello"},
                                         {"id": "b", "prompt": "[[sim:refuse]] something harmful"}])
    result = CliRunner().invoke(app, ["run", "p.jsonl", "--simulate", "--sim-latency", "0.01"])
    assert result.exit_code == 0, result.output  # a refusal is an answer, not a failure
    header = next(line for line in result.output.splitlines() if "succeeded" in line)
    assert "refused" in header
    assert "1 refused (sent again only with --retry-refused)" in result.output
