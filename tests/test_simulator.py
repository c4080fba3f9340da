"""The bundled simulator over real sockets: the OpenAI shapes it answers, its faults, quotas and stats."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
import httpx
import pytest
import pytest_asyncio

from llm_dispatch.core._exceptions import ConfigError
from llm_dispatch.simulator import Simulator, SimulatorConfig, completion_text, count_message_tokens, count_tokens
from llm_dispatch.simulator._cli import _config_from_args, _parser

from conftest import StartSim


@pytest_asyncio.fixture(loop_scope="function")
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as client_session:
        yield client_session


def chat(content: str = "Say hello.", **params: Any) -> dict[str, Any]:
    return {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": content}], **params}


async def post(
    session: aiohttp.ClientSession, url: str, body: Any, *, headers: dict[str, str] | None = None
) -> tuple[int, Mapping[str, str], Any]:
    """POST a chat request; returns (status, headers (case-insensitive), parsed JSON body)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with session.post(f"{url}/chat/completions", data=data, headers=headers) as response:
        return response.status, response.headers, await response.json()


async def admin(session: aiohttp.ClientSession, url: str, path: str, body: Any = None) -> Any:
    root = url.removesuffix("/v1")
    method = session.get if body is None and path in ("stats", "config", "faults") else session.post
    async with method(f"{root}/_sim/{path}", json=body) as response:
        return response.status, await response.json()


# --- happy path ----------------------------------------------------------------------------


async def test_completion_has_openai_shape_and_consistent_usage(start_sim: StartSim, session: aiohttp.ClientSession):
    url = await start_sim()
    body = chat("Summarise the history of lighthouses in three sentences.")
    status, headers, data = await post(session, url, body)

    assert status == 200
    assert url.endswith("/v1")
    assert headers["Content-Type"].startswith("application/json")
    assert headers["x-request-id"].startswith("req_")
    assert data["id"].startswith("chatcmpl-")
    assert data["object"] == "chat.completion"
    assert isinstance(data["created"], int)
    assert data["model"] == "gpt-4o-mini"
    assert data["system_fingerprint"]
    (choice,) = data["choices"]
    assert choice["index"] == 0
    assert choice["message"]["role"] == "assistant"
    assert choice["finish_reason"] == "stop"
    content = choice["message"]["content"]
    usage = data["usage"]
    assert usage["prompt_tokens"] == count_message_tokens(body["messages"])
    assert usage["completion_tokens"] == count_tokens(content)
    assert 20 <= usage["completion_tokens"] <= 300
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == 0
    assert usage["completion_tokens_details"]["reasoning_tokens"] == 0


async def test_answers_are_reproducible_for_a_body_and_seed(start_sim: StartSim, session: aiohttp.ClientSession):
    first, again = await start_sim(seed=1), await start_sim(seed=1)
    other_seed = await start_sim(seed=2)

    async def answer(url: str, content: str) -> tuple[str, int]:
        _, _, data = await post(session, url, chat(content))
        return data["choices"][0]["message"]["content"], data["usage"]["completion_tokens"]

    assert await answer(first, "Tell me a story.") == await answer(again, "Tell me a story.")
    assert await answer(first, "Tell me a story.") == await answer(first, "Tell me a story.")
    assert await answer(first, "Tell me a story.") != await answer(other_seed, "Tell me a story.")
    assert await answer(first, "Tell me a story.") != await answer(first, "Tell me a joke.")


@pytest.mark.parametrize("limit_param", ["max_tokens", "max_completion_tokens"])
async def test_max_tokens_cuts_the_answer_with_finish_reason_length(
    start_sim: StartSim, session: aiohttp.ClientSession, limit_param: str
):
    url = await start_sim()
    _, _, data = await post(session, url, chat(**{limit_param: 7}))

    assert data["choices"][0]["finish_reason"] == "length"
    assert data["usage"]["completion_tokens"] == 7
    assert count_tokens(data["choices"][0]["message"]["content"]) == 7


