"""LLMClient speaking Anthropic over real sockets (its default aiohttp transport) to a scripted Messages server.

The server echoes what it received, so translation is checked on the bytes that crossed the wire; a model name
``error-<status>-<type>`` makes it answer that error; batch ids name their state.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web

from llm_dispatch.core import (
    APIStatusError,
    AuthenticationError,
    BadRequestError,
    BatchStatus,
    ChatRequest,
    InternalServerError,
    LLMClient,
    MessageBatchApi,
    NotFoundError,
    PermissionDeniedError,
    RateLimitError,
    read_message_batch_results,
)
from llm_dispatch.core.wire._anthropic import anthropic_params

KEY = "sk-ant-socket-test"
STATES = ("in_progress", "canceling", "ended")
RESULTS = [
    {"custom_id": "ok", "result": {"type": "succeeded", "message": {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-haiku-4-5",
        "content": [{"type": "text", "text": "fine"}], "stop_reason": "end_turn", "stop_sequence": None,
        "usage": {"input_tokens": 4, "output_tokens": 1, "cache_read_input_tokens": 2,
                  "cache_creation_input_tokens": 3}}}},
    {"custom_id": "bad", "result": {"type": "errored", "error": {"type": "error", "error": {
        "type": "invalid_request_error", "message": "max_tokens: too large"}}}},
    {"custom_id": "busy", "result": {"type": "errored", "error": {"type": "error", "error": {
        "type": "overloaded_error", "message": "Overloaded"}}}},
    {"custom_id": "stopped", "result": {"type": "canceled"}},
    {"custom_id": "late", "result": {"type": "expired"}},
]


def _error(status: int, kind: str) -> web.Response:
    return web.json_response({"type": "error", "error": {"type": kind, "message": f"{kind} from the server"}},
                             status=status, headers={"retry-after-ms": "1", "request-id": "req_sock"})


def _batch(batch_id: str, state: str, *, requests: int = 3) -> dict[str, Any]:
    ended = state == "ended"
    return {
        "id": batch_id, "type": "message_batch", "processing_status": state,
        "request_counts": {"processing": 0 if ended else requests, "succeeded": requests if ended else 0,
                           "errored": 0, "canceled": 0, "expired": 0},
        "created_at": "2026-11-24T10:00:00Z", "expires_at": "2026-11-25T10:00:00Z",
        "ended_at": "2026-11-24T11:00:00Z" if ended else None,
        "cancel_initiated_at": "2026-11-24T10:30:00Z" if state == "canceling" else None,
        "archived_at": None, "results_url": f"/v1/messages/batches/{batch_id}/results" if ended else None,
    }


class Anthropic:
    def __init__(self) -> None:
        self.seen: list[web.Request] = []
        self.bodies: list[Any] = []
        self.overloaded_left = 0

    async def messages(self, request: web.Request) -> web.Response:
        self.seen.append(request)
        if request.headers.get("x-api-key") != KEY or request.headers.get("anthropic-version") != "2023-06-01":
            return _error(401, "authentication_error")
        body = await request.json()
        self.bodies.append(body)
        if body["model"].startswith("error-"):
            _, status, kind = body["model"].split("-", 2)
            return _error(int(status), kind)
        if self.overloaded_left:
            self.overloaded_left -= 1
            return _error(529, "overloaded_error")
        return web.json_response({
            "id": "msg_echo", "type": "message", "role": "assistant", "model": body["model"],
            "content": [{"type": "text", "text": json.dumps(body, sort_keys=True)}],
            "stop_reason": "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 2, "cache_read_input_tokens": 0,
                      "cache_creation_input_tokens": 0},
        }, headers={"anthropic-ratelimit-requests-limit": "1000", "anthropic-ratelimit-requests-remaining": "999",
                    "anthropic-ratelimit-requests-reset": "2030-01-01T00:00:00Z"})

    async def create(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.bodies.append(body)
        return web.json_response(_batch("msgbatch_in_progress", "in_progress", requests=len(body["requests"])))

    async def retrieve(self, request: web.Request) -> web.Response:
        batch_id = request.match_info["id"]
        state = batch_id.removeprefix("msgbatch_")
        if state.startswith("error-"):
            _, status, kind = state.split("-", 2)
            return _error(int(status), kind)
        return web.json_response(_batch(batch_id, state))

    async def cancel(self, request: web.Request) -> web.Response:
        return web.json_response(_batch(request.match_info["id"], "canceling"))

    async def listing(self, request: web.Request) -> web.Response:
        after = request.query.get("after_id")
        ids = ["msgbatch_ended", "msgbatch_canceling", "msgbatch_in_progress"]
        start = ids.index(after) + 1 if after else 0
        page = ids[start:start + int(request.query["limit"])]
        return web.json_response({"data": [_batch(i, i.removeprefix("msgbatch_")) for i in page],
                                  "has_more": start + len(page) < len(ids), "first_id": page[0], "last_id": page[-1]})

    async def results(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "application/binary"})
        await response.prepare(request)
        for line in RESULTS:  # streamed, no Content-Length: the client's download path
            await response.write(json.dumps(line).encode() + b"\n")
        await response.write_eof()
        return response


@pytest_asyncio.fixture(loop_scope="function")
async def served() -> AsyncIterator[tuple[Anthropic, str]]:
    fake = Anthropic()
    app = web.Application()
    batches = "/v1/messages/batches"
    app.add_routes([web.post("/v1/messages", fake.messages), web.post(batches, fake.create),
                    web.get(batches, fake.listing), web.get(batches + "/{id}", fake.retrieve),
                    web.post(batches + "/{id}/cancel", fake.cancel), web.get(batches + "/{id}/results", fake.results)])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield fake, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def client(url: str, **options: Any) -> LLMClient:
    return LLMClient(provider="anthropic", base_url=url, api_key=KEY, **options)


async def test_translation_crosses_the_wire(served: tuple[Anthropic, str]) -> None:
    fake, url = served
    request = ChatRequest(model="claude-haiku-4-5", messages=[
        {"role": "system", "content": "S"},
        {"role": "user", "content": [{"type": "text", "text": "look"},
                                     {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,QUJD"}}]},
    ], params={"stop": "END", "user": "u-7", "temperature": 0.3,
               "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
               "tool_choice": "auto"})
    async with client(url, default_max_tokens=77) as llm:
        result = await llm.chat(request)
    assert result.text is not None
    assert json.loads(result.text) == {
        "model": "claude-haiku-4-5", "max_tokens": 77, "system": "S",
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "look"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "QUJD"}}]}],
        "stop_sequences": ["END"], "metadata": {"user_id": "u-7"}, "temperature": 0.3,
        "tools": [{"name": "f", "input_schema": {"type": "object"}}], "tool_choice": {"type": "auto"},
    }
    assert (result.prompt_tokens, result.completion_tokens, result.finish_reason) == (10, 2, "end_turn")


@pytest.mark.parametrize(("status", "kind", "exception"), [
    (400, "invalid_request_error", BadRequestError), (401, "authentication_error", AuthenticationError),
    (403, "permission_error", PermissionDeniedError), (404, "not_found_error", NotFoundError),
    (413, "request_too_large", APIStatusError), (429, "rate_limit_error", RateLimitError),
    (500, "api_error", InternalServerError), (529, "overloaded_error", InternalServerError),
])
async def test_each_error_class_over_a_socket(
    served: tuple[Anthropic, str], status: int, kind: str, exception: type[APIStatusError]
) -> None:
    fake, url = served
    async with client(url, max_retries=1) as llm:
        with pytest.raises(exception) as caught:
            await llm.chat(ChatRequest(model=f"error-{status}-{kind}", messages=[{"role": "user", "content": "x"}]))
    assert caught.value.status_code == status and f"{kind} from the server" in str(caught.value)
    assert "req_sock" in str(caught.value) and KEY not in str(caught.value)
    assert len(fake.seen) == (2 if status >= 429 else 1)


async def test_overloaded_then_answered(served: tuple[Anthropic, str]) -> None:
    fake, url = served
    fake.overloaded_left = 2
    async with client(url) as llm:
        result = await llm.chat(ChatRequest(model="claude-haiku-4-5", messages=[{"role": "user", "content": "x"}]))
    assert result.attempts == 3 and result.text is not None


@pytest.mark.parametrize("state", STATES)
async def test_each_batch_state_over_a_socket(served: tuple[Anthropic, str], state: str) -> None:
    _, url = served
    expected = {"in_progress": BatchStatus.IN_PROGRESS, "canceling": BatchStatus.CANCELLING,
                "ended": BatchStatus.COMPLETED}[state]
    async with client(url) as llm:
        info = await MessageBatchApi(llm).retrieve(f"msgbatch_{state}")
    assert info.status is expected and info.request_counts.total == 3
    assert (info.cancelling_at is not None) == (state == "canceling")


@pytest.mark.parametrize("status", [400, 401, 403, 404, 413, 429, 500, 529])
async def test_each_error_class_of_a_batch_call_over_a_socket(served: tuple[Anthropic, str], status: int) -> None:
    _, url = served
    async with client(url, max_retries=0) as llm:
        with pytest.raises(APIStatusError) as caught:
            await MessageBatchApi(llm).retrieve(f"msgbatch_error-{status}-some_error")
    assert caught.value.status_code == status


async def test_a_batch_is_created_listed_cancelled_and_its_results_read(
    served: tuple[Anthropic, str], tmp_path: Path
) -> None:
    fake, url = served
    request = ChatRequest(model="claude-haiku-4-5", messages=[{"role": "user", "content": "x"}], params={"stop": "Z"})
    params = anthropic_params(request, default_max_tokens=50)
    async with client(url) as llm:
        batches = MessageBatchApi(llm)
        created = await batches.create_message_batch(requests=[{"custom_id": f"p-{i}", "params": params} for i in range(3)])
        listed = [info.id async for info in batches.iter_message_batches(page_size=2)]
        cancelled = await batches.cancel(created.id)
        path = await batches.download_message_batch_results("msgbatch_ended", to=tmp_path / "results.jsonl")
    assert created.status is BatchStatus.IN_PROGRESS and created.request_counts.total == 3
    assert fake.bodies[-1]["requests"][0] == {"custom_id": "p-0", "params": {
        "model": "claude-haiku-4-5", "max_tokens": 50, "messages": [{"role": "user", "content": "x"}],
        "stop_sequences": ["Z"]}}
    assert listed == ["msgbatch_ended", "msgbatch_canceling", "msgbatch_in_progress"]
    assert cancelled.status is BatchStatus.CANCELLING
    lines = list(read_message_batch_results(path))
    assert [(line.custom_id, line.ok, line.error_code, line.retryable) for line in lines] == [
        ("ok", True, None, False), ("bad", False, "invalid_request_error", False),
        ("busy", False, "overloaded_error", True), ("stopped", False, "canceled", True),
        ("late", False, "expired", True)]
    ok = lines[0].result
    assert ok is not None and (ok.prompt_tokens, ok.cached_tokens, ok.cache_creation_tokens) == (9, 2, 3)
