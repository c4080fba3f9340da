"""LLMClient against respx routes (through httpx.MockTransport, no patching) and a tiny real aiohttp server."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest
import respx
from aiohttp import web
from pydantic import SecretStr

from llm_dispatch.core import OpenAIBatchApi
from llm_dispatch.core.http._client import LLMClient, default_transport
from llm_dispatch.core._exceptions import (
    APIConnectionError,
    APIResponseValidationError,
    APIStatusError,
    APITimeoutError,
    AuthenticationError,
    BadRequestError,
    InternalServerError,
    NotFoundError,
    PermissionDeniedError,
    RateLimitError,
    UnprocessableEntityError,
)
from llm_dispatch.core._settings import Settings
from llm_dispatch.core._types import ChatRequest

from conftest import API_KEY, BASE_URL, FakeTime, make_client

REQUEST = ChatRequest(model="gpt-4o-mini", messages=[{"role": "user", "content": "Say hi"}], params={"max_tokens": 5})


async def chat_error(client: LLMClient, error: type[Exception]) -> Any:
    """The error ``client.chat(REQUEST)`` raises, which must be an ``error``."""
    async with client:
        with pytest.raises(error) as caught:
            await client.chat(REQUEST)
    return caught.value


def completion(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "gpt-4o-mini-2024-07-18",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi!"}, "finish_reason": "stop"}],
        "usage": {
            "prompt_tokens": 12,
            "completion_tokens": 3,
            "total_tokens": 15,
            "prompt_tokens_details": {"cached_tokens": 8},
        },
    }
    body.update(overrides)
    return body


# --- success ----------------------------------------------------------------------------------


async def test_success_is_parsed_into_a_chat_result(router: respx.Router, fake_time: FakeTime) -> None:
    route = router.post("/chat/completions", name="chat").respond(200, json=completion())
    async with make_client(router, fake_time) as client:
        result = await client.chat(REQUEST)
    assert route.call_count == 1
    sent = route.calls.last.request
    assert sent.url == f"{BASE_URL}/chat/completions"
    assert json.loads(sent.content) == REQUEST.body()
    assert result.text == "Hi!"
    assert result.finish_reason == "stop"
    assert (result.prompt_tokens, result.completion_tokens, result.cached_tokens) == (12, 3, 8)
    assert result.model == "gpt-4o-mini-2024-07-18"
    assert result.response_id == "chatcmpl-1"
    assert result.attempts == 1
    assert result.latency_s == 0.0  # nothing slept on the fake clock
    assert fake_time.sleeps == []


async def test_usage_without_details_counts_no_cached_tokens(router: respx.Router, fake_time: FakeTime) -> None:
    router.post("/chat/completions", name="chat").respond(
        200, json=completion(usage={"prompt_tokens": 5, "completion_tokens": 2})
    )
    async with make_client(router, fake_time) as client:
        result = await client.chat(REQUEST)
    assert (result.prompt_tokens, result.completion_tokens, result.cached_tokens) == (5, 2, 0)


async def test_real_latency_covers_the_whole_call(router: respx.Router) -> None:
    async def slow(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(0.05)
        return httpx.Response(200, json=completion())

    router.post("/chat/completions", name="chat").mock(side_effect=slow)
    async with LLMClient(base_url=BASE_URL, transport=httpx.MockTransport(router.async_handler)) as client:
        result = await client.chat(REQUEST)
    assert 0.05 <= result.latency_s < 1.0


# --- retries ----------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [408, 409, 429, 500, 502, 503, 504])
async def test_retryable_status_then_success(router: respx.Router, fake_time: FakeTime, status: int) -> None:
    route = router.post("/chat/completions", name="chat").mock(
        side_effect=[
            httpx.Response(status, json={"error": {"message": "try again"}}),
            httpx.Response(200, json=completion()),
        ]
    )
    async with make_client(router, fake_time) as client:
        result = await client.chat(REQUEST)
    assert route.call_count == 2
    assert fake_time.sleeps == [0.5]
    assert result.attempts == 2
    assert result.latency_s == 0.5


@pytest.mark.parametrize(
    ("headers", "delay"),
    [({"retry-after": "1"}, 1.0), ({"retry-after-ms": "250"}, 0.25), ({"retry-after": "120"}, 120.0)],
)
async def test_retry_after_is_passed_to_sleep(
    router: respx.Router, fake_time: FakeTime, headers: dict[str, str], delay: float
) -> None:
    route = router.post("/chat/completions", name="chat").mock(
        side_effect=[httpx.Response(429, headers=headers), httpx.Response(200, json=completion())]
    )
    async with make_client(router, fake_time) as client:
        await client.chat(REQUEST)
    assert route.call_count == 2
    assert fake_time.sleeps == [delay]


@pytest.mark.parametrize("headers", [{"retry-after": "121"}, {"retry-after-ms": "300000"},
                                     {"retry-after": "500", "x-should-retry": "true"}])
async def test_a_retry_after_above_two_minutes_is_not_retried_and_says_when_to_come_back(
    router: respx.Router, fake_time: FakeTime, headers: dict[str, str]
) -> None:
    """openai-python now honours a Retry-After up to 120 s and, beyond it, surfaces the error (it beats
    x-should-retry): not retried, kept for a later run, with a hint that says how long the provider asked."""
    route = router.post("/chat/completions", name="chat").respond(429, headers=headers)
    error = await chat_error(make_client(router, fake_time), RateLimitError)
    assert route.call_count == 1 and fake_time.sleeps == []
    assert "longer than the 120 s llm-dispatch waits" in str(error) and "run the same command again" in str(error)
    assert error.lasting == "wait" and error.retryable


@pytest.mark.parametrize(
    ("status", "error_class"),
    [
        (400, BadRequestError),
        (401, AuthenticationError),
        (403, PermissionDeniedError),
        (404, NotFoundError),
        (422, UnprocessableEntityError),
    ],
)
async def test_non_retryable_status_raises_its_class_after_one_call(
    router: respx.Router, fake_time: FakeTime, status: int, error_class: type[APIStatusError]
) -> None:
    route = router.post("/chat/completions", name="chat").respond(
        status, json={"error": {"message": "The model `nope` does not exist"}}, headers={"x-request-id": "req_123"}
    )
    error = await chat_error(make_client(router, fake_time), error_class)
    assert route.call_count == 1
    assert fake_time.sleeps == []
    assert error.status_code == status
    assert error.attempts == 1
    assert error.request_id == "req_123"
    assert "The model `nope` does not exist" in str(error)
    assert "req_123" in str(error)


async def test_x_should_retry_true_retries_a_400(router: respx.Router, fake_time: FakeTime) -> None:
    route = router.post("/chat/completions", name="chat").mock(
        side_effect=[httpx.Response(400, headers={"x-should-retry": "true"}), httpx.Response(200, json=completion())]
    )
    async with make_client(router, fake_time) as client:
        await client.chat(REQUEST)
    assert route.call_count == 2


async def test_x_should_retry_false_stops_a_500(router: respx.Router, fake_time: FakeTime) -> None:
    route = router.post("/chat/completions", name="chat").respond(500, headers={"x-should-retry": "false"})
    error = await chat_error(make_client(router, fake_time), InternalServerError)
    assert route.call_count == 1
    # The error says what the loop decided, so a later run does not send again what the provider said not to.
    assert error.retryable is False


async def test_retries_exhausted_raises_with_every_attempt_counted(router: respx.Router, fake_time: FakeTime) -> None:
    route = router.post("/chat/completions", name="chat").respond(503, text="upstream overloaded")
    error = await chat_error(make_client(router, fake_time, max_retries=3), InternalServerError)
    assert route.call_count == 4
    assert error.attempts == 4
    assert fake_time.sleeps == [0.5, 1.0, 2.0]
    assert "upstream overloaded" in str(error)


async def test_max_retries_zero_sends_once(router: respx.Router, fake_time: FakeTime) -> None:
    route = router.post("/chat/completions", name="chat").respond(429)
    error = await chat_error(make_client(router, fake_time, max_retries=0), RateLimitError)
    assert route.call_count == 1
    assert error.attempts == 1


# --- timeouts and dropped connections (mocked) ------------------------------------------------


async def test_a_timed_out_generation_is_tried_again_once_and_each_attempt_counted_as_maybe_billed(
    router: respx.Router, fake_time: FakeTime
) -> None:
    """A read timeout came after the request was sent: the model may have been generating (and billing). Tried
    again once, whatever max_retries says; then not sent again, by this run or a later one."""
    route = router.post("/chat/completions", name="chat").mock(side_effect=httpx.ReadTimeout)
    error = await chat_error(make_client(router, fake_time, max_retries=5), APITimeoutError)
    assert route.call_count == 2 and error.attempts == 2
    assert error.maybe_billed == 2 and not error.retryable
    assert "not back within its deadline on 2 attempts" in str(error) and "each may have been billed" in str(error)
    assert isinstance(error.__cause__, httpx.ReadTimeout)


async def test_a_connect_timeout_is_retried_as_often_as_any_connection_error(
    router: respx.Router, fake_time: FakeTime
) -> None:
    """The request never reached the server: nothing was generated or billed."""
    route = router.post("/chat/completions", name="chat").mock(side_effect=httpx.ConnectTimeout)
    error = await chat_error(make_client(router, fake_time, max_retries=2), APITimeoutError)
    assert route.call_count == 3 and error.maybe_billed == 0 and error.retryable


async def test_timeout_then_success(router: respx.Router, fake_time: FakeTime) -> None:
    route = router.post("/chat/completions", name="chat").mock(
        side_effect=[httpx.ReadTimeout("slow"), httpx.Response(200, json=completion())]
    )
    async with make_client(router, fake_time) as client:
        result = await client.chat(REQUEST)
    assert route.call_count == 2
    assert result.attempts == 2 and result.maybe_billed == 2


class _CutStream(httpx.AsyncByteStream):
    """A body that stops half way: the status line and headers came, the rest never does."""

    async def __aiter__(self):  # type: ignore[no-untyped-def]
        yield b'{"id": "chatcmpl-1", "choices": ['
        raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")


async def test_a_2xx_cut_off_after_its_status_line_is_tried_again_once(router: respx.Router, fake_time: FakeTime) -> None:
    route = router.post("/chat/completions", name="chat").mock(
        side_effect=lambda request: httpx.Response(200, headers={"content-length": "500"}, stream=_CutStream()))
    error = await chat_error(make_client(router, fake_time, max_retries=5), APIConnectionError)
    assert route.call_count == 2 and error.maybe_billed == 2 and not error.retryable
    assert "cut off after its status line on 2 attempts" in str(error)


async def test_remote_protocol_error_is_a_connection_error_not_a_timeout(
    router: respx.Router, fake_time: FakeTime
) -> None:
    route = router.post("/chat/completions", name="chat").mock(side_effect=httpx.RemoteProtocolError)
    error = await chat_error(make_client(router, fake_time, max_retries=1), APIConnectionError)
    assert not isinstance(error, APITimeoutError)
    assert route.call_count == 2


@pytest.mark.parametrize(
    ("cause", "expected"),
    [
        (aiohttp.ServerDisconnectedError(), APIConnectionError),
        (ConnectionResetError(104, "Connection reset by peer"), APIConnectionError),
        (aiohttp.SocketTimeoutError("Timeout on reading data from socket"), APITimeoutError),
    ],
    ids=["disconnect", "reset", "socket-timeout"],
)
async def test_transport_errors_are_classified_by_their_cause(
    fake_time: FakeTime, cause: Exception, expected: type[APIConnectionError]
) -> None:
    # httpx-aiohttp raises httpx.ConnectTimeout for every aiohttp ClientConnectionError, a dropped
    # connection included. A plain MockTransport, since respx re-chains the exceptions it raises.
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectTimeout(str(cause)) from cause

    error = await chat_error(make_client(respx.Router(), fake_time, max_retries=0, transport=httpx.MockTransport(handler)), APIConnectionError)
    assert type(error) is expected
    assert type(cause).__name__ in str(error)


async def test_aiohttp_disconnect_mapped_to_connect_timeout_is_still_a_connection_error(fake_time: FakeTime) -> None:
    def dropped(request: httpx.Request) -> httpx.Response:
        try:
            raise aiohttp.ServerDisconnectedError()
        except aiohttp.ServerDisconnectedError as exc:
            raise httpx.ConnectTimeout("Server disconnected") from exc

    error = await chat_error(make_client(respx.Router(), fake_time, max_retries=0, transport=httpx.MockTransport(dropped)), APIConnectionError)
    assert not isinstance(error, APITimeoutError)
    assert "ServerDisconnectedError" in str(error)


# --- bodies that are not chat completions -----------------------------------------------------


@pytest.mark.parametrize(
    "response",
    [
        httpx.Response(200, text="<html>Bad gateway</html>"),
        httpx.Response(200, json={"object": "list", "data": []}),
        httpx.Response(200, json={"choices": []}),
        httpx.Response(200, json=[1, 2, 3]),
    ],
    ids=["not-json", "no-choices", "empty-choices", "not-an-object"],
)
async def test_a_2xx_that_is_not_an_answer_is_never_sent_again(
    router: respx.Router, fake_time: FakeTime, response: httpx.Response
) -> None:
    """As openai-python and Anthropic's SDK: a 2xx that was read is never resent (it may have been billed)."""
    route = router.post("/chat/completions", name="chat").mock(return_value=response)
    error = await chat_error(make_client(router, fake_time, max_retries=5), APIResponseValidationError)
    assert route.call_count == 1 and error.attempts == 1
    assert not error.retryable and "HTTP 200 was received and may have been billed" in str(error)
    assert error.usage is None  # it said nothing of what it used


