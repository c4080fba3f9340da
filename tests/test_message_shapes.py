"""Message shapes as the providers accept them: what the API would refuse with a 400 is refused with the file (one
line, the field named), what it accepts is not; and a misspelled parameter is named with its likely meaning."""

from __future__ import annotations

from typing import Any

import pytest

from llm_dispatch.core import InputError
from llm_dispatch.core.inputs._inputs import parse_prompt_dicts

USER = {"role": "user", "content": "What is the weather in Paris?"}
CALL = {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}
CALLED = {"role": "assistant", "content": None, "tool_calls": [CALL]}
ANSWERED = {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}
PNG = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="


def user(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "content": list(parts)}


def check(messages: list[Any], *, model: str = "gpt-4o-mini", params: dict[str, Any] | None = None) -> str | None:
    """The one line the input check gives, or None when the prompt is accepted."""
    record: dict[str, Any] = {"messages": messages, "model": model}
    if params is not None:
        record["params"] = params
    try:
        parse_prompt_dicts([record], default_model="m")
    except InputError as error:
        [line] = str(error).splitlines()
        return line
    return None


@pytest.mark.parametrize(
    "messages",
    [
        [USER, CALLED, ANSWERED],  # an assistant turn that only calls tools: content null
        [USER, {**CALLED, "content": ""}, ANSWERED, {"role": "assistant", "content": "It is sunny."}, USER],
        [user({"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": PNG}})],
        [user({"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg", "detail": "low"}})],
        [user({"type": "input_audio", "input_audio": {"data": "UklGR...", "format": "wav"}})],
        [user({"type": "file", "file": {"file_id": "file-abc"}})],
        [{"role": "developer", "content": [{"type": "text", "text": "Be brief."}]}, USER],
        [USER, {"role": "assistant", "content": [{"type": "refusal", "refusal": "I can't."}]}, USER],
    ],
    ids=["tool calls, content null", "tool calls then more turns", "data URL image", "web image", "audio", "file",
         "developer text parts", "refusal part"],
)
def test_shapes_openai_accepts_are_accepted(messages: list[Any]) -> None:
    assert check(messages) is None


@pytest.mark.parametrize(
    ("messages", "expected"),
    [
        ([USER, CALLED, {"role": "tool", "content": "18 C"}],
         "a tool message needs 'tool_call_id', the id of the tool call it answers (field 'messages[2].tool_call_id')"),
        ([USER, CALLED, {**ANSWERED, "tool_call_id": "call_9"}],
         "a tool message answers a tool call of the assistant message just before it; 'call_9' is none of them"),
        ([USER, ANSWERED], "a tool message answers a tool call of the assistant message just before it"),
        ([USER, CALLED, USER], "each tool call of messages[1] needs a tool message answering it next; none answers "
                               "'call_1' (field 'messages[1].tool_calls')"),
        ([USER, {"role": "assistant", "content": None}], "content must be a string or a list of content parts "
                                                         "(field 'messages[1].content')"),
        ([user({"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}})],
         "a user message's content parts are text, image_url, input_audio, file, not 'image' "
         "(field 'messages[0].content[0].type')"),
        ([user({"type": "image_url", "image_url": "https://example.com/a.png"})],
         "image_url must be an object: {\"url\": ...} (field 'messages[0].content[0].image_url')"),
        ([user({"type": "image_url", "image_url": {"url": "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAf"}})],
         "image_url.url must be an http(s) URL or a data URL like data:image/png;base64,..., not 'iVBORw0KG"),
        ([user({"type": "image_url", "image_url": {"url": "data:text/plain;base64,aGk="}})], "image_url.url must be"),
        ([user({"type": "image_url", "image_url": {"url": PNG, "detail": "ultra"}})],
         "image_url.detail is one of auto, low, high, not 'ultra'"),
        ([user({"type": "input_audio", "input_audio": {"data": "x", "format": "ogg"}})],
         "an input_audio part needs {data: base64, format: 'wav' or 'mp3'}"),
        ([user({"type": "file", "file": {"filename": "a.pdf"}})], "a file part needs file.file_data (base64) or "
                                                                 "file.file_id"),
        ([user({"type": "refusal", "refusal": "no"})], "a user message's content parts are text, image_url, "
                                                      "input_audio, file, not 'refusal'"),
        ([{"role": "system", "content": [{"type": "image_url", "image_url": {"url": PNG}}]}, USER],
         "a system message's content parts are text, not 'image_url'"),
        ([user({"type": "text"})], "a text part needs 'text', a string (field 'messages[0].content[0].text')"),
        ([USER, {"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": CALL["function"]}]}],
         "a tool call needs its 'id' (the tool message answering it names it) (field 'messages[1].tool_calls[0].id')"),
        ([USER, {"role": "assistant", "content": None, "tool_calls": [{**CALL, "function": {"name": "weather",
                                                                                            "arguments": {"a": 1}}}]}],
         "a function tool call's arguments must be a string (of JSON)"),
        ([{"role": "robot", "content": "beep"}], "role must be one of assistant, developer, function, system, tool, "
                                                 "user, not 'robot' (field 'messages[0].role')"),
        ([user()], "content must be a string or a non-empty list of content parts (field 'messages[0].content')"),
    ],
    ids=["tool message without id", "answers an unknown call", "tool message first", "tool call unanswered",
         "assistant with nothing", "unknown part type", "image_url as a string", "base64 without data:",
         "data URL not an image", "bad detail", "audio format", "file without data or id", "refusal from the user",
         "image in a system message", "text part without text", "tool call without id", "arguments as an object",
         "unknown role", "empty parts"],
)
def test_shapes_openai_refuses_are_refused_with_the_file(messages: list[Any], expected: str) -> None:
    line = check(messages)
    assert line is not None and line.startswith("prompts:1: ") and expected in line


def test_another_servers_content_kinds_pass_for_its_models() -> None:
    # A vLLM or Ollama model is not OpenAI's: kinds OpenAI does not know are for that server to take or refuse.
    video = user({"type": "video_url", "video_url": {"url": "https://example.com/v.mp4"}})
    assert check([video], model="Qwen/Qwen2.5-VL-7B-Instruct") is None
    assert "not 'video_url'" in (check([video], model="gpt-4o") or "")


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"max_token": 50}, "'max_token' is not a request parameter; did you mean 'max_tokens'? (field "
                            "'params.max_token')"),
        ({"temprature": 0.2}, "'temprature' is not a request parameter; did you mean 'temperature'?"),
        ({"Top_P": 0.2}, "did you mean 'top_p'?"),
        ({"reasoning-effort": "low"}, "did you mean 'reasoning_effort'?"),
    ],
)
def test_a_misspelled_parameter_is_named_with_its_likely_meaning(params: dict[str, Any], expected: str) -> None:
    line = check([USER], params=params)
    assert line is not None and expected in line


