"""LLMClient speaking Anthropic: the Messages call and Message Batches, through respx on the production send path."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import httpx
import pytest
import respx

from llm_dispatch.core import (
    APIStatusError,
    AuthenticationError,
    BadRequestError,
    BatchStatus,
    ChatRequest,
    ConfigError,
    InternalServerError,
    LLMClient,
    MessageBatchApi,
    NotFoundError,
    PermissionDeniedError,
    RateLimitError,
    Settings,
)

from conftest import FakeTime

BASE = "https://api.anthropic.test"
KEY = "sk-ant-test-0123456789"
REQUEST = ChatRequest(
    model="claude-sonnet-4-5",
    messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi"}],
    params={"max_tokens": 5},
)


def message(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": "msg_01", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5-20250929",
        "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "!"}],
        "stop_reason": "end_turn", "stop_sequence": None,
        "usage": {"input_tokens": 7, "output_tokens": 3, "cache_creation_input_tokens": 100,
                  "cache_read_input_tokens": 50},
    }
    body.update(overrides)
    return body


def error(status: int, kind: str, **headers: str) -> httpx.Response:
    body = {"type": "error", "error": {"type": kind, "message": f"{kind} happened"}}
    return httpx.Response(status, json=body, headers={"request-id": "req_9", **headers})


@pytest.fixture
def anthropic() -> Any:
    router = respx.Router(base_url=BASE, assert_all_called=True, assert_all_mocked=True)
    yield router
    router.assert_all_called()


def client_for(router: respx.Router, fake_time: FakeTime, **options: Any) -> LLMClient:
    values: dict[str, Any] = {
        "provider": "anthropic", "base_url": BASE, "api_key": KEY,
        "transport": httpx.MockTransport(router.async_handler),
        "sleep": fake_time.sleep, "clock": fake_time.monotonic, "random": lambda: 0.0,
    }
    values.update(options)
    return LLMClient(**values)


async def test_a_message_is_sent_translated_with_anthropics_headers_and_read_back(
    anthropic: respx.Router, fake_time: FakeTime
) -> None:
    route = anthropic.post("/v1/messages").respond(200, json=message())
    async with client_for(anthropic, fake_time) as client:
        assert client.provider == "anthropic"
        result = await client.chat(REQUEST)
    sent = route.calls.last.request
    assert sent.headers["x-api-key"] == KEY and sent.headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in sent.headers
    assert json.loads(sent.content) == {"model": "claude-sonnet-4-5", "max_tokens": 5, "system": "Be brief.",
                                        "messages": [{"role": "user", "content": "Say hi"}]}
    assert (result.text, result.finish_reason, result.response_id) == ("Hi!", "end_turn", "msg_01")
    assert (result.prompt_tokens, result.completion_tokens) == (157, 3)
    assert (result.cached_tokens, result.cache_creation_tokens) == (50, 100)


async def test_the_default_max_tokens_goes_when_the_prompt_sets_none(
    anthropic: respx.Router, fake_time: FakeTime
) -> None:
    route = anthropic.post("/v1/messages").respond(200, json=message())
    async with client_for(anthropic, fake_time, default_max_tokens=321) as client:
        await client.chat(ChatRequest(model="claude-haiku-4-5", messages=[{"role": "user", "content": "x"}]))
    assert json.loads(route.calls.last.request.content)["max_tokens"] == 321


@pytest.mark.parametrize(
    ("status", "kind", "exception"),
    [
        (400, "invalid_request_error", BadRequestError),
        (401, "authentication_error", AuthenticationError),
        (403, "permission_error", PermissionDeniedError),
        (404, "not_found_error", NotFoundError),
        (413, "request_too_large", APIStatusError),
    ],
)
async def test_a_client_error_is_not_retried_and_says_what_to_do(
    anthropic: respx.Router, fake_time: FakeTime, status: int, kind: str, exception: type[Exception]
) -> None:
    route = anthropic.post("/v1/messages").mock(return_value=error(status, kind))
    async with client_for(anthropic, fake_time) as client:
        with pytest.raises(exception) as caught:
            await client.chat(REQUEST)
    assert route.call_count == 1 and fake_time.sleeps == []
    text = str(caught.value)
    assert f"HTTP {status}" in text and f"{kind} happened" in text and "Request id req_9" in text
    assert KEY not in text
    if status == 401:
        assert "ANTHROPIC_API_KEY" in text


@pytest.mark.parametrize(
    ("status", "kind", "exception"),
    [(429, "rate_limit_error", RateLimitError), (500, "api_error", InternalServerError),
     (529, "overloaded_error", InternalServerError)],
)
async def test_429_529_and_5xx_are_retried_after_the_servers_wait_then_give_up(
    anthropic: respx.Router, fake_time: FakeTime, status: int, kind: str, exception: type[Exception]
) -> None:
    route = anthropic.post("/v1/messages").mock(return_value=error(status, kind, **{"retry-after": "3"}))
    async with client_for(anthropic, fake_time, max_retries=2) as client:
        with pytest.raises(exception) as caught:
            await client.chat(REQUEST)
    assert route.call_count == 3
    assert fake_time.sleeps[0] == 3.0 and fake_time.sleeps[1] > 3.0
    assert caught.value.status_code == status  # type: ignore[attr-defined]
    if status == 529:
        assert "overloaded" in str(caught.value)


async def test_an_overloaded_answer_then_a_message_succeeds_on_the_second_attempt(
    anthropic: respx.Router, fake_time: FakeTime
) -> None:
    anthropic.post("/v1/messages").mock(
        side_effect=[error(529, "overloaded_error", **{"retry-after": "1"}), httpx.Response(200, json=message())])
    async with client_for(anthropic, fake_time) as client:
        result = await client.chat(REQUEST)
    assert result.attempts == 2 and fake_time.sleeps == [1.0]


async def test_the_ratelimit_headers_set_the_pace(anthropic: respx.Router, fake_time: FakeTime) -> None:
    headers = {
        "anthropic-ratelimit-requests-limit": "50", "anthropic-ratelimit-requests-remaining": "49",
        "anthropic-ratelimit-requests-reset": "2030-01-01T00:00:00Z",
        "anthropic-ratelimit-tokens-limit": "40000", "anthropic-ratelimit-tokens-remaining": "39000",
    }
    anthropic.post("/v1/messages").respond(200, json=message(), headers=headers)
    async with client_for(anthropic, fake_time) as client:
        await client.chat(REQUEST)
        paces = client._gates.paces
    assert set(paces) == {"requests", "tokens"}
    # Paced a little under the stated limit (the margin of _limits.Pace).
    assert 40 < paces["requests"].per_minute <= 50 and 30000 < paces["tokens"].per_minute <= 40000


async def test_an_unusable_message_is_retried_then_named(anthropic: respx.Router, fake_time: FakeTime) -> None:
    anthropic.post("/v1/messages").respond(200, json={"type": "message", "content": "not a list"})
    async with client_for(anthropic, fake_time, max_retries=1) as client:
        with pytest.raises(Exception, match="ANTHROPIC_BASE_URL"):
            await client.chat(REQUEST)


def test_a_missing_key_names_anthropic_api_key_unless_the_server_is_local() -> None:
    with pytest.raises(ConfigError, match="ANTHROPIC_API_KEY"):
        LLMClient.from_settings(Settings(anthropic_api_key=None), provider="anthropic")
    local = LLMClient.from_settings(Settings(anthropic_base_url="http://127.0.0.1:8000"), provider="anthropic")
    assert local.provider == "anthropic"


def test_from_settings_takes_anthropics_url_key_version_and_never_shows_the_key(
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = Settings(anthropic_api_key=KEY, anthropic_base_url=BASE, anthropic_version="2099-01-01",
                        api_key="sk-openai")
    client = LLMClient.from_settings(settings, provider="anthropic")
    assert KEY not in repr(client) and "provider='anthropic'" in repr(client)
    assert client._requests._headers["anthropic-version"] == "2099-01-01"
    assert client._requests._headers["x-api-key"] == KEY
    assert "authorization" not in client._requests._headers
    assert LLMClient.from_settings(settings).provider == "openai"
    with pytest.raises(ValueError, match="provider must be one of openai, anthropic"):
        LLMClient.from_settings(settings, provider="mistral")


async def test_a_key_echoed_in_an_error_and_the_retry_log_is_scrubbed(
    anthropic: respx.Router, fake_time: FakeTime, caplog: pytest.LogCaptureFixture
) -> None:
    echo = {"type": "error", "error": {"type": "authentication_error", "message": f"invalid x-api-key {KEY}"}}
    anthropic.post("/v1/messages").mock(side_effect=[httpx.Response(500, json=echo), httpx.Response(401, json=echo)])
    caplog.set_level(logging.DEBUG)
    async with client_for(anthropic, fake_time) as client:
        with pytest.raises(AuthenticationError) as caught:
            await client.chat(REQUEST)
    assert KEY not in str(caught.value) and KEY not in caplog.text


# --- Message Batches --------------------------------------------------------------------------


def batch(status: str = "in_progress", **overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": "msgbatch_01", "type": "message_batch", "processing_status": status,
        "request_counts": {"processing": 2, "succeeded": 5, "errored": 1, "canceled": 1, "expired": 1},
        "created_at": "2026-11-24T10:00:00Z", "expires_at": "2026-11-25T10:00:00Z", "ended_at": None,
        "cancel_initiated_at": None, "archived_at": None, "results_url": None,
    }
    body.update(overrides)
    return body


@pytest.mark.parametrize(
    ("status", "expected", "extra"),
    [
        ("in_progress", BatchStatus.IN_PROGRESS, {}),
        ("canceling", BatchStatus.CANCELLING, {"cancel_initiated_at": "2026-11-24T11:00:00+00:00"}),
        ("ended", BatchStatus.COMPLETED, {"ended_at": "2026-11-24T12:00:00Z",
                                          "results_url": f"{BASE}/v1/messages/batches/msgbatch_01/results"}),
    ],
)
async def test_each_batch_state_maps_to_the_neutral_status(
    anthropic: respx.Router, fake_time: FakeTime, status: str, expected: BatchStatus, extra: dict[str, Any]
) -> None:
    anthropic.get("/v1/messages/batches/msgbatch_01").respond(200, json=batch(status, **extra))
    async with client_for(anthropic, fake_time) as client:
        info = await MessageBatchApi(client).retrieve("msgbatch_01")
    assert info.status is expected
    assert (info.request_counts.total, info.request_counts.completed, info.request_counts.failed) == (10, 5, 3)
    assert info.created_at is not None and info.created_at.hour == 10 and info.metadata == {}
    assert (info.cancelling_at is not None) == (status == "canceling")
    assert (info.completed_at is not None) == (info.output_file_id is not None) == (status == "ended")


async def test_a_batch_is_created_from_requests_and_cancelled(anthropic: respx.Router, fake_time: FakeTime) -> None:
    create = anthropic.post("/v1/messages/batches").respond(200, json=batch())
    cancel = anthropic.post("/v1/messages/batches/msgbatch_01/cancel").respond(200, json=batch("canceling"))
    requests = [{"custom_id": "p-1_a", "params": {"model": "claude-haiku-4-5", "max_tokens": 9, "messages": []}}]
    async with client_for(anthropic, fake_time) as client:
        batches = MessageBatchApi(client)
        created = await batches.create_message_batch(requests=requests)
        cancelled = await batches.cancel("msgbatch_01")
    assert json.loads(create.calls.last.request.content) == {"requests": requests}
    assert create.calls.last.request.headers["x-api-key"] == KEY
    assert created.status is BatchStatus.IN_PROGRESS and cancelled.status is BatchStatus.CANCELLING
    assert cancel.call_count == 1


@pytest.mark.parametrize("custom_id", ["", "a" * 65, "has space", "slash/no", None])
async def test_a_bad_custom_id_is_refused_before_sending(fake_time: FakeTime, custom_id: Any) -> None:
    router = respx.Router(base_url=BASE, assert_all_mocked=True)
    async with client_for(router, fake_time) as client:
        with pytest.raises(ValueError, match="custom_id"):
            await MessageBatchApi(client).create_message_batch(requests=[{"custom_id": custom_id, "params": {}}])


async def test_a_lost_create_is_not_retried_when_the_caller_says_so(
    anthropic: respx.Router, fake_time: FakeTime
) -> None:
    route = anthropic.post("/v1/messages/batches").mock(return_value=error(500, "api_error"))
    async with client_for(anthropic, fake_time) as client:
        with pytest.raises(InternalServerError):
            await MessageBatchApi(client).create_message_batch(requests=[{"custom_id": "a", "params": {}}],
                                                               max_retries=0)
    assert route.call_count == 1


async def test_batches_are_listed_newest_first_page_by_page(anthropic: respx.Router, fake_time: FakeTime) -> None:
    route = anthropic.get("/v1/messages/batches").mock(side_effect=[
        httpx.Response(200, json={"data": [batch(id="msgbatch_3"), batch(id="msgbatch_2")], "has_more": True,
                                  "first_id": "msgbatch_3", "last_id": "msgbatch_2"}),
        httpx.Response(200, json={"data": [batch(id="msgbatch_1")], "has_more": False}),
    ])
    async with client_for(anthropic, fake_time) as client:
        ids = [info.id async for info in MessageBatchApi(client).iter_message_batches(page_size=2)]
    assert ids == ["msgbatch_3", "msgbatch_2", "msgbatch_1"]
    assert route.calls[1].request.url.params["after_id"] == "msgbatch_2"
    assert route.calls[0].request.url.params["limit"] == "2"


async def test_results_are_downloaded_to_a_file(anthropic: respx.Router, fake_time: FakeTime, tmp_path: Path) -> None:
    lines = b'{"custom_id":"a","result":{"type":"canceled"}}\n'
    anthropic.get("/v1/messages/batches/msgbatch_01/results").respond(200, content=lines)
    async with client_for(anthropic, fake_time) as client:
        path = await MessageBatchApi(client).download_message_batch_results("msgbatch_01",
                                                                            to=tmp_path / "out" / "r.jsonl")
    assert path.read_bytes() == lines


@pytest.mark.parametrize("status", [400, 401, 403, 404, 413, 429, 500, 529])
async def test_each_error_class_of_a_batch_call(anthropic: respx.Router, fake_time: FakeTime, status: int) -> None:
    route = anthropic.get("/v1/messages/batches/msgbatch_01").mock(return_value=error(status, "some_error"))
    async with client_for(anthropic, fake_time, max_retries=1) as client:
        with pytest.raises(APIStatusError) as caught:
            await MessageBatchApi(client).retrieve("msgbatch_01")
    assert caught.value.status_code == status
    assert route.call_count == (2 if status in (429, 500, 529) else 1)


async def test_message_batch_calls_need_an_anthropic_client(fake_time: FakeTime) -> None:
    router = respx.Router(base_url=BASE, assert_all_mocked=True)
    async with client_for(router, fake_time, provider="openai") as client:
        with pytest.raises(ValueError, match="Anthropic"):
            await MessageBatchApi(client).retrieve("msgbatch_01")


async def test_a_connection_failure_names_the_anthropic_url_setting(fake_time: FakeTime) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    client = LLMClient(provider="anthropic", base_url=BASE, api_key=KEY, transport=httpx.MockTransport(refuse),
                       sleep=fake_time.sleep, clock=fake_time.monotonic, max_retries=0)
    async with client:
        with pytest.raises(Exception, match="LLM_DISPATCH_ANTHROPIC_BASE_URL"):
            await client.chat(REQUEST)