@pytest.mark.parametrize("body", [
    {"id": "c", "model": "gpt-4o-mini", "choices": [],
     "usage": {"prompt_tokens": 40, "completion_tokens": 7, "total_tokens": 47,
               "completion_tokens_details": {"reasoning_tokens": 5}}},
    {"error": {"message": "The server had an error", "type": "server_error"},
     "usage": {"prompt_tokens": 40, "completion_tokens": 7, "total_tokens": 47,
               "completion_tokens_details": {"reasoning_tokens": 5}}},
], ids=["empty-choices", "error-body"])
async def test_a_2xx_with_no_answer_carries_the_usage_it_reported(
    router: respx.Router, fake_time: FakeTime, body: dict[str, Any]
) -> None:
    router.post("/chat/completions", name="chat").respond(200, json=body)
    error = await chat_error(make_client(router, fake_time), APIResponseValidationError)
    usage = error.usage
    assert usage is not None and usage.text is None
    assert (usage.prompt_tokens, usage.completion_tokens, usage.reasoning_tokens) == (40, 7, 5)


# --- secrets and auth headers -----------------------------------------------------------------


async def test_api_key_never_shows_in_errors_logs_or_repr(
    router: respx.Router, fake_time: FakeTime, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    echo = {"error": {"message": f"Incorrect API key provided: {API_KEY}."}}
    route = router.post("/chat/completions", name="chat").mock(
        side_effect=[httpx.Response(500, json=echo), httpx.Response(401, json=echo)]
    )
    client = make_client(router, fake_time, api_key=SecretStr(API_KEY))
    async with client:
        with pytest.raises(AuthenticationError) as caught:
            await client.chat(REQUEST)
    assert route.call_count == 2
    assert route.calls.last.request.headers["authorization"] == f"Bearer {API_KEY}"
    assert "Incorrect API key provided" in str(caught.value)
    for text in (str(caught.value), repr(caught.value), caught.value.message, caplog.text, repr(client)):
        assert API_KEY not in text
    assert "retrying" in caplog.text  # the retry itself was logged


@pytest.mark.parametrize(
    ("auth_header", "expected", "absent"),
    [
        ("authorization", ("authorization", f"Bearer {API_KEY}"), "api-key"),
        ("api-key", ("api-key", API_KEY), "authorization"),
    ],
)
async def test_auth_header_style(
    router: respx.Router, fake_time: FakeTime, auth_header: str, expected: tuple[str, str], absent: str
) -> None:
    route = router.post("/chat/completions", name="chat").respond(200, json=completion())
    async with make_client(router, fake_time, auth_header=auth_header) as client:
        await client.chat(REQUEST)
    headers = route.calls.last.request.headers
    assert headers[expected[0]] == expected[1]
    assert absent not in headers


async def test_no_key_sends_no_auth_header(router: respx.Router, fake_time: FakeTime) -> None:
    route = router.post("/chat/completions", name="chat").respond(200, json=completion())
    async with make_client(router, fake_time, api_key=None) as client:
        await client.chat(REQUEST)
    assert "authorization" not in route.calls.last.request.headers


async def test_from_settings(router: respx.Router) -> None:
    settings = Settings(
        api_key=API_KEY, base_url=BASE_URL + "/", auth_header="api-key", concurrency=7, max_retries=1, tpm=10_000
    )
    # A 1 ms Retry-After keeps the one real retry sleep out of the test's time.
    route = router.post("/chat/completions", name="chat").respond(429, headers={"retry-after-ms": "1"})
    async with LLMClient.from_settings(settings, transport=httpx.MockTransport(router.async_handler)) as client:
        assert client.limiter.ceiling == 7
        with pytest.raises(RateLimitError) as caught:
            await client.chat(REQUEST)
    assert route.call_count == 2 and caught.value.attempts == 2
    assert route.calls.last.request.headers["api-key"] == API_KEY


ORG_ID, PROJECT_ID = "org-SECRETorg0123", "proj_SECRETproject0123"


async def test_organization_and_project_go_as_openai_headers_from_their_environment_names(
    router: respx.Router, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """OPENAI_ORG_ID / OPENAI_PROJECT_ID are sent as openai-python sends them, on every call (batches and files too),
    and never show in an error, a log line, the client's repr or the settings a job records."""
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("OPENAI_ORG_ID", ORG_ID)
    monkeypatch.setenv("LLM_DISPATCH_OPENAI_PROJECT_ID", PROJECT_ID)
    settings = Settings(api_key=API_KEY, base_url=BASE_URL, max_retries=1)
    echo = {"error": {"message": f"Project `{PROJECT_ID}` does not have access to model `gpt-4o-mini`",
                      "type": "invalid_request_error", "code": "model_not_found"}}
    chat = router.post("/chat/completions", name="chat").mock(
        side_effect=[httpx.Response(200, json=completion()), httpx.Response(403, json=echo)])
    batches = router.get("/batches", name="batches").respond(200, json={"data": [], "has_more": False})
    async with LLMClient.from_settings(settings, transport=httpx.MockTransport(router.async_handler)) as client:
        await client.chat(REQUEST)
        await OpenAIBatchApi(client).list_batches()
        with pytest.raises(PermissionDeniedError) as caught:
            await client.chat(REQUEST)
        shown = repr(client)
    for call in (*chat.calls, *batches.calls):
        assert call.request.headers["OpenAI-Organization"] == ORG_ID
        assert call.request.headers["OpenAI-Project"] == PROJECT_ID
    assert "does not have access to model" in str(caught.value)
    recorded = json.dumps(settings.public_dict(), default=str)
    for text in (str(caught.value), caplog.text, shown, recorded, repr(settings)):
        assert ORG_ID not in text and PROJECT_ID not in text
    assert settings.public_dict()["openai_project_id_set"] is True


async def test_anthropic_never_gets_openai_account_headers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_ORG_ID", ORG_ID)
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x",
                                         "content": [{"type": "text", "text": "Hi"}], "stop_reason": "end_turn",
                                         "usage": {"input_tokens": 3, "output_tokens": 1}})

    settings = Settings(anthropic_api_key="sk-ant-x", anthropic_base_url="https://anthropic.test")
    async with LLMClient.from_settings(settings, provider="anthropic",
                                       transport=httpx.MockTransport(answer)) as client:
        await client.chat(ChatRequest(model="claude-x", messages=[{"role": "user", "content": "hi"}]))
    assert [name for name in seen[0].headers if name.lower().startswith("openai-")] == []


