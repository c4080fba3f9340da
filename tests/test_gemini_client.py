"""LLMClient speaking Gemini (the Developer API's generateContent) through respx on the production send path: the
request as Google's SDK writes it, the answer read back, and Gemini's errors."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import respx

from llm_dispatch.core import (BadRequestError, ChatRequest, ConfigError, InternalServerError, LLMClient,
                               RateLimitError, Settings)
from llm_dispatch.core._providers import provider_for
from llm_dispatch.core.wire._gemini import gemini_body

BASE = "https://generativelanguage.googleapis.test"
KEY = "AIza-gemini-test-0123456789"
MODEL = "gemini-2.5-flash"
HOST = "generativelanguage.googleapis.test"
PATH = f"/v1beta/models/{MODEL}:generateContent"


def answer(**fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "candidates": [{"content": {"role": "model", "parts": [{"text": "Hi there."}]}, "finishReason": "STOP",
                        "index": 0}],
        "usageMetadata": {"promptTokenCount": 12, "candidatesTokenCount": 3, "totalTokenCount": 15},
        "modelVersion": MODEL, "responseId": "resp-1",
    }
    body.update(fields)
    return body


def google_error(status: int, word: str, message: str, *details: dict[str, Any]) -> httpx.Response:
    error: dict[str, Any] = {"code": status, "message": message, "status": word}
    if details:
        error["details"] = list(details)
    return httpx.Response(status, json={"error": error})


def client(**options: Any) -> LLMClient:
    # httpx's own transport, which respx intercepts (the default aiohttp one goes past it).
    return LLMClient(provider="gemini", base_url=BASE, api_key=KEY, transport=httpx.AsyncHTTPTransport(), **options)


async def no_sleep(_seconds: float) -> None:
    return None


def ask(*messages: dict[str, Any], model: str = MODEL, **params: Any) -> ChatRequest:
    return ChatRequest(model=model, messages=list(messages) or [{"role": "user", "content": "Say hi"}],
                       params=params)


# --- the request ---------------------------------------------------------------------------------


@respx.mock
async def test_the_request_goes_where_and_as_the_sdk_sends_it() -> None:
    route = respx.post(host=HOST, path=PATH).mock(return_value=httpx.Response(200, json=answer()))
    async with client() as llm:
        result = await llm.chat(ask({"role": "system", "content": "Be brief."},
                                    {"role": "user", "content": "Say hi"}, max_tokens=64, temperature=0.5,
                                    top_p=0.9, stop=["END"]))
    sent = route.calls.last.request
    assert sent.headers["x-goog-api-key"] == KEY and "authorization" not in sent.headers
    assert json.loads(sent.content) == {
        "contents": [{"role": "user", "parts": [{"text": "Say hi"}]}],
        "systemInstruction": {"parts": [{"text": "Be brief."}], "role": "user"},
        "generationConfig": {"maxOutputTokens": 64, "temperature": 0.5, "topP": 0.9, "stopSequences": ["END"]},
    }
    assert (result.text, result.finish_reason, result.prompt_tokens, result.completion_tokens) == (
        "Hi there.", "STOP", 12, 3)
    assert (result.model, result.response_id) == (MODEL, "resp-1")


def test_a_conversation_with_tools_translates_both_ways() -> None:
    tool = {"type": "function", "function": {"name": "weather", "description": "Today's weather",
                                             "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
    body = gemini_body(ask(
        {"role": "developer", "content": [{"type": "text", "text": "Use tools."}]},
        {"role": "user", "content": [{"type": "text", "text": "Paris?"},
                                     {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}},
            {"id": "c2", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Lyon"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"sky": "clear"}'},
        {"role": "tool", "tool_call_id": "c2", "content": "rain"},
        tools=[tool], tool_choice={"type": "function", "function": {"name": "weather"}}))
    assert body["systemInstruction"] == {"parts": [{"text": "Use tools."}], "role": "user"}
    assert body["contents"] == [
        {"role": "user", "parts": [{"text": "Paris?"}, {"inlineData": {"mimeType": "image/png", "data": "AAAA"}}]},
        {"role": "model", "parts": [{"functionCall": {"name": "weather", "args": {"city": "Paris"}}},
                                    {"functionCall": {"name": "weather", "args": {"city": "Lyon"}}}]},
        {"role": "user", "parts": [{"functionResponse": {"name": "weather", "response": {"sky": "clear"}}},
                                   {"functionResponse": {"name": "weather", "response": {"output": "rain"}}}]},
    ]
    assert body["tools"] == [{"functionDeclarations": [{"name": "weather", "description": "Today's weather",
                                                        "parametersJsonSchema": tool["function"]["parameters"]}]}]
    assert body["toolConfig"] == {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["weather"]}}


@respx.mock
async def test_a_thought_signature_goes_back_with_its_call() -> None:
    part = {"functionCall": {"name": "weather", "args": {"city": "Paris"}}, "thoughtSignature": "c2lnbmVk"}
    respx.post(host=HOST, path="/v1beta/models/gemini-3.8-flash:generateContent").mock(
        return_value=httpx.Response(200, json=answer(
            candidates=[{"content": {"role": "model", "parts": [part]}, "finishReason": "STOP"}])))
    async with client() as llm:
        first = await llm.chat(ask(model="gemini-3.8-flash"))
    assert first.tool_calls is not None
    [call] = first.tool_calls
    assert call["extra_content"] == {"google": {"thought_signature": "c2lnbmVk"}}
    turn = [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": "sunny"}]
    again = gemini_body(ask(*turn, model="gemini-3.8-flash"))
    assert again["contents"][1]["parts"] == [part]
    # A call with no signature of its own (written by hand): Gemini 3 and later get the validator's skip on the
    # turn's first call; 2.5 models, which need none, get nothing.
    bare = {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}
    turn[1] = {"role": "assistant", "content": None, "tool_calls": [bare, {**bare, "id": "c2"}]}
    turn[2] = {"role": "tool", "tool_call_id": "c1", "content": "sunny"}
    turn.append({"role": "tool", "tool_call_id": "c2", "content": "rain"})
    later = gemini_body(ask(*turn, model="gemini-4-hydrogen"))["contents"][1]["parts"]
    assert [p.get("thoughtSignature") for p in later] == ["skip_thought_signature_validator", None]
    older = gemini_body(ask(*turn, model="gemini-2.5-flash-lite"))["contents"][1]["parts"]
    assert [p.get("thoughtSignature") for p in older] == [None, None]


def test_a_schema_and_an_effort_become_generation_config() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    format_ = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    flash = gemini_body(ask(response_format=format_, reasoning_effort="high"))["generationConfig"]
    assert flash == {"responseMimeType": "application/json", "responseJsonSchema": schema,
                     "thinkingConfig": {"thinkingBudget": 24576}}
    later = gemini_body(ask(model="gemini-3.5-flash", reasoning_effort="low"))["generationConfig"]
    assert later == {"thinkingConfig": {"thinkingLevel": "LOW"}}
    with pytest.raises(ValueError, match="cannot turn thinking off"):
        gemini_body(ask(model="gemini-2.5-pro", reasoning_effort="none"))
    with pytest.raises(ValueError, match="'logprobs' has no Gemini equivalent"):
        gemini_body(ask(logprobs=True))
    with pytest.raises(ValueError, match="data: URL"):
        gemini_body(ask({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}))


# --- the answer ----------------------------------------------------------------------------------


@respx.mock
async def test_thinking_is_output_cached_tokens_are_counted_and_thoughts_are_not_text() -> None:
    body = answer(
        candidates=[{"content": {"role": "model", "parts": [{"text": "plan...", "thought": True}, {"text": "42"}]},
                     "finishReason": "STOP"}],
        usageMetadata={"promptTokenCount": 1000, "cachedContentTokenCount": 800, "candidatesTokenCount": 2,
                       "thoughtsTokenCount": 30, "totalTokenCount": 1032})
    respx.post(host=HOST, path=PATH).mock(return_value=httpx.Response(200, json=body))
    async with client() as llm:
        result = await llm.chat(ask())
    assert result.text == "42"
    assert (result.prompt_tokens, result.cached_tokens, result.completion_tokens, result.reasoning_tokens) == (
        1000, 800, 32, 30)


@respx.mock
async def test_max_tokens_truncates_and_safety_or_a_blocked_prompt_refuses() -> None:
    respx.post(host=HOST, path=PATH).mock(side_effect=[
        httpx.Response(200, json=answer(candidates=[{"content": {"role": "model", "parts": [{"text": "Once"}]},
                                                     "finishReason": "MAX_TOKENS"}])),
        httpx.Response(200, json=answer(candidates=[{"finishReason": "SAFETY", "index": 0}])),
        httpx.Response(200, json={"promptFeedback": {"blockReason": "PROHIBITED_CONTENT"},
                                  "usageMetadata": {"promptTokenCount": 9, "totalTokenCount": 9}}),
    ])
    async with client() as llm:
        cut, unsafe, blocked = [await llm.chat(ask()) for _ in range(3)]
    from llm_dispatch.core import TRUNCATED_FINISH_REASONS

    assert cut.finish_reason in TRUNCATED_FINISH_REASONS and cut.refusal is None
    assert unsafe.refusal is not None and "SAFETY" in unsafe.refusal and unsafe.text is None
    assert blocked.refusal is not None and "PROHIBITED_CONTENT" in blocked.refusal and blocked.prompt_tokens == 9


@respx.mock
async def test_a_function_call_is_a_tool_call() -> None:
    part = {"functionCall": {"name": "weather", "args": {"city": "Paris"}}}
    respx.post(host=HOST, path=PATH).mock(return_value=httpx.Response(200, json=answer(
        candidates=[{"content": {"role": "model", "parts": [part]}, "finishReason": "STOP"}])))
    async with client() as llm:
        result = await llm.chat(ask())
    assert result.tool_calls == [{"id": "call_0", "type": "function",
                                  "function": {"name": "weather", "arguments": '{"city":"Paris"}'}}]


# --- errors ------------------------------------------------------------------------------------------

RETRY_INFO = {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "7s"}
QUOTA = {"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": [{"quotaId": "PerMinute"}]}


@respx.mock
async def test_a_429_waits_its_retry_delay_and_a_503_is_retried() -> None:
    route = respx.post(host=HOST, path=PATH).mock(side_effect=[
        google_error(429, "RESOURCE_EXHAUSTED", "You exceeded your current quota.", QUOTA, RETRY_INFO),
        google_error(503, "UNAVAILABLE", "The model is overloaded. Please try again later."),
        httpx.Response(200, json=answer()),
    ])
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    async with client(sleep=sleep, random=lambda: 0.0) as llm:
        result = await llm.chat(ask())
    assert route.call_count == 3 and result.attempts == 3
    assert waits[0] == 7.0  # the RetryInfo's delay, not a backoff


@respx.mock
async def test_a_400_is_never_retried_and_says_invalid_argument() -> None:
    route = respx.post(host=HOST, path=PATH).mock(return_value=google_error(
        400, "INVALID_ARGUMENT", "* GenerateContentRequest.generation_config.temperature: must be in [0.0, 2.0]"))
    async with client(sleep=no_sleep) as llm:
        with pytest.raises(BadRequestError) as caught:
            await llm.chat(ask())
    assert route.call_count == 1 and caught.value.code == "INVALID_ARGUMENT"
    assert str(caught.value).startswith("HTTP 400 from POST /v1beta/models/gemini-2.5-flash:generateContent after "
                                        "1 attempt: INVALID_ARGUMENT: * GenerateContentRequest")


@respx.mock
async def test_a_retry_delay_beyond_the_clients_wait_stops_and_503s_give_up() -> None:
    respx.post(host=HOST, path=PATH).mock(side_effect=[
        google_error(429, "RESOURCE_EXHAUSTED", "Quota exceeded.", {**RETRY_INFO, "retryDelay": "3600s"}),
        *[google_error(503, "UNAVAILABLE", "overloaded")] * 3,
    ])
    async with client(sleep=no_sleep, max_retries=2) as llm:
        with pytest.raises(RateLimitError) as waited:
            await llm.chat(ask())
        with pytest.raises(InternalServerError) as busy:
            await llm.chat(ask())
    assert waited.value.lasting == "wait" and waited.value.attempts == 1
    assert busy.value.attempts == 3 and "Gemini is overloaded" in str(busy.value)


# --- settings and routing ------------------------------------------------------------------------------


def test_gemini_models_go_to_gemini_with_googles_key_names(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("LLM_DISPATCH_GEMINI_API_KEY", "GOOGLE_API_KEY", "GEMINI_API_KEY", "LLM_DISPATCH_GEMINI_BASE_URL",
                 "GEMINI_BASE_URL", "GOOGLE_GEMINI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    assert provider_for("gemini-2.5-pro", settings=Settings()) == "gemini"
    assert provider_for("gemini-2.5-pro", settings=Settings(model_providers={"gemini-*": "openai"})) == "openai"
    assert Settings().gemini_base_url == "https://generativelanguage.googleapis.com"
    monkeypatch.setenv("GEMINI_API_KEY", "from-gemini")
    assert Settings().gemini_api_key is not None and Settings().gemini_api_key.get_secret_value() == "from-gemini"
    # Both set: GOOGLE_API_KEY wins, as google-genai's get_env_api_key decides.
    monkeypatch.setenv("GOOGLE_API_KEY", "from-google")
    assert Settings().gemini_api_key.get_secret_value() == "from-google"  # type: ignore[union-attr]
    monkeypatch.setenv("GEMINI_BASE_URL", "https://proxy.example/")
    settings = Settings()
    assert settings.gemini_base_url == "https://proxy.example"
    assert "from-google" not in json.dumps(settings.public_dict(), default=str)
    assert LLMClient.from_settings(settings, provider="gemini").provider == "gemini"


def test_no_key_for_googles_host_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="GEMINI_API_KEY"):
        LLMClient(provider="gemini", base_url="https://generativelanguage.googleapis.com")