async def test_n_gives_several_choices_counted_in_usage(start_sim: StartSim, session: aiohttp.ClientSession):
    url = await start_sim()
    _, _, data = await post(session, url, chat(n=3))

    contents = [c["message"]["content"] for c in data["choices"]]
    assert [c["index"] for c in data["choices"]] == [0, 1, 2]
    assert len(set(contents)) == 3
    assert data["usage"]["completion_tokens"] == sum(count_tokens(c) for c in contents)


async def test_a_repeated_long_prefix_reports_cached_tokens_in_steps_of_128(
    start_sim: StartSim, session: aiohttp.ClientSession
):
    url = await start_sim()
    system = {"role": "system", "content": "Rules of the house. " * 300}
    first = {"model": "gpt-4o-mini", "messages": [system, {"role": "user", "content": "Question one?"}]}
    second = {"model": "gpt-4o-mini", "messages": [system, {"role": "user", "content": "Question two?"}]}
    short = chat("Short prompts are never cached.")

    _, _, one = await post(session, url, first)
    _, _, two = await post(session, url, second)
    _, _, three = await post(session, url, short)
    await post(session, url, short)
    _, _, four = await post(session, url, short)

    assert one["usage"]["prompt_tokens"] >= 1024
    assert one["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    cached = two["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 1024 and cached % 128 == 0
    assert cached <= count_message_tokens([system])
    assert three["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert four["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


async def test_latency_is_applied(start_sim: StartSim, session: aiohttp.ClientSession):
    url = await start_sim(latency=0.2)
    started = time.perf_counter()
    status, _, _ = await post(session, url, chat())
    assert status == 200
    assert 0.2 <= time.perf_counter() - started < 30  # the latency, not a hang


async def test_models_are_listed(start_sim: StartSim, session: aiohttp.ClientSession):
    url = await start_sim(models=["model-a", "model-b"])
    async with session.get(f"{url}/models") as response:
        data = await response.json()
    assert [m["id"] for m in data["data"]] == ["model-a", "model-b"]
    assert data["object"] == "list"


async def test_unknown_v1_path_is_a_json_404(start_sim: StartSim, session: aiohttp.ClientSession):
    url = await start_sim()
    async with session.post(f"{url}/moderations", json={}) as response:
        assert response.status == 404
        assert (await response.json())["error"]["message"] == "Invalid URL (POST /v1/moderations)"


# --- refusals a real API gives ------------------------------------------------------------------


async def test_unknown_model_gets_model_not_found(start_sim: StartSim, session: aiohttp.ClientSession):
    url = await start_sim(models=["gpt-4o-mini"])
    status, _, data = await post(session, url, {**chat(), "model": "gpt-9"})
    assert status == 404
    assert data["error"]["code"] == "model_not_found"
    assert data["error"]["type"] == "invalid_request_error"
    status, _, _ = await post(session, url, chat())
    assert status == 200


async def test_api_key_is_required_when_configured(start_sim: StartSim, session: aiohttp.ClientSession):
    url = await start_sim(api_key="sk-test-123456")
    missing, _, _ = await post(session, url, chat())
    wrong, _, wrong_body = await post(session, url, chat(), headers={"Authorization": "Bearer sk-wrong-000000"})
    right, _, _ = await post(session, url, chat(), headers={"Authorization": "Bearer sk-test-123456"})
    azure, _, _ = await post(session, url, chat(), headers={"api-key": "sk-test-123456"})

    assert (missing, wrong, right, azure) == (401, 401, 200, 200)
    assert wrong_body["error"]["code"] == "invalid_api_key"
    assert "sk-wrong-000000" not in wrong_body["error"]["message"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"{not json", None),
        ({"model": "gpt-4o-mini"}, "messages"),
        ({"model": "gpt-4o-mini", "messages": []}, "messages"),
        ({"messages": [{"role": "user", "content": "hi"}]}, "model"),
        ({"model": "gpt-4o-mini", "messages": [{"content": "hi"}]}, "messages[0].role"),
        ({"model": "gpt-4o-mini", "messages": [{"role": "user"}]}, "messages[0].content"),
        ({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, "max_tokens"),
    ],
    ids=["not-json", "no-messages", "empty-messages", "no-model", "no-role", "no-content", "bad-max-tokens"],
)
async def test_invalid_requests_get_a_400_naming_the_parameter(
    start_sim: StartSim, session: aiohttp.ClientSession, body: Any, param: str | None
):
    url = await start_sim()
    status, _, data = await post(session, url, body)
    assert status == 400
    assert data["error"]["type"] == "invalid_request_error"
    assert data["error"]["param"] == param
    assert data["error"]["message"]


# --- faults on demand ---------------------------------------------------------------------------


async def test_queued_faults_answer_the_next_requests_in_order(start_sim: StartSim, session: aiohttp.ClientSession):
    url = await start_sim(retry_after=0.25)
    status, queued = await admin(session, url, "faults", {"faults": ["429", "500", "503", "malformed"]})
    assert status == 200 and queued["faults"] == ["429", "500", "503", "malformed"]

    async with session.post(f"{url}/chat/completions", json=chat()) as response:
        assert response.status == 429
        assert response.headers["retry-after"] == "1"
        assert response.headers["retry-after-ms"] == "250"
        assert (await response.json())["error"]["code"] == "rate_limit_exceeded"
    async with session.post(f"{url}/chat/completions", json=chat()) as response:
        assert response.status == 500
        assert (await response.json())["error"]["type"] == "server_error"
    async with session.post(f"{url}/chat/completions", json=chat()) as response:
        assert response.status == 503
    async with session.post(f"{url}/chat/completions", json=chat()) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("application/json")
        with pytest.raises(json.JSONDecodeError):
            json.loads(await response.read())
    status, _, _ = await post(session, url, chat())
    assert status == 200

    _, stats = await admin(session, url, "stats")
    assert stats["by_status"] == {"429": 1, "500": 1, "503": 1, "malformed": 1, "200": 1}
    assert stats["completions"] == 1


async def test_unknown_queued_fault_is_refused(start_sim: StartSim, session: aiohttp.ClientSession):
    url = await start_sim()
    status, data = await admin(session, url, "faults", {"faults": ["500", "418"]})
    assert status == 400 and "418" in data["error"]["message"]


@pytest.mark.parametrize("fault", ["400", "401", "404", "429", "500", "503"])
async def test_marker_forces_a_status_every_time(start_sim: StartSim, session: aiohttp.ClientSession, fault: str):
    url = await start_sim()
    body = chat(f"please [[sim:{fault}]] thanks")
    statuses = [(await post(session, url, body))[0] for _ in range(2)]
    assert statuses == [int(fault)] * 2


async def test_marker_with_count_fails_that_many_times_per_body(start_sim: StartSim, session: aiohttp.ClientSession):
    url = await start_sim()
    flaky, other = chat("flaky [[sim:500x2]]"), chat("other [[sim:500x2]]")

    statuses = [(await post(session, url, flaky))[0] for _ in range(3)]
    assert statuses == [500, 500, 200]
    assert (await post(session, url, other))[0] == 500  # its own count

    await admin(session, url, "reset", {})
    assert (await post(session, url, flaky))[0] == 500  # reset forgets the counts


async def test_unknown_marker_is_a_400(start_sim: StartSim, session: aiohttp.ClientSession):
    url = await start_sim()
    status, _, data = await post(session, url, chat("[[sim:418]]"))
    assert status == 400 and "[[sim:418]]" in data["error"]["message"]


async def test_malformed_marker_is_a_200_with_truncated_json(start_sim: StartSim):
    url = await start_sim()
    async with httpx.AsyncClient() as client:
        response = await client.post(f"{url}/chat/completions", json=chat("[[sim:malformed]]"))
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/json")
    with pytest.raises(json.JSONDecodeError):
        response.json()


async def test_drop_closes_the_connection_without_a_response(start_sim: StartSim, session: aiohttp.ClientSession):
    url = await start_sim()
    async with httpx.AsyncClient() as client:
        with pytest.raises(httpx.RemoteProtocolError):
            await client.post(f"{url}/chat/completions", json=chat("[[sim:drop]]"))

    await admin(session, url, "faults", {"faults": ["drop"]})
    with pytest.raises(aiohttp.ServerDisconnectedError):
        await post(session, url, chat())
    assert (await post(session, url, chat()))[0] == 200  # a new connection works


async def test_hang_never_answers_and_does_not_block_others(start_sim: StartSim, session: aiohttp.ClientSession):
    url = await start_sim()

    async def hung() -> None:
        async with httpx.AsyncClient(timeout=60) as client:
            await client.post(f"{url}/chat/completions", json=chat("[[sim:hang]]"))

    hanging = asyncio.create_task(hung())
    for _ in range(500):  # until the simulator holds the hanging request
        if (await admin(session, url, "stats"))[1]["in_flight"] == 1:
            break
        await asyncio.sleep(0.01)
    assert (await post(session, url, chat()))[0] == 200
    assert not hanging.done()  # answered while the other still hangs
    hanging.cancel()
    with pytest.raises(asyncio.CancelledError):
        await hanging

    # The abandoned request stops counting as in flight once its client has gone.
    for _ in range(50):
        _, stats = await admin(session, url, "stats")
        if stats["in_flight"] == 0:
            break
        await asyncio.sleep(0.02)
    assert stats["in_flight"] == 0
    assert stats["by_status"]["hang"] == 1


async def test_hang_ends_in_a_disconnect_after_hang_seconds(start_sim: StartSim, session: aiohttp.ClientSession):
    url = await start_sim(hang_seconds=0.2)
    await admin(session, url, "faults", {"faults": ["hang"]})
    started = time.perf_counter()
    with pytest.raises(aiohttp.ServerDisconnectedError):
        await post(session, url, chat())
    assert 0.2 <= time.perf_counter() - started < 30  # its own hang, not the default


async def test_random_faults_follow_the_rates_and_the_seed(start_sim: StartSim, session: aiohttp.ClientSession):
    url = await start_sim(rate_500=0.2, rate_429=0.1, retry_after=0, seed=7)

    async def statuses() -> list[int]:
        return [(await post(session, url, chat(f"q{i}")))[0] for i in range(300)]

    first = await statuses()
    assert 40 <= first.count(500) <= 80
    assert 15 <= first.count(429) <= 45
    assert first.count(200) == 300 - first.count(500) - first.count(429)
    await admin(session, url, "reset", {})
    assert await statuses() == first  # reset reseeds


# --- quotas -------------------------------------------------------------------------------------


async def test_rpm_quota_answers_429_with_rate_limit_headers(start_sim: StartSim, session: aiohttp.ClientSession):
    url = await start_sim(rpm=3)
    remaining = []
    for i in range(3):
        status, headers, _ = await post(session, url, chat(f"q{i}"))
        assert status == 200
        assert headers["x-ratelimit-limit-requests"] == "3"
        remaining.append(headers["x-ratelimit-remaining-requests"])
    status, headers, data = await post(session, url, chat("one too many"))

    assert remaining == ["2", "1", "0"]
    assert status == 429
    assert data["error"]["code"] == "rate_limit_exceeded" and data["error"]["type"] == "requests"
    assert headers["x-ratelimit-limit-requests"] == "3"
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert headers["x-ratelimit-reset-requests"].endswith("s")
    assert 59 <= int(headers["retry-after"]) <= 60
    assert 59_000 <= int(headers["retry-after-ms"]) <= 60_000
    _, stats = await admin(session, url, "stats")
    assert stats["quota_rejections"] == 1 and stats["by_status"] == {"200": 3, "429": 1}


async def test_tpm_quota_charges_prompt_plus_max_tokens(start_sim: StartSim, session: aiohttp.ClientSession):
    url = await start_sim(tpm=300)
    body = chat("Hello there", max_tokens=80)
    charge = count_message_tokens(body["messages"]) + 80
    fits = 300 // charge

    for _ in range(fits):
        status, headers, _ = await post(session, url, body)
        assert status == 200
    status, headers, data = await post(session, url, body)

    assert status == 429
    assert data["error"]["type"] == "tokens"
    assert headers["x-ratelimit-limit-tokens"] == "300"
    assert int(headers["x-ratelimit-remaining-tokens"]) == 300 - fits * charge
    assert headers["x-ratelimit-reset-tokens"].endswith("s")
    assert "retry-after" in headers and "retry-after-ms" in headers
    assert "x-ratelimit-limit-requests" not in headers  # no RPM quota configured


async def test_a_request_bigger_than_the_tpm_quota_is_too_large(start_sim: StartSim, session: aiohttp.ClientSession):
    url = await start_sim(tpm=50)
    status, _, data = await post(session, url, chat(max_tokens=100))
    assert status == 429 and data["error"]["message"].startswith("Request too large")


# --- observability and control ------------------------------------------------------------------


async def test_peak_in_flight_counts_concurrent_requests(start_sim: StartSim, session: aiohttp.ClientSession):
    url = await start_sim(latency=0.2)
    # Half of them fail: a request counts from arrival to answer whatever the answer is.
    bodies = [chat(f"q{i}" + (" [[sim:500]]" if i % 2 else "")) for i in range(20)]
    statuses = await asyncio.gather(*(post(session, url, b) for b in bodies))
    _, stats = await admin(session, url, "stats")
    assert sorted(s for s, _, _ in statuses) == [200] * 10 + [500] * 10
    assert stats["peak_in_flight"] == 20
    assert stats["in_flight"] == 0
    assert stats["requests_total"] == 20

    await admin(session, url, "reset", {})
    limit = asyncio.Semaphore(5)

    async def limited(body: dict[str, Any]) -> None:
        async with limit:
            await post(session, url, body)

    await asyncio.gather(*(limited(chat(f"r{i}")) for i in range(10)))
    _, stats = await admin(session, url, "stats")
    assert stats["peak_in_flight"] == 5


async def test_stats_count_tokens_and_reset_zeroes_them(start_sim: StartSim, session: aiohttp.ClientSession):
    url = await start_sim()
    _, _, one = await post(session, url, chat("a"))
    _, _, two = await post(session, url, chat("b"))
    _, stats = await admin(session, url, "stats")

    assert stats["completions"] == 2
    assert stats["prompt_tokens"] == one["usage"]["prompt_tokens"] + two["usage"]["prompt_tokens"]
    assert stats["completion_tokens"] == one["usage"]["completion_tokens"] + two["usage"]["completion_tokens"]

    _, stats = await admin(session, url, "reset", {})
    assert (stats["requests_total"], stats["completions"], stats["prompt_tokens"], stats["by_status"]) == (0, 0, 0, {})


async def test_config_can_be_patched_at_runtime(start_sim: StartSim, session: aiohttp.ClientSession):
    url = await start_sim(api_key="sk-secret-key")
    status, config = await admin(session, url, "config", {"rate_500": 1, "api_key": None})
    assert status == 200 and config["rate_500"] == 1.0
    assert (await post(session, url, chat()))[0] == 500

    status, error = await admin(session, url, "config", {"rate_500": 0.8, "rate_429": 0.5})
    assert status == 400 and "at most 1" in error["error"]["message"]
    status, error = await admin(session, url, "config", {"latency_ms": 5})
    assert status == 400 and "latency_ms" in error["error"]["message"]

    await admin(session, url, "config", {"rate_500": 0, "api_key": "sk-secret-key"})
    _, config = await admin(session, url, "config")
    assert config["api_key"] == "***"
    assert (await post(session, url, chat(), headers={"Authorization": "Bearer sk-secret-key"}))[0] == 200


# --- runners and helpers ------------------------------------------------------------------------


def test_in_thread_runner_serves_sync_callers():
    with Simulator.in_thread(SimulatorConfig(seed=3)) as url:
        response = httpx.post(f"{url}/chat/completions", json=chat())
        assert response.status_code == 200
        assert httpx.get(url.removesuffix("/v1") + "/_sim/stats").json()["completions"] == 1
    with pytest.raises(httpx.ConnectError):
        httpx.post(f"{url}/chat/completions", json=chat())


def test_in_process_runner_prints_its_url_and_serves():
    with Simulator.in_process(SimulatorConfig(models=["only-this"])) as url:
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
        assert httpx.post(f"{url}/chat/completions", json={**chat(), "model": "only-this"}).status_code == 200
        assert httpx.post(f"{url}/chat/completions", json=chat()).status_code == 404


def test_command_line_options_build_the_config():
    args = _parser().parse_args(["--port", "0", "--latency", "0.2", "--rate-500", "0.1", "--models", "a, b",
                                 "--rpm", "60", "--config-json", '{"seed": 9, "latency": 1}'])
    config = _config_from_args(args)
    assert (config.latency, config.rate_500, config.models, config.rpm, config.seed) == (0.2, 0.1, ["a", "b"], 60, 9)


def test_config_rejects_impossible_values():
    with pytest.raises(ConfigError):
        SimulatorConfig(rate_500=1.5)
    with pytest.raises(ConfigError):
        SimulatorConfig(latency=-1)
    with pytest.raises(ConfigError):
        SimulatorConfig(models=[])


def test_completion_text_is_exactly_the_requested_tokens():
    for digest in range(0, 2**64, 2**64 // 997):
        for tokens in (1, 2, 3, 57, 300):
            for stop in (True, False):
                text = completion_text(digest=digest, tokens=tokens, stop=stop)
                assert count_tokens(text) == tokens
                assert not stop or tokens == 1 or text.endswith(".")


def test_count_tokens_prices_long_words_and_other_scripts_higher():
    assert count_tokens("") == 0
    assert count_tokens("Hello, world!") == 4
    assert count_tokens("internationalization") > count_tokens("nation")
    assert count_tokens("日本語のテキスト") > count_tokens("abc")


async def test_a_capacity_429_names_no_quota_and_leaves_the_quota_headers_unexhausted(
    start_sim: StartSim, session: aiohttp.ClientSession
):
    url = await start_sim(rpm=600, rate_429=1.0, retry_after=0.2)
    status, headers, data = await post(session, url, chat("busy"))
    assert status == 429
    assert "per min" not in data["error"]["message"] and "quota" not in data["error"]["message"]
    assert headers["retry-after-ms"] == "200"
    assert headers["x-ratelimit-limit-requests"] == "600"
    assert int(headers["x-ratelimit-remaining-requests"]) > 0


async def test_a_quota_window_of_a_second_enforces_a_sixtieth_of_the_quota(
    start_sim: StartSim, session: aiohttp.ClientSession
):
    url = await start_sim(rpm=120, quota_window=1.0)
    first, second, third = [await post(session, url, chat(f"q{i}")) for i in range(3)]
    assert [first[0], second[0], third[0]] == [200, 200, 429]
    assert first[1]["x-ratelimit-limit-requests"] == "120"  # stated per minute, as OpenAI does
    assert second[1]["x-ratelimit-remaining-requests"] == "0"
    assert int(third[1]["retry-after"]) <= 1


async def test_reuse_port_lets_two_simulators_serve_one_port() -> None:
    first, second, third = Simulator(), Simulator(), Simulator()
    url = await first.start(reuse_port=True)
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    try:
        # Without reuse_port a second server cannot bind the port; with it, both serve it.
        with pytest.raises(OSError):
            await third.start(port=port)
        assert await second.start(port=port, reuse_port=True) == url
        async with httpx.AsyncClient() as client:
            for _ in range(4):
                response = await client.post(f"{url}/chat/completions", json={
                    "model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]})
                assert response.status_code == 200
        answered = first.stats()["requests_total"] + second.stats()["requests_total"]
        assert answered == 4
    finally:
        await second.stop()
        await first.stop()


def test_the_command_line_takes_reuse_port() -> None:
    assert _parser().parse_args(["--reuse-port"]).reuse_port is True
    assert _parser().parse_args([]).reuse_port is False