async def _no_sleep(seconds: float) -> None:
    return None


# --- shared limits through the client ---------------------------------------------------------


QUOTA_BODY = {"error": {"message": "Rate limit reached for gpt-4o-mini in organization org-x on requests per min "
                                    "(RPM): Limit 3, Used 3, Requested 1.", "type": "requests",
                         "code": "rate_limit_exceeded"}}
CAPACITY_BODY = {"error": {"message": "The model is overloaded; retry later.", "type": "rate_limit_error", "code": None}}


async def test_a_capacity_429_retries_that_request_and_slows_no_one(router: respx.Router, fake_time: FakeTime) -> None:
    router.post("/chat/completions", name="chat").mock(side_effect=[
        httpx.Response(429, json=CAPACITY_BODY, headers={"retry-after-ms": "300"}),
        httpx.Response(200, json=completion()),
    ])
    async with make_client(router, fake_time, concurrency=8) as client:
        await client.chat(REQUEST)
        assert client.limiter.limit == 8
        assert client.pause.remaining == 0
    assert fake_time.sleeps == [0.3]


async def test_a_quota_429_without_headers_halves_the_concurrency(router: respx.Router, fake_time: FakeTime) -> None:
    # The provider sends no rate-limit headers, so there is no pace to lower: the concurrency takes the cut.
    router.post("/chat/completions", name="chat").mock(
        side_effect=[httpx.Response(429, json=QUOTA_BODY), httpx.Response(200, json=completion())]
    )
    async with make_client(router, fake_time, concurrency=8) as client:
        await client.chat(REQUEST)
        assert client.limiter.limit == 4
        assert client.limiter.in_flight == 0


