"""The simulator refuses with a 400, in each provider's error shape and words, what the real API refuses: a body
sent as given over real sockets, so `--simulate` is red where the provider would be. The input check refuses the
same prompts with the file (tests/test_model_rules.py, tests/test_message_shapes.py); here is what a raw client,
or a batch line, meets."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from llm_dispatch.simulator import Simulator, SimulatorConfig

from conftest import Sim

USER = [{"role": "user", "content": "Name three rivers."}]
CALL = {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}
TOOL = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object", "properties": {}}}}


def chat(sim: Sim, **body: Any) -> httpx.Response:
    return httpx.post(f"{sim.base_url}/chat/completions", json={"messages": USER, **body}, timeout=60)


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ({"model": "gpt-6-luna", "max_tokens": 50},
         {"message": "Unsupported parameter: 'max_tokens' is not supported with this model. Use "
                     "'max_completion_tokens' instead.", "param": "max_tokens", "code": "unsupported_parameter"}),
        ({"model": "gpt-5", "temperature": 0},
         {"message": "Unsupported value: 'temperature' does not support 0 with this model. Only the default (1) value "
                     "is supported.", "param": "temperature", "code": "unsupported_value"}),
        ({"model": "o4-mini", "stop": ["\n"]},
         {"message": "Unsupported parameter: 'stop' is not supported with this model.", "param": "stop",
          "code": "unsupported_parameter"}),
        ({"model": "gpt-5.6-luna", "tools": [TOOL]},
         {"message": "Function tools with reasoning_effort are not supported for gpt-5.6-luna in /v1/chat/completions. "
                     "To use function tools, use /v1/responses or set reasoning_effort to 'none'.",
          "param": "reasoning_effort", "code": None}),
        ({"model": "gpt-5.1", "reasoning_effort": "minimal"},
         {"message": "Unsupported value: 'minimal' is not supported with the 'gpt-5.1' model. Supported values are: "
                     "'none', 'low', 'medium', and 'high'.", "param": "reasoning_effort", "code": "unsupported_value"}),
        ({"model": "gpt-4o-mini", "messages": [*USER, {"role": "assistant", "content": None, "tool_calls": [CALL]},
                                               {"role": "tool", "content": "18 C"}]},
         {"message": "Missing parameter 'tool_call_id': messages with role 'tool' must have a 'tool_call_id'.",
          "param": "messages.[2].tool_call_id", "code": None}),
        ({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": [{"type": "image", "url": "x"}]}]},
         {"message": "Invalid value: 'image'. Supported values are: 'text', 'image_url', 'input_audio', and 'file'.",
          "param": "messages[0].content[0].type", "code": "invalid_value"}),
        ({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "iVBORw0KGgo"}}]}]},
         {"message": "Invalid image URL: 'messages[0].content[0].image_url.url'. Expected a base64-encoded data URL "
                     "with an image MIME type (e.g. 'data:image/png;base64,aW1nIGJ5dGVzIGhlcmU='), but got a value "
                     "without the 'data:' prefix.", "param": "messages[0].content[0].image_url.url",
          "code": "invalid_value"}),
    ],
    ids=["max_tokens to a reasoning model", "temperature to gpt-5", "stop to o4-mini", "tools at default effort",
         "effort gpt-5.1 does not take", "tool message without id", "unknown part type", "base64 without data:"],
)
def test_a_chat_body_the_api_refuses_is_a_400_in_openais_words(sim: Sim, body: dict, error: dict) -> None:
    answer = chat(sim, **body)
    assert answer.status_code == 400
    assert answer.json() == {"error": {**error, "type": "invalid_request_error"}}


@pytest.mark.parametrize(
    "body",
    [
        {"model": "gpt-6-luna", "max_completion_tokens": 50},  # what llm-dispatch sends for max_tokens
        {"model": "gpt-6-luna", "temperature": 0.2, "reasoning_effort": "none", "tools": [TOOL]},
        {"model": "gpt-4o-mini", "messages": [*USER, {"role": "assistant", "content": None, "tool_calls": [CALL]},
                                              {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}]},
    ],
)
def test_a_chat_body_the_api_takes_is_answered(sim: Sim, body: dict) -> None:
    assert chat(sim, **body).status_code == 200


# --- Anthropic ------------------------------------------------------------------------------------------------


def message(sim: Sim, *, version: str = "2023-06-01", **body: Any) -> httpx.Response:
    sent = {"model": "claude-haiku-4-5", "max_tokens": 64, "messages": USER, **body}
    return httpx.post(f"{sim.root}/v1/messages", json=sent, headers={"anthropic-version": version}, timeout=60)


@pytest.mark.parametrize(
    ("version", "body", "text"),
    [
        ("2023-06-01", {"model": "claude-sonnet-5-5", "tools": [{"name": "w", "input_schema": {"type": "object"}}],
                        "tool_choice": {"type": "any"}},
         'tool_choice: type "tool" and "any" are not supported for this model.'),
        ("2023-06-01", {"temperature": 0.2, "top_p": 0.9},
         "temperature and top_p cannot both be specified for this model. Please use only one."),
        ("2026-10-21", {"temperature": 0.2}, "temperature: Extra inputs are not permitted"),
        ("2023-06-01", {"model": "claude-opus-5-5", "thinking": {"type": "disabled"}},
         '"thinking.type.disabled" is not supported for this model.'),
        ("2023-06-01", {"service_tier": "flex"}, "service_tier: Input should be 'auto' or 'standard_only'"),
        ("2023-06-01", {"messages": [*USER, {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_1", "name": "w", "input": {}}]}, {"role": "user", "content": "and?"}]},
         "messages.1: `tool_use` ids were found without `tool_result` blocks immediately after: toolu_1. Each "
         "`tool_use` block must have a corresponding `tool_result` block in the next message."),
    ],
    ids=["forced tool use on sonnet 5.5", "temperature and top_p on haiku 4.5", "temperature under 2026-10-21",
         "thinking off on opus 5.5", "OpenAI's service tier", "tool_use unanswered"],
)
def test_a_messages_body_the_api_refuses_is_a_400_in_anthropics_shape(
    sim: Sim, version: str, body: dict, text: str
) -> None:
    answer = message(sim, version=version, **body)
    assert answer.status_code == 400
    assert answer.json()["type"] == "error"
    assert answer.json()["error"] == {"type": "invalid_request_error", "message": text}


def test_the_same_body_is_taken_under_the_version_that_allows_it(sim: Sim) -> None:
    assert message(sim, version="2023-06-01", temperature=0.2).status_code == 200


@pytest.fixture(scope="module")
def batch_sim() -> Iterator[str]:
    with Simulator.in_thread(SimulatorConfig(batch_processing_seconds=0.2, seed=5)) as url:
        yield url.removesuffix("/v1")


def test_a_message_batch_answers_a_refused_request_as_errored_and_the_rest(batch_sim: str) -> None:
    headers = {"anthropic-version": "2023-06-01"}
    ok = {"model": "claude-haiku-4-5", "max_tokens": 32, "messages": USER}
    refused = {**ok, "model": "claude-opus-4-7", "temperature": 0.1}
    created = httpx.post(f"{batch_sim}/v1/messages/batches", headers=headers, timeout=60,
                         json={"requests": [{"custom_id": "ok", "params": ok}, {"custom_id": "no", "params": refused}]})
    assert created.status_code == 200  # the create checks shapes; a model's refusal is that request's result
    batch = created.json()
    deadline = time.monotonic() + 10
    while batch["processing_status"] != "ended":
        assert time.monotonic() < deadline
        time.sleep(0.05)
        batch = httpx.get(f"{batch_sim}/v1/messages/batches/{batch['id']}", headers=headers, timeout=60).json()
    text = httpx.get(batch["results_url"], headers=headers, timeout=60).text
    results = {item["custom_id"]: item["result"] for item in map(json.loads, text.splitlines())}
    assert results["ok"]["type"] == "succeeded"
    assert results["no"] == {"type": "errored", "error": {"type": "error", "error": {
        "type": "invalid_request_error",
        "message": "temperature: setting sampling parameters to non-default values is not supported for this model."}}}


def test_an_openai_batch_line_the_api_refuses_is_a_400_line(sim: Sim) -> None:
    lines = [{"custom_id": "ok", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": "gpt-6-luna", "max_completion_tokens": 20, "messages": USER}},
             {"custom_id": "raw", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": "gpt-6-luna", "max_tokens": 20, "messages": USER}}]
    upload = httpx.post(f"{sim.base_url}/files", data={"purpose": "batch"}, timeout=60,
                        files={"file": ("in.jsonl", "".join(json.dumps(line) + "\n" for line in lines))})
    created = httpx.post(f"{sim.base_url}/batches", timeout=60, json={
        "input_file_id": upload.json()["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"})
    batch = created.json()
    deadline = time.monotonic() + 20
    while batch["status"] != "completed":
        assert time.monotonic() < deadline, batch["status"]
        time.sleep(0.1)
        batch = httpx.get(f"{sim.base_url}/batches/{batch['id']}", timeout=60).json()
    # As OpenAI does, a line that failed is in the error file, beside the answers in the output file.
    text = "".join(httpx.get(f"{sim.base_url}/files/{batch[kind]}/content", timeout=60).text
                   for kind in ("output_file_id", "error_file_id"))
    answers = {line["custom_id"]: line["response"] for line in map(json.loads, text.splitlines())}
    assert answers["ok"]["status_code"] == 200
    assert answers["raw"]["status_code"] == 400
    assert answers["raw"]["body"]["error"]["code"] == "unsupported_parameter"
