"""LLMClient over its default transport against the simulator on real sockets: each fault, end to end.

The respx tests drive the same send path through a mock transport; these check what only real
sockets show: dropped connections, hangs, decompression, the pool.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import time
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from llm_dispatch.core import (
    APIConnectionError,
    APIResponseValidationError,
    APITimeoutError,
    AuthenticationError,
    BadRequestError,
    LLMClient,
)
from llm_dispatch.core._types import ChatRequest

from conftest import StartSim
KEY = "sk-live-test-0123456789"


def request(content: str = "Say hello.", **params: Any) -> ChatRequest:
    return ChatRequest(model="gpt-4o-mini", messages=[{"role": "user", "content": content}], params=params)


async def queue_faults(url: str, *faults: str) -> None:
    async with aiohttp.ClientSession() as session, session.post(
        f"{url.removesuffix('/v1')}/_sim/faults", json={"faults": list(faults)}
    ) as response:
        assert response.status == 200


async def stats(url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session, session.get(f"{url.removesuffix('/v1')}/_sim/stats") as response:
        return await response.json()


def client(url: str, **options: Any) -> LLMClient:
    options.setdefault("max_retries", 2)
    return LLMClient(base_url=url, sleep=_no_sleep, **options)


async def _no_sleep(_seconds: float) -> None:
    await asyncio.sleep(0)


async def test_the_default_transport_answers_a_chat(start_sim: StartSim):
    url = await start_sim()
    async with client(url) as llm:
        result = await llm.chat(request(max_tokens=5))
    assert result.text and result.completion_tokens == 5 and result.finish_reason == "length"
    assert result.prompt_tokens > 0 and result.attempts == 1


@pytest.mark.parametrize("fault", ["429", "500", "503", "drop"])
async def test_a_retryable_fault_is_retried_and_the_answer_kept(start_sim: StartSim, fault: str):
    url = await start_sim(retry_after=0.01)
    await queue_faults(url, fault)
    async with client(url) as llm:
        result = await llm.chat(request())
    assert result.attempts == 2 and result.text
    assert (await stats(url))["requests_total"] == 2


async def test_a_200_that_is_not_json_is_sent_once(start_sim: StartSim):
    url = await start_sim()
    await queue_faults(url, "malformed")
    async with client(url) as llm:
        with pytest.raises(APIResponseValidationError, match="may have been billed, so it is not sent again"):
            await llm.chat(request())
    assert (await stats(url))["requests_total"] == 1


async def test_a_drop_every_time_ends_in_a_connection_error_naming_the_server(start_sim: StartSim):
    url = await start_sim()
    async with client(url) as llm:
        with pytest.raises(APIConnectionError) as caught:
            await llm.chat(request("[[sim:drop]]"))
    assert caught.value.attempts == 3
    assert "after 3 attempts" in str(caught.value) and url in str(caught.value)
    assert "ServerDisconnectedError" in str(caught.value)


async def test_malformed_json_every_time_is_an_unusable_answer(start_sim: StartSim):
    url = await start_sim()
    async with client(url) as llm:
        with pytest.raises(APIResponseValidationError, match="the body is not JSON"):
            await llm.chat(request("[[sim:malformed]]"))


async def test_a_hang_is_cut_at_the_attempt_deadline(start_sim: StartSim):
    url = await start_sim()
    async with client(url, request_timeout=0.3, max_retries=0) as llm:
        started = time.perf_counter()
        with pytest.raises(APITimeoutError, match="LLM_DISPATCH_REQUEST_TIMEOUT"):
            await llm.chat(request("[[sim:hang]]"))
    assert time.perf_counter() - started >= 0.25  # cut at its deadline, not before


async def test_a_400_is_not_retried_and_quotes_the_provider(start_sim: StartSim):
    url = await start_sim()
    async with client(url) as llm:
        with pytest.raises(BadRequestError) as caught:
            await llm.chat(request(max_tokens=0))
    assert caught.value.attempts == 1 and caught.value.status_code == 400
    assert "Invalid 'max_tokens': expected a value >= 1" in str(caught.value)


async def test_a_wrong_key_is_an_authentication_error_that_does_not_show_the_key(start_sim: StartSim):
    url = await start_sim(api_key="sk-the-right-one")
    async with client(url, api_key=KEY) as llm:
        with pytest.raises(AuthenticationError) as caught:
            await llm.chat(request())
    assert caught.value.attempts == 1
    assert KEY not in str(caught.value) and KEY[-8:] not in str(caught.value)


async def test_a_capacity_429_is_retried_after_its_retry_after(start_sim: StartSim):
    url = await start_sim(retry_after=0.3)
    await queue_faults(url, "429")
    async with LLMClient(base_url=url, max_retries=2) as llm:
        started = time.perf_counter()
        results = await asyncio.gather(*(llm.chat(request(f"q{i}")) for i in range(4)))
    assert all(r.text for r in results)
    assert time.perf_counter() - started >= 0.25


async def test_a_gzip_error_body_is_read_once_decompressed() -> None:
    """An error answered gzipped: the message reaches the exception intact (aiohttp decodes; httpx must not again)."""
    body = gzip.compress(json.dumps({"error": {"message": "model 'nope' does not exist", "type": "invalid_request_error"}}).encode())

    async def handler(_request: web.Request) -> web.Response:
        return web.Response(status=404, body=body, headers={"Content-Encoding": "gzip", "Content-Type": "application/json"})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        async with client(f"http://127.0.0.1:{port}/v1") as llm:
            with pytest.raises(Exception, match="model 'nope' does not exist") as caught:
                await llm.chat(request())
        assert getattr(caught.value, "status_code", None) == 404
    finally:
        await runner.cleanup()


async def test_a_200_cut_off_after_its_headers_is_sent_twice_at_most(start_sim: StartSim):
    url = await start_sim()
    async with client(url, max_retries=5) as llm:
        with pytest.raises(APIConnectionError, match="cut off after its status line on 2 attempts") as caught:
            await llm.chat(request("[[sim:cut]] hi"))
    assert caught.value.maybe_billed == 2 and not caught.value.retryable
    assert (await stats(url))["markers"] == {"cut": 2}


async def test_a_hang_is_tried_again_once_whatever_max_retries_says(start_sim: StartSim):
    url = await start_sim()
    async with client(url, request_timeout=0.2, max_retries=5) as llm:
        with pytest.raises(APITimeoutError, match="not back within its deadline on 2 attempts"):
            await llm.chat(request("[[sim:hang]] hi"))
    assert (await stats(url))["markers"] == {"hang": 2}