def limit_headers(*, limit: int, remaining: int, reset: str = "1s") -> dict[str, str]:
    return {"x-ratelimit-limit-requests": str(limit), "x-ratelimit-remaining-requests": str(remaining),
            "x-ratelimit-reset-requests": reset}


async def test_the_headers_set_the_pace_with_no_rate_configured(router: respx.Router, fake_time: FakeTime) -> None:
    route = router.post("/chat/completions", name="chat").respond(
        200, json=completion(), headers=limit_headers(limit=600, remaining=500)
    )
    async with make_client(router, fake_time) as client:
        for _ in range(11):
            await client.chat(REQUEST)
        pace = client._gates.paces["requests"]
        assert pace.per_minute == pytest.approx(600 * 0.95)
    assert route.call_count == 11
    # 600 a minute at 0.95 is one request every ~0.105 s: ten requests after the first take ~1.05 s.
    assert sum(fake_time.sleeps) == pytest.approx(10 * 60 / (600 * 0.95), rel=0.05)


async def test_a_quota_429_with_headers_pauses_everyone_and_lowers_the_pace(
    router: respx.Router, fake_time: FakeTime
) -> None:
    router.post("/chat/completions", name="chat").mock(side_effect=[
        httpx.Response(200, json=completion(), headers=limit_headers(limit=600, remaining=10)),
        httpx.Response(429, json=CAPACITY_BODY, headers={**limit_headers(limit=600, remaining=0, reset="2s"),
                                                         "retry-after": "2"}),
    ])
    async with make_client(router, fake_time, concurrency=8, max_retries=0) as client:
        await client.chat(REQUEST)
        with pytest.raises(RateLimitError):
            await client.chat(REQUEST)
        # Remaining 0 is the evidence, whatever the message says; the concurrency is left alone.
        assert client._gates.paces["requests"].per_minute == pytest.approx(600 * 0.95 * 0.8)
        assert client.pause.remaining == pytest.approx(2.0)
        assert client.limiter.limit == 8


