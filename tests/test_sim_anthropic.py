"""The simulator's Anthropic Messages API over real sockets, driven by the Anthropic LLMClient and by raw HTTP."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import httpx
import pytest
import pytest_asyncio

from llm_dispatch.core import (APIStatusError, AuthenticationError, BadRequestError, ChatRequest, InternalServerError,
                          LLMClient, NotFoundError, PermissionDeniedError, RateLimitError)
from llm_dispatch.simulator import Simulator, SimulatorConfig, anthropic_base_url

from conftest import StartSim

MODEL = "claude-haiku-4-5"
HEADERS = {"anthropic-version": "2023-06-01", "x-api-key": "k"}


def ask(text: str = "Name three rivers.", **params: Any) -> ChatRequest:
    return ChatRequest(model=MODEL, messages=[{"role": "user", "content": text}], params=params)


def body(text: str = "Name three rivers.", **fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 512, "messages": [{"role": "user", "content": text}], **fields}


def claude(url: str, **options: Any) -> LLMClient:
    return LLMClient(provider="anthropic", base_url=url, api_key="k", **options)


@pytest_asyncio.fixture(loop_scope="function")
async def raw() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(headers=HEADERS, timeout=60) as client:
        yield client


async def anthropic_sim(start_sim: StartSim, **fields: Any) -> str:
    return anthropic_base_url(await start_sim(**fields))


async def stats(client: httpx.AsyncClient, url: str) -> dict[str, Any]:
    return (await client.get(f"{url}/_sim/stats")).json()


# --- answers -------------------------------------------------------------------------------


async def test_a_message_is_answered_with_usage_and_end_turn(start_sim: StartSim, raw: httpx.AsyncClient) -> None:
    url = await anthropic_sim(start_sim)
    async with claude(url, default_max_tokens=1024) as llm:
        first = await llm.chat(ask())
        again = await llm.chat(ask())
    assert first.text and first.finish_reason == "end_turn" and first.text.endswith(".")
    assert first.prompt_tokens > 0 and 0 < first.completion_tokens <= 300
    assert (first.cached_tokens, first.cache_creation_tokens) == (0, 0)
    assert first.response_id is not None and first.response_id.startswith("msg_")
    assert (again.text, again.completion_tokens) == (first.text, first.completion_tokens)
    counters = await stats(raw, url)
    assert (counters["messages"], counters["completions"], counters["requests_total"]) == (2, 0, 2)


async def test_max_tokens_cuts_the_reply(start_sim: StartSim) -> None:
    url = await anthropic_sim(start_sim)
    async with claude(url) as llm:
        result = await llm.chat(ask(max_tokens=5))
    assert (result.finish_reason, result.completion_tokens) == ("max_tokens", 5)
    assert result.text is not None and not result.text.endswith(".")


async def test_the_message_has_anthropics_exact_shape(start_sim: StartSim, raw: httpx.AsyncClient) -> None:
    url = await anthropic_sim(start_sim)
    response = await raw.post(f"{url}/v1/messages", json=body(system="Be brief."))
    assert response.status_code == 200 and response.headers["request-id"].startswith("req_")
    message = response.json()
    assert set(message) == {"id", "type", "role", "model", "content", "stop_reason", "stop_sequence", "usage"}
    assert (message["type"], message["role"], message["model"], message["stop_sequence"]) == (
        "message", "assistant", MODEL, None)
    assert [block["type"] for block in message["content"]] == ["text"]
    assert message["stop_reason"] in ("end_turn", "max_tokens")
    # As the SDK's Usage type has it: the cache writes by duration too, and the tier that served the request.
    assert set(message["usage"]) == {"input_tokens", "output_tokens", "cache_read_input_tokens",
                                     "cache_creation_input_tokens", "cache_creation", "service_tier"}
    assert set(message["usage"]["cache_creation"]) == {"ephemeral_5m_input_tokens", "ephemeral_1h_input_tokens"}
    assert message["usage"]["service_tier"] == "standard"


async def test_a_cache_control_prefix_is_written_once_then_read(start_sim: StartSim) -> None:
    url = await anthropic_sim(start_sim)
    # Longer than the model's minimum cacheable length (``cache_rules``): a shorter prefix is never cached.
    system = [{"type": "text", "text": "You answer questions about rivers. " * 800,
               "cache_control": {"type": "ephemeral"}}]
    async with claude(url) as llm:
        first = await llm.chat(ask(system=system))
        second = await llm.chat(ask("Name three lakes.", system=system))
        plain = await llm.chat(ask())
    assert first.cache_creation_tokens > 100 and first.cached_tokens == 0
    assert (second.cached_tokens, second.cache_creation_tokens) == (first.cache_creation_tokens, 0)
    assert (plain.cached_tokens, plain.cache_creation_tokens) == (0, 0)
    assert first.prompt_tokens > first.cache_creation_tokens  # input_tokens holds the uncached rest


# --- errors --------------------------------------------------------------------------------


async def test_every_error_has_anthropics_envelope(start_sim: StartSim, raw: httpx.AsyncClient) -> None:
    url = await anthropic_sim(start_sim)
    no_version = await raw.post(f"{url}/v1/messages", json=body(), headers={"anthropic-version": ""})
    system_turn = await raw.post(f"{url}/v1/messages", json=body() | {
        "messages": [{"role": "system", "content": "x"}, {"role": "user", "content": "y"}]})
    no_max = await raw.post(f"{url}/v1/messages", json={"model": MODEL, "messages": [{"role": "user", "content": "y"}]})
    empty = await raw.post(f"{url}/v1/messages", json=body() | {"messages": []})
    overloaded = await raw.post(f"{url}/v1/messages", json=body("[[sim:529]]"))
    unknown = await raw.get(f"{url}/v1/messages/nowhere")
    for response, status, kind in ((no_version, 400, "invalid_request_error"),
                                   (system_turn, 400, "invalid_request_error"),
                                   (no_max, 400, "invalid_request_error"), (empty, 400, "invalid_request_error"),
                                   (overloaded, 529, "overloaded_error"), (unknown, 404, "not_found_error")):
        assert response.status_code == status
        assert response.json()["type"] == "error" and response.json()["error"]["type"] == kind
    assert "anthropic-version" in no_version.json()["error"]["message"]
    assert 'role "system"' in system_turn.json()["error"]["message"]
    assert no_max.json()["error"]["message"] == "max_tokens: Field required"
    assert overloaded.headers["retry-after"] == "1"


async def test_a_wrong_or_missing_key_is_a_401(start_sim: StartSim, raw: httpx.AsyncClient) -> None:
    url = await anthropic_sim(start_sim, api_key="right-key")
    missing = await raw.post(f"{url}/v1/messages", json=body(), headers={"x-api-key": ""})
    assert missing.status_code == 401 and missing.json()["error"]["type"] == "authentication_error"
    async with claude(url, max_retries=0) as llm:
        with pytest.raises(AuthenticationError) as caught:
            await llm.chat(ask())
    assert caught.value.status_code == 401
    async with LLMClient(provider="anthropic", base_url=url, api_key="right-key") as llm:
        assert (await llm.chat(ask())).text


@pytest.mark.parametrize(("marker", "exception"), [
    ("400", BadRequestError), ("403", PermissionDeniedError), ("404", NotFoundError), ("413", APIStatusError),
])
async def test_a_client_error_is_raised_at_once(
    start_sim: StartSim, marker: str, exception: type[APIStatusError]
) -> None:
    url = await anthropic_sim(start_sim)
    async with claude(url, max_retries=3) as llm:
        with pytest.raises(exception) as caught:
            await llm.chat(ask(f"[[sim:{marker}]] hello"))
    assert caught.value.status_code == int(marker) and caught.value.attempts == 1


@pytest.mark.parametrize("marker", ["429", "529", "500"])
async def test_a_provider_error_is_retried_then_answered(
    start_sim: StartSim, raw: httpx.AsyncClient, marker: str
) -> None:
    url = await anthropic_sim(start_sim, retry_after=0.0)
    async with claude(url) as llm:
        result = await llm.chat(ask(f"[[sim:{marker}x1]] hello"))
    assert result.attempts == 2 and result.text
    counters = await stats(raw, url)
    assert counters["by_status"] == {marker: 1, "200": 1} and counters["messages"] == 1


@pytest.mark.parametrize(("marker", "exception"), [("429", RateLimitError), ("529", InternalServerError)])
async def test_a_provider_error_that_persists_is_raised(
    start_sim: StartSim, marker: str, exception: type[APIStatusError]
) -> None:
    url = await anthropic_sim(start_sim, retry_after=0.0)
    async with claude(url, max_retries=1) as llm:
        with pytest.raises(exception) as caught:
            await llm.chat(ask(f"[[sim:{marker}]] hello"))
    assert caught.value.status_code == int(marker) and caught.value.attempts == 2


async def test_queued_and_random_faults_speak_anthropic(start_sim: StartSim, raw: httpx.AsyncClient) -> None:
    url = await anthropic_sim(start_sim)
    await raw.post(f"{url}/_sim/faults", json={"faults": ["403"]})
    queued = await raw.post(f"{url}/v1/messages", json=body())
    await raw.post(f"{url}/_sim/config", json={"rate_529": 1.0, "retry_after": 2})
    drawn = await raw.post(f"{url}/v1/messages", json=body())
    assert (queued.status_code, queued.json()["error"]["type"]) == (403, "permission_error")
    assert (drawn.status_code, drawn.json()["error"]["type"], drawn.headers["retry-after"]) == (
        529, "overloaded_error", "2")


# --- quotas --------------------------------------------------------------------------------


async def test_a_quota_sends_anthropics_rate_limit_headers(start_sim: StartSim, raw: httpx.AsyncClient) -> None:
    url = await anthropic_sim(start_sim, rpm=2, tpm=100_000)
    answers = [await raw.post(f"{url}/v1/messages", json=body()) for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 429]
    assert [a.headers["anthropic-ratelimit-requests-remaining"] for a in answers] == ["1", "0", "0"]
    for answer in answers:
        assert answer.headers["anthropic-ratelimit-requests-limit"] == "2"
        assert answer.headers["anthropic-ratelimit-tokens-limit"] == "100000"
        reset = datetime.fromisoformat(answer.headers["anthropic-ratelimit-requests-reset"].replace("Z", "+00:00"))
        assert 0 < reset.timestamp() - time.time() <= 61
    refused = answers[2]
    assert refused.json()["error"]["type"] == "rate_limit_error" and "per minute" in refused.json()["error"]["message"]
    assert 1 <= int(refused.headers["retry-after"]) <= 60
    assert (await stats(raw, url))["quota_rejections"] == 1


async def test_the_client_waits_out_a_quota_429(start_sim: StartSim) -> None:
    url = await anthropic_sim(start_sim, rpm=60, quota_window=1.0)  # one request a second
    async with claude(url) as llm:
        first = await llm.chat(ask())
        second = await llm.chat(ask("Name three seas."))
    assert first.text and second.text


# --- the face ------------------------------------------------------------------------------


async def test_the_simulator_names_its_anthropic_base_url() -> None:
    async with Simulator(SimulatorConfig()) as sim:
        assert sim.anthropic_base_url == sim.base_url.removesuffix("/v1")
        assert not sim.anthropic_base_url.endswith("/v1")


def test_python_m_simulator_prints_both_base_urls() -> None:
    process = subprocess.Popen([sys.executable, "-m", "llm_dispatch.simulator", "--port", "0"], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        openai_url = process.stdout.readline().strip()
        anthropic_line = process.stdout.readline().strip()
    finally:
        process.terminate()
        process.wait(timeout=60)
        if process.stdout is not None:
            process.stdout.close()
    assert openai_url.startswith("http://127.0.0.1:") and openai_url.endswith("/v1")
    assert anthropic_line == f"Anthropic base URL: {openai_url.removesuffix('/v1')}"
