"""Endpoints other than chat: named per prompt or per job, refused where they cannot go, and a batch only created
for an endpoint whose output lines can be read back (issue 27)."""

from __future__ import annotations

import base64
import json
import sqlite3
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import respx

from llm_dispatch.core import (
    APIResponseValidationError,
    ChatRequest,
    ConfigError,
    InputError,
    LLMClient,
    OpenAIBatchApi,
    check_prompts,
    read_batch_output,
    vector_floats,
    write_batch_files,
)
from llm_dispatch.core.inputs._inputs import parse_prompt_dicts
from llm_dispatch.simulator import embedding_vector

from conftest import FakeTime, cli, make_client, rows, write_prompts


async def test_a_batch_to_an_endpoint_whose_lines_cannot_be_read_is_refused_before_anything_is_sent(
    router: respx.Router, fake_time: FakeTime
) -> None:
    # No route: any request would fail the test (the router is strict).
    async with make_client(router, fake_time) as client:
        with pytest.raises(ConfigError, match="/v1/moderations cannot be read back by llm-dispatch"):
            await OpenAIBatchApi(client).create_batch(input_file_id="file-abc", endpoint="/v1/moderations")


def test_the_endpoint_is_named_per_prompt_and_defaults_to_the_jobs() -> None:
    [plain, named] = parse_prompt_dicts([{"prompt": "a"}, {"prompt": "b", "endpoint": "chat"}],
                                        default_model="gpt-6-luna")
    assert plain.endpoint == named.endpoint == "chat"


def test_embeddings_to_anthropic_are_refused_at_the_input_check_in_one_line(tmp_path: Path) -> None:
    path = write_prompts(tmp_path / "p.jsonl", [
        {"id": 1, "prompt": "a", "model": "claude-haiku-5-5", "endpoint": "embeddings"},
        {"id": 2, "prompt": "b", "endpoint": "moderations"},
    ])
    with pytest.raises(InputError) as caught:
        check_prompts(path, default_model="gpt-6-luna")
    message = str(caught.value)
    assert "p.jsonl:1: Anthropic has no embeddings endpoint" in message
    assert "p.jsonl:2: 'moderations' is not an endpoint; use chat, responses, embeddings" in message


def test_the_jobs_endpoint_names_the_endpoint_of_prompts_that_name_none(tmp_path: Path) -> None:
    path = write_prompts(tmp_path / "p.jsonl", [{"id": 1, "prompt": "a", "model": "claude-haiku-5-5"}])
    with pytest.raises(InputError, match="Anthropic has no embeddings endpoint"):
        check_prompts(path, default_model="gpt-6-luna", default_endpoint="embeddings")