async def test_a_quota_429_retry_after_pauses_other_callers(router: respx.Router) -> None:
    sent_at: list[tuple[float, str]] = []

    def respond(request: httpx.Request) -> httpx.Response:
        sent_at.append((time.monotonic(), json.loads(request.content)["model"]))
        if len(sent_at) == 1:
            return httpx.Response(429, json=QUOTA_BODY, headers={"retry-after-ms": "200"})
        return httpx.Response(200, json=completion())

    router.post("/chat/completions", name="chat").mock(side_effect=respond)
    async with LLMClient(base_url=BASE_URL, transport=httpx.MockTransport(router.async_handler)) as client:
        first = asyncio.create_task(client.chat(ChatRequest(model="first", messages=[])))
        while not sent_at:
            await asyncio.sleep(0)
        # Sent after the 429: must wait out the pause although its own request never saw a 429.
        await client.chat(ChatRequest(model="second", messages=[]))
        await first
    t429 = sent_at[0][0]
    second = next(t for t, model in sent_at if model == "second")
    assert second - t429 >= 0.19


async def test_a_majority_of_capacity_429s_lowers_concurrency_to_a_quarter_at_most(
    router: respx.Router, fake_time: FakeTime
) -> None:
    router.post("/chat/completions", name="chat").respond(429, json=CAPACITY_BODY, headers={"retry-after-ms": "1"})
    async with make_client(router, fake_time, concurrency=40, max_retries=0) as client:
        for _ in range(400):
            with pytest.raises(RateLimitError):
                await client.chat(REQUEST)
        assert client.limiter.limit == 10