def test_other_servers_parameters_are_not_taken_for_typos() -> None:
    assert check([USER], model="llama3.1", params={"top_k": 40, "min_p": 0.05, "repetition_penalty": 1.1}) is None


# --- Anthropic, after the translation ----------------------------------------------------------------------


CLAUDE = "claude-haiku-4-5"


def claude(messages: list[Any], *, version: str = "2023-06-01", **params: Any) -> str | None:
    try:
        parse_prompt_dicts([{"messages": messages, "model": CLAUDE, "params": {"max_tokens": 100, **params}}],
                           default_model="m", anthropic_version=version)
    except InputError as error:
        [line] = str(error).splitlines()
        return line
    return None


def test_claude_takes_tool_turns_with_null_content_and_its_own_blocks() -> None:
    assert claude([USER, CALLED, ANSWERED]) is None
    cached = {"type": "text", "text": "long context", "cache_control": {"type": "ephemeral"}}
    document = {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBER"}}
    assert claude([user(cached, document, {"type": "text", "text": "Summarise."})]) is None
    assert claude([user({"type": "image_url", "image_url": {"url": PNG}})]) is None


@pytest.mark.parametrize(
    ("messages", "expected"),
    [
        ([user({"type": "input_audio", "input_audio": {"data": "x", "format": "wav"}})],
         "cannot be sent to Anthropic: an input_audio part has no Anthropic equivalent (Claude takes no audio)"),
        ([user({"type": "file", "file": {"file_id": "file-1"}})],
         "cannot be sent to Anthropic: a 'file' part does not translate to Anthropic: give Anthropic's own "
         "'document' block instead"),
        ([user({"type": "image_url", "image_url": {"url": "data:image/bmp;base64,Qk0="}})],
         "Anthropic refuses it (as sent, messages.0.content.0.source.base64.media_type: Input should be "
         "'image/jpeg', 'image/png', 'image/gif' or 'image/webp') (field 'messages')"),
        ([user({"type": "video", "source": {}})], "Anthropic refuses it (as sent, messages.0.content.0.type: Input "
                                                  "tag 'video' found using 'type' does not match"),
        ([USER, {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "w", "input": {}}]},
          user({"type": "text", "text": "and?"})],
         "as sent, messages.1: `tool_use` ids were found without `tool_result` blocks immediately after: toolu_1"),
        ([user({"type": "tool_result", "tool_use_id": "toolu_9", "content": "x"})],
         "unexpected `tool_use_id` found in `tool_result` blocks: toolu_9"),
    ],
    ids=["audio", "file", "bmp image", "unknown block", "tool_use unanswered", "tool_result with no tool_use"],
)
def test_what_anthropic_refuses_after_the_translation_is_refused(messages: list[Any], expected: str) -> None:
    line = claude(messages)
    assert line is not None and expected in line


def test_api_version_2026_10_21_refuses_a_document_in_an_assistant_turn() -> None:
    document = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "notes"}}
    messages = [USER, {"role": "assistant", "content": [document]}, USER]
    assert claude(messages) is None
    assert "`document` blocks are not accepted in `assistant` messages" in (claude(messages, version="2026-10-21") or "")