@pytest.mark.prefect
def test_run_with_endpoint_embeddings_to_a_claude_model_exits_2_in_one_line(
    cli_env: dict[str, str], tmp_path: Path
) -> None:
    path = write_prompts(tmp_path / "p.jsonl", [{"id": 1, "prompt": "a"}])
    done = cli("run", str(path), "--simulate", "--endpoint", "embeddings", "--model", "claude-haiku-5-5",
               env=cli_env, cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    errors = [line for line in (done.stdout + done.stderr).splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Anthropic has no embeddings endpoint" in errors[0]
    assert "Traceback" not in done.stderr


# --- embeddings -------------------------------------------------------------------------------------------------


def embedding_prompt(text: str, **fields: Any) -> ChatRequest:
    return ChatRequest(model="text-embedding-3-small", messages=[{"role": "user", "content": text}],
                       endpoint="embeddings", **fields)


def close_to(got: list[float], want: list[float]) -> bool:
    return len(got) == len(want) and all(abs(a - b) < 1e-6 for a, b in zip(got, want))


async def test_an_embedding_over_a_real_socket_is_the_simulators_vector_as_float32_bytes(start_sim: Any) -> None:
    base_url = await start_sim(latency=0.0)
    async with LLMClient(base_url=base_url, api_key="sk-test") as client:
        full = await client.chat(embedding_prompt("the cat sat"))
        short = await client.chat(embedding_prompt("the cat sat", params={"dimensions": 8, "encoding_format": "float"}))
    assert full.embedding is not None and len(full.embedding) == 4 * 1536
    assert close_to(vector_floats(full.embedding), embedding_vector("the cat sat", model="text-embedding-3-small"))
    assert short.embedding is not None and len(short.embedding) == 4 * 8
    assert close_to(vector_floats(short.embedding),
                    embedding_vector("the cat sat", model="text-embedding-3-small", dimensions=8))
    assert full.text is None and full.prompt_tokens > 0 and full.completion_tokens == 0


async def test_an_embeddings_body_asks_for_base64_and_a_float_answer_is_read_too(
    router: respx.Router, fake_time: FakeTime
) -> None:
    route = router.post("/embeddings", name="embeddings").respond(200, json={
        "object": "list", "model": "text-embedding-3-small", "usage": {"prompt_tokens": 3, "total_tokens": 3},
        "data": [{"object": "embedding", "index": 0, "embedding": [0.5, -0.25]}]})
    async with make_client(router, fake_time) as client:
        result = await client.chat(embedding_prompt("hi", params={"dimensions": 2}))
    assert json.loads(route.calls.last.request.content) == {
        "encoding_format": "base64", "dimensions": 2, "model": "text-embedding-3-small", "input": "hi"}
    assert result.embedding == struct.pack("<2f", 0.5, -0.25) and result.prompt_tokens == 3


def test_a_batch_file_holds_one_endpoint_and_its_lines_are_read_as_that_endpoints(tmp_path: Path) -> None:
    chat = ChatRequest(model="text-embedding-3-small", messages=[{"role": "user", "content": "x"}])
    files = write_batch_files([("p1", embedding_prompt("x")), ("p2", chat), ("p3", embedding_prompt("y"))],
                              directory=tmp_path)
    by_endpoint = {file.endpoint: file for file in files}
    assert sorted(by_endpoint) == ["chat", "embeddings"] and by_endpoint["embeddings"].custom_ids == ["p1", "p3"]
    lines = [json.loads(line) for line in by_endpoint["embeddings"].path.read_text().splitlines()]
    assert {line["url"] for line in lines} == {"/v1/embeddings"}
    assert lines[0]["body"] == {"encoding_format": "base64", "model": "text-embedding-3-small", "input": "x"}

    vector = struct.pack("<2f", 1.0, 0.0)
    output = tmp_path / "out.jsonl"
    output.write_text(json.dumps({"custom_id": "p1", "error": None, "response": {"status_code": 200, "body": {
        "object": "list", "model": "text-embedding-3-small", "usage": {"prompt_tokens": 1, "total_tokens": 1},
        "data": [{"index": 0, "embedding": base64.b64encode(vector).decode()}]}}}) + "\n")
    [line] = read_batch_output(output, endpoint="embeddings")
    assert line.result is not None and line.result.embedding == vector
    # Read as a chat it has no answer: never taken for one, and no endpoint this version cannot read is guessed.
    [as_chat] = read_batch_output(output)
    assert as_chat.result is None
    with pytest.raises(ConfigError):
        read_batch_output(output, endpoint="moderations")


def run_in_both_lanes(
    path: Path, *, endpoint: str, model: str, columns: list[str], cli_env: dict[str, str], db_url: str
) -> tuple[subprocess.CompletedProcess[str], list[tuple[Any, ...]]]:
    """``llm-dispatch run PATH --endpoint ENDPOINT --model MODEL --json`` for prompts urgent (real-time) and bulk (one
    batch of that endpoint), which succeeds; and each prompt's id with its result's ``columns``, in input order."""
    done = cli("run", str(path), "--endpoint", endpoint, "--model", model, "--json", env=cli_env, cwd=path.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    assert rows(db_url, "SELECT endpoint FROM batches") == [(endpoint,)]
    stored = rows(db_url, f"SELECT p.custom_id, {', '.join('r.' + column for column in columns)} FROM results r "
                          "JOIN prompts p ON p.id = r.prompt_id ORDER BY p.position")
    return done, stored


@pytest.mark.prefect
def test_embeddings_run_in_both_lanes_store_vectors_as_float32_and_are_priced(
    cli_env: dict[str, str], db_url: str, tmp_path: Path
) -> None:
    texts = [f"text {i}" for i in range(6)]
    path = write_prompts(tmp_path / "e.jsonl", [
        {"id": f"e{i}", "input": text, "urgency": "urgent" if i < 3 else "bulk", "params": {"dimensions": 4}}
        for i, text in enumerate(texts)])
    done, stored = run_in_both_lanes(
        path, endpoint="embeddings", model="text-embedding-3-small", cli_env=cli_env, db_url=db_url,
        columns=["route", "embedding", "prompt_tokens", "completion_tokens", "cost_pico_usd", "list_cost_pico_usd"])
    assert [(custom_id, route) for custom_id, route, *_ in stored] == [
        ("e0", "realtime"), ("e1", "realtime"), ("e2", "realtime"), ("e3", "batch"), ("e4", "batch"), ("e5", "batch")]
    for (custom_id, route, vector, prompt_tokens, completion_tokens, cost, list_cost), text in zip(stored, texts):
        assert len(vector) == 16 and completion_tokens == 0
        assert close_to(list(struct.unpack("<4f", vector)),
                        embedding_vector(text, model="text-embedding-3-small", dimensions=4))
        # $0.02 per 1M input tokens, half of it through the Batch API.
        assert list_cost == prompt_tokens * 20_000 and cost == (list_cost if route == "realtime" else list_cost // 2)

    job_id = json.loads(done.stdout)["job_id"]
    exported = cli("export", job_id, env=cli_env, cwd=tmp_path)
    lines = [json.loads(line) for line in exported.stdout.splitlines()]
    assert [line["id"] for line in lines] == [f"e{i}" for i in range(6)] and "answer" not in lines[0]
    assert all(close_to(line["embedding"], list(struct.unpack("<4f", vector)))
               for line, (_, _, vector, *_) in zip(lines, stored))
    npy = tmp_path / "vectors.npy"
    assert cli("export", job_id, "--format", "npy", "--output", str(npy), env=cli_env, cwd=tmp_path).returncode == 0
    raw = npy.read_bytes()
    assert raw[:8] == b"\x93NUMPY\x01\x00"
    header_end = 10 + struct.unpack("<H", raw[8:10])[0]
    assert "'descr': '<f4'" in raw[10:header_end].decode() and "'shape': (6, 4)" in raw[10:header_end].decode()
    assert raw[header_end:] == b"".join(vector for _, _, vector, *_ in stored)


# --- responses ---------------------------------------------------------------------------------------------------


def response_prompt(text: str, *, system: str | None = None, **params: Any) -> ChatRequest:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
    return ChatRequest(model="gpt-4.1-mini", messages=messages, params=params, endpoint="responses")


WEATHER_TOOL = {"type": "function", "function": {"name": "weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


async def test_responses_over_a_real_socket_answer_each_kind_as_chat_does(start_sim: Any) -> None:
    base_url = await start_sim(latency=0.0)
    async with LLMClient(base_url=base_url, api_key="sk-test") as client:
        plain = await client.chat(response_prompt("hello", system="be brief", max_completion_tokens=400))
        refused = await client.chat(response_prompt("hello [[sim:refuse]]"))
        cut = await client.chat(response_prompt("hello", max_completion_tokens=3))
        called = await client.chat(response_prompt("weather in Oslo?", tools=[WEATHER_TOOL]))
    assert plain.text and plain.finish_reason == "stop" and plain.response_id.startswith("resp_")
    assert plain.prompt_tokens > 0 and plain.completion_tokens > 0 and plain.refusal is None
    assert refused.refusal and refused.text is None
    assert cut.finish_reason == "max_output_tokens" and cut.completion_tokens == 3
    assert called.finish_reason == "tool_calls" and called.tool_calls is not None
    [call] = called.tool_calls
    assert call["type"] == "function" and call["function"]["name"] == "weather"
    assert "city" in json.loads(call["function"]["arguments"])


async def test_a_responses_body_takes_instructions_input_items_and_the_renamed_parameters(
    router: respx.Router, fake_time: FakeTime
) -> None:
    route = router.post("/responses", name="responses").respond(200, json={
        "id": "resp_1", "object": "response", "status": "incomplete", "model": "gpt-4.1-mini",
        "incomplete_details": {"reason": "max_output_tokens"}, "service_tier": "default",
        "output": [{"type": "reasoning", "id": "rs_1", "summary": []},
                   {"type": "message", "role": "assistant", "content": [
                       {"type": "output_text", "text": "Half", "annotations": []},
                       {"type": "output_text", "text": " an answer", "annotations": []}]}],
        "usage": {"input_tokens": 30, "input_tokens_details": {"cached_tokens": 10}, "output_tokens": 50,
                  "output_tokens_details": {"reasoning_tokens": 40}, "total_tokens": 80}})
    request = ChatRequest(model="gpt-4.1-mini", endpoint="responses", messages=[
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "q"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}],
        params={"max_completion_tokens": 50, "reasoning_effort": "low", "tools": [WEATHER_TOOL]})
    async with make_client(router, fake_time) as client:
        result = await client.chat(request)
    assert json.loads(route.calls.last.request.content) == {
        "model": "gpt-4.1-mini", "instructions": "be brief", "max_output_tokens": 50, "reasoning": {"effort": "low"},
        "tools": [{"type": "function", "name": "weather", "parameters": WEATHER_TOOL["function"]["parameters"]}],
        "input": [{"role": "user", "content": "q"},
                  {"type": "function_call", "call_id": "call_1", "name": "weather", "arguments": "{}"},
                  {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}]}
    assert (result.text, result.finish_reason, result.prompt_tokens, result.cached_tokens, result.completion_tokens,
            result.reasoning_tokens, result.response_id) == ("Half an answer", "max_output_tokens", 30, 10, 50, 40,
                                                             "resp_1")


def test_responses_to_anthropic_and_chat_only_parameters_are_refused_at_the_input_check(tmp_path: Path) -> None:
    path = write_prompts(tmp_path / "p.jsonl", [
        {"id": 1, "prompt": "a", "model": "claude-haiku-5-5", "endpoint": "responses"},
        {"id": 2, "prompt": "b", "endpoint": "responses", "params": {"logprobs": True}},
        {"id": 3, "prompt": "c", "endpoint": "responses", "params": {"max_output_tokens": 30}},
    ])
    with pytest.raises(InputError) as caught:
        check_prompts(path, default_model="gpt-4.1-mini")
    message = str(caught.value)
    assert "p.jsonl:1: Anthropic has no Responses API" in message
    assert "p.jsonl:2: the responses endpoint has no logprobs" in message
    assert "p.jsonl:3" not in message


@pytest.mark.prefect
def test_responses_run_in_both_lanes_priced_with_refusals_and_truncation_stored(
    cli_env: dict[str, str], db_url: str, tmp_path: Path
) -> None:
    path = write_prompts(tmp_path / "r.jsonl", [
        {"id": "r0", "prompt": "hello", "urgency": "urgent"},
        {"id": "r1", "prompt": "hello [[sim:refuse]]", "urgency": "urgent"},
        {"id": "r2", "prompt": "hello", "urgency": "bulk", "params": {"max_completion_tokens": 3}},
        {"id": "r3", "prompt": "hello there", "urgency": "bulk"},
    ])
    _, stored = run_in_both_lanes(
        path, endpoint="responses", model="gpt-4.1-mini", cli_env=cli_env, db_url=db_url,
        columns=["route", "status", "finish_reason", "response_id", "completion_tokens", "cost_pico_usd",
                 "list_cost_pico_usd"])
    assert [row[:4] for row in stored] == [("r0", "realtime", "succeeded", "stop"), ("r1", "realtime", "refused", "stop"),
                                           ("r2", "batch", "succeeded", "max_output_tokens"),
                                           ("r3", "batch", "succeeded", "stop")]
    assert all(row[4].startswith("resp_") and row[6] > 0 for row in stored)
    assert [row[6] * 2 == row[7] for row in stored] == [False, False, True, True]  # the Batch API's half price


# --- background mode ---------------------------------------------------------------------------------------------


def response_body(status: str, **fields: Any) -> dict[str, Any]:
    body = {"id": "resp_bg", "object": "response", "status": status, "model": "gpt-4.1-mini", "output": [],
            "usage": None, "background": True}
    body.update(fields)
    return body


DONE = response_body("completed", output=[{"type": "message", "role": "assistant", "content": [
    {"type": "output_text", "text": "long answer", "annotations": []}]}],
    usage={"input_tokens": 5, "output_tokens": 40000, "output_tokens_details": {"reasoning_tokens": 39000},
           "total_tokens": 40005})


async def test_a_long_generation_is_created_in_background_mode_its_id_told_at_once_then_polled(
    router: respx.Router, fake_time: FakeTime
) -> None:
    create = router.post("/responses", name="create").respond(200, json=response_body("queued"))
    poll = router.get("/responses/resp_bg", name="poll").mock(side_effect=[
        httpx.Response(200, json=response_body("in_progress")), httpx.Response(503, json={"error": {}}),
        httpx.Response(200, json=DONE)])
    told: list[str] = []

    async def started(response_id: str) -> None:
        assert poll.call_count == 0  # before any poll: stored first
        told.append(response_id)

    async with make_client(router, fake_time, background_poll=5.0) as client:
        result = await client.chat(response_prompt("write a book", reasoning_effort="high"), started=started)
    assert json.loads(create.calls.last.request.content)["background"] is True and create.call_count == 1
    assert told == ["resp_bg"] and poll.call_count == 3  # a failed poll is polled again, never created again
    assert (result.text, result.completion_tokens, result.reasoning_tokens) == ("long answer", 40000, 39000)


async def test_a_stored_background_response_is_polled_and_never_created_again(
    router: respx.Router, fake_time: FakeTime
) -> None:
    poll = router.get("/responses/resp_bg", name="poll").respond(200, json=DONE)
    request = ChatRequest(model="gpt-4.1-mini", messages=[{"role": "user", "content": "x"}], endpoint="responses",
                          background_id="resp_bg")
    async with make_client(router, fake_time) as client:
        result = await client.chat(request)
    assert poll.call_count == 1 and result.text == "long answer"


async def test_a_failed_background_response_is_an_error_that_says_it_may_have_been_billed(
    router: respx.Router, fake_time: FakeTime
) -> None:
    router.get("/responses/resp_bg", name="poll").respond(200, json=response_body(
        "failed", error={"code": "server_error", "message": "the model broke"}))
    request = ChatRequest(model="gpt-4.1-mini", messages=[{"role": "user", "content": "x"}], endpoint="responses",
                          background_id="resp_bg")
    async with make_client(router, fake_time) as client:
        with pytest.raises(APIResponseValidationError, match="resp_bg ended failed: the model broke; it may have been"):
            await client.chat(request)


async def test_background_mode_over_a_real_socket_outlasts_the_request_timeout(start_sim: Any) -> None:
    # 40,000 tokens at 20,000 a second: 2 s, four times the client's request timeout.
    base_url = await start_sim(latency=0.0, slow_tokens_per_second=20_000)
    request = response_prompt("[[sim:slow]] write it all", max_completion_tokens=40_000)
    async with LLMClient(base_url=base_url, api_key="sk-test", request_timeout=0.5, background_poll=0.2) as client:
        result = await client.chat(request)
    assert result.completion_tokens == 40_000 and result.response_id.startswith("resp_")
    async with httpx.AsyncClient() as plain:
        counted = (await plain.get(base_url.removesuffix("/v1") + "/_sim/stats")).json()["by_status"]
    assert counted["background_created"] == 1 and counted["background_completed"] == 1


def stored_background_id(db_url: str) -> bool:
    try:
        return bool(rows(db_url, "SELECT background_id FROM prompts WHERE background_id IS NOT NULL"))
    except sqlite3.OperationalError:  # no database, or no tables yet
        return False


@pytest.mark.prefect
def test_a_run_killed_while_polling_a_background_response_polls_it_again_and_never_creates_it_twice(
    cli_env: dict[str, str], sim: Any, db_url: str, tmp_path: Path
) -> None:
    sim.configure(slow_tokens_per_second=5_000)  # 40,000 tokens: 8 s in the background
    path = write_prompts(tmp_path / "long.jsonl", [
        {"id": "long", "prompt": "[[sim:slow]] write it all", "urgency": "urgent", "endpoint": "responses",
         "model": "gpt-6-luna", "params": {"max_completion_tokens": 40_000}}])
    command = [str(Path(sys.executable).with_name("llm-dispatch")), "run", str(path), "--json"]
    first = subprocess.Popen(command, env=cli_env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not stored_background_id(db_url):
            assert time.monotonic() < deadline and first.poll() is None, "the background response was never stored"
            time.sleep(0.2)
    finally:
        first.kill()  # SIGKILL: nothing of the run's own clean-up happens
        first.wait()
    assert rows(db_url, "SELECT count(*) FROM results") == [(0,)]
    again = subprocess.run(command, env=cli_env, cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert again.returncode == 0, again.stderr[-3000:]
    counted = sim.stats()["by_status"]
    assert counted["background_created"] == 1 and counted["background_completed"] == 1
    assert rows(db_url, "SELECT r.status, r.completion_tokens, r.response_id = p.background_id FROM results r "
                        "JOIN prompts p ON p.id = r.prompt_id") == [("succeeded", 40_000, 1)]