async def test_a_request_never_waits_the_same_interval_twice(router: respx.Router, fake_time: FakeTime) -> None:
    router.post("/chat/completions", name="chat").mock(side_effect=[
        httpx.Response(429, headers={"retry-after": "1"}),
        httpx.Response(429, headers={"retry-after": "1"}),
        httpx.Response(500),
        httpx.Response(429, headers={"retry-after": "1"}),
        httpx.Response(500),
        httpx.Response(200, json=completion()),
    ])
    async with make_client(router, fake_time, max_retries=5) as client:
        await client.chat(REQUEST)
    # No jitter: 1 (the Retry-After), 1.05, backoff 2; then 1.35 would be shorter than the last, so 2 plus 5%.
    assert fake_time.sleeps == pytest.approx([1.0, 1.05, 2.0, 2.1, 8.0])
    assert all(later > earlier for earlier, later in zip(fake_time.sleeps, fake_time.sleeps[1:]))


async def test_concurrency_cap_holds_across_callers() -> None:
    inside = 0
    peak = 0

    async def handler(request: httpx.Request) -> httpx.Response:
        nonlocal inside, peak
        inside += 1
        peak = max(peak, inside)
        await asyncio.sleep(0.001)
        inside -= 1
        return httpx.Response(200, json=completion())

    async with LLMClient(base_url=BASE_URL, concurrency=4, transport=httpx.MockTransport(handler)) as client:
        results = await asyncio.gather(*(client.chat(REQUEST) for _ in range(50)))
        assert client.limiter.in_flight == 0
    assert len(results) == 50
    assert peak == 4


@pytest.mark.parametrize(("used", "expected_sleeps"), [(20, 0), (600, 1)])
async def test_tpm_is_corrected_by_actual_usage(
    router: respx.Router, fake_time: FakeTime, used: int, expected_sleeps: int
) -> None:
    router.post("/chat/completions", name="chat").respond(
        200, json=completion(usage={"prompt_tokens": used - 1, "completion_tokens": 1, "total_tokens": used})
    )
    big = ChatRequest(model="m", messages=[{"role": "user", "content": "hi"}], params={"max_tokens": 500})
    async with make_client(router, fake_time, tpm=600) as client:
        await client.chat(big)  # estimated ~510, within the first minute's budget
        await client.chat(big)  # fits again only if the first call's real usage was refunded
    assert len(fake_time.sleeps) == expected_sleeps


async def test_rpm_paces_requests(router: respx.Router, fake_time: FakeTime) -> None:
    route = router.post("/chat/completions", name="chat").respond(200, json=completion())
    async with make_client(router, fake_time, rpm=2) as client:
        sent_at = []
        for _ in range(3):
            result = await client.chat(REQUEST)
            sent_at.append(fake_time.now)
    assert route.call_count == 3
    assert [t - 1000.0 for t in sent_at] == [0.0, 0.0, 30.0]
    # Waiting at the gate is pacing, not the provider's latency.
    assert result.latency_s == 0.0


