"""Gemini real-time over real sockets: the Gemini LLMClient (its default aiohttp transport) against the simulator's
generateContent, and raw HTTP against it, for what the wire carries, the answers read back, and Gemini's errors."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio

from llm_dispatch.core import (BadRequestError, ChatRequest, InternalServerError, LLMClient, NotFoundError,
                               PermissionDeniedError, RateLimitError)
from llm_dispatch.simulator import anthropic_base_url

from conftest import StartSim

MODEL = "gemini-2.5-flash"
KEY = "gemini-socket-key"
PATH = f"/v1beta/models/{MODEL}:generateContent"


def ask(text: str = "Name three rivers.", *, model: str = MODEL, **params: Any) -> ChatRequest:
    return ChatRequest(model=model, messages=[{"role": "user", "content": text}], params=params)


def gemini(url: str, **options: Any) -> LLMClient:
    return LLMClient(provider="gemini", base_url=url, api_key=KEY, **options)


async def gemini_sim(start_sim: StartSim, **fields: Any) -> str:
    return anthropic_base_url(await start_sim(**fields))


@pytest_asyncio.fixture(loop_scope="function")
async def raw() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(headers={"x-goog-api-key": KEY}, timeout=60) as client:
        yield client


# --- answers -------------------------------------------------------------------------------


async def test_an_answer_comes_back_with_its_usage(start_sim: StartSim, raw: httpx.AsyncClient) -> None:
    url = await gemini_sim(start_sim, api_key=KEY)
    async with gemini(url) as llm:
        first = await llm.chat(ask(max_tokens=400))
        again = await llm.chat(ask(max_tokens=400))
    assert first.text and first.finish_reason == "STOP" and first.refusal is None
    assert first.prompt_tokens > 0 and 0 < first.completion_tokens <= 400
    assert first.model == MODEL and first.response_id
    assert (again.text, again.completion_tokens) == (first.text, first.completion_tokens)
    counters = (await raw.get(f"{url}/_sim/stats")).json()
    assert (counters["generate_contents"], counters["messages"], counters["completions"]) == (2, 0, 0)


async def test_max_output_tokens_truncates_and_thinking_is_billed_as_output(start_sim: StartSim) -> None:
    url = await gemini_sim(start_sim, api_key=KEY)
    async with gemini(url) as llm:
        cut = await llm.chat(ask("Tell me a very long story about rivers.", max_tokens=3))
        thought = await llm.chat(ask(max_tokens=2000, reasoning_effort="medium"))
    assert cut.finish_reason == "MAX_TOKENS" and cut.completion_tokens == 3
    assert thought.reasoning_tokens > 0
    assert thought.completion_tokens > thought.reasoning_tokens  # the answer's own tokens, and its thoughts


async def test_a_safety_stop_is_a_refusal(start_sim: StartSim) -> None:
    url = await gemini_sim(start_sim, api_key=KEY)
    async with gemini(url) as llm:
        result = await llm.chat(ask("How do I pick a lock? [[sim:refuse]]"))
    assert result.refusal is not None and "SAFETY" in result.refusal
    assert result.text is None and result.completion_tokens == 0


async def test_a_function_call_comes_back_as_a_tool_call(start_sim: StartSim) -> None:
    url = await gemini_sim(start_sim, api_key=KEY)
    tool = {"type": "function", "function": {"name": "weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    async with gemini(url) as llm:
        result = await llm.chat(ask("Weather in Paris?", tools=[tool], tool_choice="required"))
    assert result.tool_calls is not None and len(result.tool_calls) == 1
    call = result.tool_calls[0]
    assert call["type"] == "function" and call["function"]["name"] == "weather"
    assert '"city"' in call["function"]["arguments"]


async def test_a_json_schema_is_answered_in_json(start_sim: StartSim) -> None:
    url = await gemini_sim(start_sim, api_key=KEY)
    schema = {"type": "object", "properties": {"river": {"type": "string"}}, "required": ["river"]}
    response_format = {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}}
    async with gemini(url) as llm:
        result = await llm.chat(ask(response_format=response_format))
    assert result.text is not None and result.text.startswith('{"river":')


# --- what crosses the wire ----------------------------------------------------------------------


async def test_the_raw_request_is_googles_shape(start_sim: StartSim, raw: httpx.AsyncClient) -> None:
    url = await gemini_sim(start_sim, api_key=KEY)
    body = {"systemInstruction": {"parts": [{"text": "Be brief."}], "role": "user"},
            "contents": [{"role": "user", "parts": [{"text": "Hi"}]}],
            "generationConfig": {"maxOutputTokens": 50, "temperature": 0.3}}
    answer = await raw.post(f"{url}{PATH}", json=body)
    assert answer.status_code == 200
    data = answer.json()
    assert data["candidates"][0]["content"]["role"] == "model"
    assert set(data["usageMetadata"]) >= {"promptTokenCount", "candidatesTokenCount", "totalTokenCount"}
    # No rate-limit headers, ever: Gemini sends none.
    assert not [name for name in answer.headers if "ratelimit" in name.lower()]


async def test_a_field_gemini_does_not_know_is_a_400(start_sim: StartSim, raw: httpx.AsyncClient) -> None:
    url = await gemini_sim(start_sim, api_key=KEY)
    answer = await raw.post(f"{url}{PATH}", json={"contents": [{"role": "user", "parts": [{"text": "Hi"}]}],
                                                    "model": MODEL})
    assert answer.status_code == 400
    assert answer.json()["error"]["status"] == "INVALID_ARGUMENT"
    assert 'Unknown name "model"' in answer.json()["error"]["message"]


# --- errors ------------------------------------------------------------------------------------------


async def test_a_429_waits_what_its_retry_info_asks(start_sim: StartSim) -> None:
    url = await gemini_sim(start_sim, api_key=KEY, retry_after=0.2)
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    async with gemini(url, sleep=sleep) as llm:
        result = await llm.chat(ask("Hello [[sim:429x2]]"))
    assert result.text and result.attempts == 3
    # Every wait (each retry's, and the pause every caller shares after a quota 429) is the 0.2 s the RetryInfo
    # asked, grown a little from it for a retry: none is the 0.375 to 0.5 s backoff of a 429 that says nothing.
    retries = [wait for wait in waits if wait >= 0.2]
    assert len(retries) >= 2 and max(waits) < 0.3


async def test_a_retry_delay_longer_than_the_client_waits_is_not_waited(start_sim: StartSim) -> None:
    url = await gemini_sim(start_sim, api_key=KEY, retry_after=600)
    async with gemini(url, max_retry_after=60) as llm:
        with pytest.raises(RateLimitError) as caught:
            await llm.chat(ask("Hello [[sim:429]]"))
    error = caught.value
    assert error.attempts == 1 and error.lasting == "wait"
    assert "RESOURCE_EXHAUSTED" in str(error) and "wait 600 s" in str(error)


async def test_a_503_is_retried_and_a_400_is_named_and_not(start_sim: StartSim) -> None:
    url = await gemini_sim(start_sim, api_key=KEY)
    async with gemini(url, max_retries=3) as llm:
        answered = await llm.chat(ask("Hello [[sim:503x1]]"))
        with pytest.raises(BadRequestError) as caught:
            await llm.chat(ask("Hello [[sim:400]]"))
        with pytest.raises(InternalServerError) as overloaded:
            await llm.chat(ask("Hello [[sim:503x9]]"))
    assert answered.text and answered.attempts == 2
    assert caught.value.attempts == 1 and caught.value.code == "INVALID_ARGUMENT"
    assert "INVALID_ARGUMENT" in str(caught.value)
    assert overloaded.value.attempts == 4 and "UNAVAILABLE" in str(overloaded.value)


async def test_an_unknown_model_is_a_404_that_stops_the_model(start_sim: StartSim) -> None:
    url = await gemini_sim(start_sim, api_key=KEY, models=[MODEL])
    async with gemini(url) as llm:
        with pytest.raises(NotFoundError) as caught:
            await llm.chat(ask(model="gemini-0-nope"))
    assert caught.value.lasting == "model" and caught.value.attempts == 1
    assert "LLM_DISPATCH_GEMINI_BASE_URL" in str(caught.value)


async def test_a_wrong_key_is_a_lasting_key_failure(start_sim: StartSim) -> None:
    url = await gemini_sim(start_sim, api_key="another")
    async with gemini(url) as llm:
        with pytest.raises(BadRequestError) as wrong:
            await llm.chat(ask())
    assert wrong.value.lasting == "key" and wrong.value.code == "API_KEY_INVALID"
    assert KEY not in str(wrong.value)
    async with LLMClient(provider="gemini", base_url=url) as keyless:
        with pytest.raises(PermissionDeniedError) as missing:
            await keyless.chat(ask())
    assert missing.value.lasting == "access"


async def test_what_a_model_refuses_is_the_simulators_400(start_sim: StartSim, raw: httpx.AsyncClient) -> None:
    url = await gemini_sim(start_sim, api_key=KEY)
    body = {"contents": [{"role": "user", "parts": [{"text": "Hi"}]}],
            "generationConfig": {"thinkingConfig": {"thinkingBudget": 0}}}
    answer = await raw.post(f"{url}/v1beta/models/gemini-2.5-pro:generateContent", json=body)
    assert answer.status_code == 400 and "between 128 and 32768" in answer.json()["error"]["message"]


async def test_a_tool_conversation_carries_its_thought_signature_back(start_sim: StartSim) -> None:
    url = await gemini_sim(start_sim, api_key=KEY)
    tool = {"type": "function", "function": {"name": "weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    first_turn = [{"role": "user", "content": "Weather in Paris?"}]
    async with gemini(url) as llm:
        called = await llm.chat(ChatRequest(model="gemini-3.8-flash", messages=first_turn, params={"tools": [tool]}))
        assert called.tool_calls is not None
        [call] = called.tool_calls
        assert call["extra_content"]["google"]["thought_signature"]
        answered = [*first_turn, {"role": "assistant", "content": None, "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": call["id"], "content": "sunny"}]
        again = await llm.chat(ChatRequest(model="gemini-3.8-flash", messages=answered,
                                           params={"tools": [tool], "tool_choice": "none"}))
        # A call written by hand has no signature: the validator's skip goes with it, and the model answers.
        del call["extra_content"]
        by_hand = await llm.chat(ChatRequest(model="gemini-3.8-flash", messages=answered,
                                             params={"tools": [tool], "tool_choice": "none"}))
    assert again.text and by_hand.text


async def test_an_unsigned_call_of_the_current_turn_is_geminis_400(start_sim: StartSim,
                                                                  raw: httpx.AsyncClient) -> None:
    url = await gemini_sim(start_sim, api_key=KEY)
    body = {"contents": [{"role": "user", "parts": [{"text": "Weather?"}]},
                         {"role": "model", "parts": [{"functionCall": {"name": "weather", "args": {}}}]},
                         {"role": "user", "parts": [{"functionResponse": {"name": "weather",
                                                                          "response": {"output": "sunny"}}}]}]}
    answer = await raw.post(f"{url}/v1beta/models/gemini-4-hydrogen:generateContent", json=body)
    assert answer.status_code == 400 and "missing a thought_signature" in answer.json()["error"]["message"]
    older = await raw.post(f"{url}/v1beta/models/gemini-2.5-flash-lite:generateContent", json=body)
    assert older.status_code == 200
