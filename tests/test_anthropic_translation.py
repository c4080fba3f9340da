"""OpenAI-style requests as Anthropic Messages bodies, and a Message Batch's result lines read back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from llm_dispatch.core import ChatRequest, read_message_batch_results
from llm_dispatch.core.wire._anthropic import anthropic_params
from llm_dispatch.core.batches._batch_files import INVALID_OUTPUT_LINE


def body(messages: list[dict[str, Any]], **params: Any) -> dict[str, Any]:
    return anthropic_params(ChatRequest(model="claude-x", messages=messages, params=params), default_max_tokens=1000)


USER = {"role": "user", "content": "hi"}


def test_system_messages_are_hoisted_in_order_and_max_tokens_defaults() -> None:
    sent = body([{"role": "system", "content": "A"}, USER, {"role": "developer", "content": "B"}])
    assert sent == {"model": "claude-x", "max_tokens": 1000, "system": "A\n\nB", "messages": [USER]}


def test_system_blocks_keep_cache_control() -> None:
    cached = {"type": "text", "text": "long", "cache_control": {"type": "ephemeral"}}
    sent = body([{"role": "system", "content": "A"}, {"role": "system", "content": [cached]}, USER])
    assert sent["system"] == [{"type": "text", "text": "A"}, cached]


@pytest.mark.parametrize(("params", "expected"), [
    ({"max_tokens": 7}, 7), ({"max_completion_tokens": 8}, 8), ({"max_tokens": None}, 1000)])
def test_max_tokens_comes_from_either_openai_name(params: dict[str, Any], expected: int) -> None:
    assert body([USER], **params)["max_tokens"] == expected


def test_stop_user_and_sampling_parameters() -> None:
    sent = body([USER], stop="END", user="u-1", temperature=0.5, top_p=0.9, top_k=5, n=1)
    assert sent["stop_sequences"] == ["END"] and sent["metadata"] == {"user_id": "u-1"}
    assert (sent["temperature"], sent["top_p"], sent["top_k"]) == (0.5, 0.9, 5) and "n" not in sent
    assert body([USER], stop=["a", "b"])["stop_sequences"] == ["a", "b"]


def test_function_tools_and_tool_choice_translate() -> None:
    tool = {"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}
    sent = body([USER], tools=[tool], tool_choice={"type": "function", "function": {"name": "f"}},
                parallel_tool_calls=False)
    assert sent["tools"] == [{"name": "f", "description": "d", "input_schema": {"type": "object"}}]
    assert sent["tool_choice"] == {"type": "tool", "name": "f", "disable_parallel_tool_use": True}
    assert body([USER], tool_choice="required")["tool_choice"] == {"type": "any"}
    native = {"name": "g", "input_schema": {"type": "object"}}
    assert body([USER], tools=[native])["tools"] == [native]


def test_tool_calls_and_tool_results_become_blocks() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
    sent = body([USER, {"role": "assistant", "content": None, "tool_calls": [call]},
                 {"role": "tool", "tool_call_id": "call_1", "content": "42"},
                 {"role": "tool", "tool_call_id": "call_2", "content": "43"}])
    assert sent["messages"][1] == {"role": "assistant",
                                   "content": [{"type": "tool_use", "id": "call_1", "name": "f", "input": {"x": 1}}]}
    assert sent["messages"][2] == {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "call_1", "content": "42"},
        {"type": "tool_result", "tool_use_id": "call_2", "content": "43"}]}


def test_image_and_text_parts_become_content_blocks() -> None:
    parts = [{"type": "text", "text": "what is this?"},
             {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
             {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}}]
    sent = body([{"role": "user", "content": parts}])
    assert sent["messages"][0]["content"] == [
        {"type": "text", "text": "what is this?"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
        {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}}]


@pytest.mark.parametrize(("name", "value", "words"), [
    ("logprobs", True, "no Anthropic equivalent"), ("logit_bias", {"1": 1}, "no Anthropic equivalent"),
    ("presence_penalty", 0.1, "no Anthropic equivalent"), ("seed", 1, "no Anthropic equivalent"),
    ("response_format", {"type": "json_object"}, "only of type 'json_schema'"), ("n", 2, "n must be 1"),
    ("temperature", 1.5, "0 to 1"), ("made_up", 1, "not a parameter"), ("metadata", {"k": "v"}, "user_id"),
])
def test_a_parameter_with_no_anthropic_equivalent_is_refused_by_name(name: str, value: Any, words: str) -> None:
    with pytest.raises(ValueError, match=f"params.{name}: .*{words}"):
        body([USER], **{name: value})


def result_file(tmp_path: Path, lines: list[Any]) -> Path:
    path = tmp_path / "results.jsonl"
    path.write_bytes(b"".join((line if isinstance(line, bytes) else json.dumps(line).encode()) + b"\n"
                              for line in lines))
    return path


def errored(custom_id: str, kind: str, message: str) -> dict[str, Any]:
    return {"custom_id": custom_id, "result": {"type": "errored", "error": {"type": "error", "error": {
        "type": kind, "message": message}}}}


def test_each_result_line_type_is_read(tmp_path: Path) -> None:
    message = {"id": "msg_1", "type": "message", "model": "claude-x", "content": [{"type": "text", "text": "ok"}],
               "stop_reason": "max_tokens",
               "usage": {"input_tokens": 3, "output_tokens": 2, "cache_read_input_tokens": 4}}
    path = result_file(tmp_path, [
        {"custom_id": "s", "result": {"type": "succeeded", "message": message}},
        errored("e1", "invalid_request_error", "bad"),
        errored("e2", "overloaded_error", "busy"),
        *({"custom_id": kind[0], "result": {"type": kind}} for kind in ("canceled", "expired")),
        b"",
        b"{not json",
        {"custom_id": "w", "result": {"type": "weird"}},
        {"result": {"type": "canceled"}},
        {"custom_id": "m", "result": {"type": "succeeded", "message": {"content": None}}},
    ])
    lines = list(read_message_batch_results(path))
    ok = lines[0]
    assert ok.custom_id == "s" and ok.result is not None and ok.result.text == "ok"
    assert (ok.result.prompt_tokens, ok.result.cached_tokens, ok.result.finish_reason) == (7, 4, "max_tokens")
    assert [(line.custom_id, line.error_code, line.retryable) for line in lines[1:]] == [
        ("e1", "invalid_request_error", False), ("e2", "overloaded_error", True),
        ("c", "canceled", True), ("e", "expired", True),
        (None, INVALID_OUTPUT_LINE, False), ("w", INVALID_OUTPUT_LINE, True), (None, INVALID_OUTPUT_LINE, False),
        # A succeeded result with no Message was answered (billed): never sent again.
        ("m", "unusable_answer", False),
    ]
    assert lines[1].error_message == "bad" and lines[5].line == 7