# --- later endpoints on the same retry loop ---------------------------------------------------


async def test_multipart_upload_is_resent_whole_on_retry(
    router: respx.Router, fake_time: FakeTime, tmp_path: Path
) -> None:
    source = tmp_path / "batch.jsonl"
    source.write_bytes(b'{"custom_id": "1"}\n')
    route = router.post("/files", name="upload").mock(
        side_effect=[httpx.Response(500), httpx.Response(200, json={"id": "file-1"})]
    )
    async with make_client(router, fake_time) as client:
        with source.open("rb") as handle:
            sent = await client._request(
                "POST", "/files", files={"file": ("batch.jsonl", handle)}, data={"purpose": "batch"}
            )
    assert sent.value == {"id": "file-1"} and sent.attempts == 2
    bodies = []
    for call in route.calls:
        boundary = call.request.headers["content-type"].split("boundary=")[1].encode()
        bodies.append(call.request.content.replace(boundary, b"BOUNDARY"))
    # The file was read again from its start, not from where the first attempt left it.
    assert bodies[0] == bodies[1]
    assert b'{"custom_id": "1"}' in bodies[1]


async def test_download_streams_to_disk_and_retries(router: respx.Router, fake_time: FakeTime, tmp_path: Path) -> None:
    target = tmp_path / "out.jsonl"
    route = router.get("/files/file-1/content", name="download").mock(
        side_effect=[httpx.Response(503), httpx.Response(200, content=b"line1\nline2\n")]
    )
    async with make_client(router, fake_time) as client:
        sent = await client._request("GET", "/files/file-1/content", stream_to=target)
    assert route.call_count == 2
    assert sent.value == target
    assert target.read_bytes() == b"line1\nline2\n"
    assert not (tmp_path / "out.jsonl.part").exists()


def test_default_transport_raises_aiohttp_connection_cap() -> None:
    transport = default_transport(concurrency=400)
    assert transport.limits.max_connections == 400


async def test_plain_http_client_loads_no_certificates_and_trusts_nothing() -> None:
    import ssl

    async with LLMClient(base_url="http://127.0.0.1:8000/v1") as plain, LLMClient(base_url="https://api.example.com/v1") as tls:
        context = plain._transport.ssl_context  # type: ignore[attr-defined]
        # Not an unchecked context: an https URL through it fails, for want of a CA to trust.
        assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
        assert context.cert_store_stats()["x509_ca"] == 0
        assert tls._transport.ssl_context.cert_store_stats()["x509_ca"] > 0  # type: ignore[attr-defined]


# --- a real server, through the real aiohttp transport ----------------------------------------


class _Server:
    """A tiny aiohttp app in its own thread and loop: answers, hangs, trickles, or drops the connection."""

    def __init__(self) -> None:
        self.url = ""
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.seen_headers: list[dict[str, str]] = []
        self.seen_bodies: list[bytes] = []
        self.release = asyncio.Event()

    async def _ok(self, request: web.Request) -> web.Response:
        self.seen_headers.append(dict(request.headers))
        self.seen_bodies.append(await request.read())
        return web.json_response(completion())

    async def _hang(self, request: web.Request) -> web.Response:
        await self.release.wait()
        return web.json_response(completion())

    async def _trickle(self, request: web.Request) -> web.StreamResponse:
        # A byte every 50 ms: no single socket read ever times out, yet the answer never completes.
        response = web.StreamResponse(headers={"content-type": "application/json"})
        await response.prepare(request)
        for _ in range(100):
            if self.release.is_set():
                break
            await response.write(b" ")
            await asyncio.sleep(0.05)
        return response

    async def _drop(self, request: web.Request) -> web.Response:
        assert request.transport is not None
        request.transport.close()
        await asyncio.sleep(0.05)
        return web.json_response(completion())

    async def _start(self) -> str:
        app = web.Application()
        app.router.add_post("/ok/chat/completions", self._ok)
        app.router.add_post("/hang/chat/completions", self._hang)
        app.router.add_post("/drop/chat/completions", self._drop)
        app.router.add_post("/trickle/chat/completions", self._trickle)
        self.runner = web.AppRunner(app, shutdown_timeout=0.5, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return f"http://127.0.0.1:{port}"

    def __enter__(self) -> _Server:
        self.thread.start()
        self.url = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(timeout=60)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.loop.call_soon_threadsafe(self.release.set)
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(timeout=60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=60)
        self.loop.close()


@pytest.fixture(scope="module")
def server() -> Iterator[_Server]:
    with _Server() as running:
        yield running


async def test_real_server_success_through_aiohttp(server: _Server) -> None:
    async with LLMClient(base_url=f"{server.url}/ok", api_key=API_KEY) as client:
        result = await client.chat(REQUEST)
    assert result.text == "Hi!" and result.attempts == 1
    assert server.seen_headers[-1]["Authorization"] == f"Bearer {API_KEY}"


@pytest.mark.parametrize(
    ("path", "timeout", "max_retries"),
    [("hang", 0.2, 1), ("trickle", 0.3, 0)],
    ids=["no-answer", "trickling-body"],
)
async def test_real_slow_server_hits_the_hard_deadline(
    server: _Server, path: str, timeout: float, max_retries: int
) -> None:
    # A trickling body never lets a socket read time out; only the attempt's own deadline stops it.
    async with LLMClient(
        base_url=f"{server.url}/{path}", request_timeout=timeout, max_retries=max_retries, sleep=_no_sleep
    ) as client:
        with pytest.raises(APITimeoutError) as caught:
            await client.chat(REQUEST)
    assert caught.value.attempts == max_retries + 1


async def test_real_dropped_connection_is_a_connection_error(server: _Server) -> None:
    async with LLMClient(base_url=f"{server.url}/drop", max_retries=1, sleep=_no_sleep) as client:
        with pytest.raises(APIConnectionError) as caught:
            await client.chat(REQUEST)
    assert not isinstance(caught.value, APITimeoutError)
    assert caught.value.attempts == 2
    assert "disconnected" in str(caught.value).lower()


# --- one send path: what respx sees is what the default transport sends -----------------------


async def test_respx_sees_the_request_the_default_transport_sends(router: respx.Router, server: _Server) -> None:
    route = router.post("/chat/completions", name="chat").respond(200, json=completion())
    async with LLMClient(
        base_url=BASE_URL, api_key=API_KEY, transport=httpx.MockTransport(router.async_handler)
    ) as mocked:
        await mocked.chat(REQUEST)
    async with LLMClient(base_url=f"{server.url}/ok", api_key=API_KEY) as real:
        await real.chat(REQUEST)

    def comparable(headers: dict[str, str]) -> dict[str, str]:
        return {name.lower(): value for name, value in headers.items() if name.lower() != "host"}

    mocked_request = route.calls.last.request
    assert comparable(dict(mocked_request.headers)) == comparable(server.seen_headers[-1])
    assert mocked_request.content == server.seen_bodies[-1]


class _CountingTransport(httpx.AsyncBaseTransport):
    """Answers every call from ``router`` and keeps each request it was handed."""

    def __init__(self, router: respx.Router) -> None:
        self._mock = httpx.MockTransport(router.async_handler)
        self.requests: list[httpx.Request] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return await self._mock.handle_async_request(request)


async def test_every_call_goes_through_the_transports_one_method(
    router: respx.Router, fake_time: FakeTime, tmp_path: Path
) -> None:
    batch = {"id": "batch_1", "object": "batch", "endpoint": "/v1/chat/completions", "status": "validating",
             "input_file_id": "file-1", "completion_window": "24h", "created_at": 1}
    file = {"id": "file-1", "object": "file", "bytes": 3, "created_at": 1, "filename": "in.jsonl", "purpose": "batch"}
    router.post("/chat/completions", name="chat").respond(200, json=completion())
    router.post("/files", name="upload").respond(200, json=file)
    router.get("/files/file-1/content", name="download").respond(200, content=b"{}\n")
    router.delete("/files/file-1", name="delete").respond(200, json={"deleted": True})
    router.post("/batches", name="create").respond(200, json=batch)
    router.get("/batches", name="list").respond(200, json={"data": [batch], "has_more": False})
    source = tmp_path / "in.jsonl"
    source.write_text("{}\n")
    transport = _CountingTransport(router)
    async with make_client(router, fake_time, transport=transport) as client:
        await client.chat(REQUEST)
        await OpenAIBatchApi(client).upload_file(source)
        await OpenAIBatchApi(client).download_file("file-1", to=tmp_path / "out.jsonl")
        await OpenAIBatchApi(client).delete_file("file-1")
        await OpenAIBatchApi(client).create_batch(input_file_id="file-1")
        await OpenAIBatchApi(client).list_batches()
    assert [(r.method, r.url.path) for r in transport.requests] == [
        ("POST", "/v1/chat/completions"), ("POST", "/v1/files"), ("GET", "/v1/files/file-1/content"),
        ("DELETE", "/v1/files/file-1"), ("POST", "/v1/batches"), ("GET", "/v1/batches"),
    ]
    assert all(r.headers["authorization"] == f"Bearer {API_KEY}" for r in transport.requests)
    assert all(r.headers["user-agent"] == "llm-dispatch" for r in transport.requests)
