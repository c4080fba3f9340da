"""OpenAI's Responses API (``/v1/responses``): a prompt as ``instructions`` and ``input`` items, and a response
object read into the same ``ChatResult`` a chat answer makes (text, refusal, tool calls, truncation, usage).

A prompt keeps chat's shapes (messages, and chat's parameter names where Responses renames them): its leading
system or developer messages become ``instructions``, the rest input items (an assistant's tool calls
``function_call`` items, a tool message a ``function_call_output``); ``max_completion_tokens``/``max_tokens`` become
``max_output_tokens``, ``reasoning_effort`` ``reasoning.effort``, a chat ``response_format`` ``text.format``, chat's
function tools the Responses' flat ones. Wire format: openai-python ``types/responses/`` (``response.py``,
``response_usage.py``, ``easy_input_message_param.py``, ``response_create_params.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

from .._exceptions import APIResponseValidationError
from ._responses import Chat, count as _count, parse_answer, parse_json
from .._status import BACKGROUND_WINDOWS
from .._types import ChatRequest, ChatResult

__all__ = [
    "BACKGROUND_EFFORTS",
    "BACKGROUND_MIN_OUTPUT",
    "RESPONSES_PARAMS",
    "runs_in_background",
    "TERMINAL_RESPONSE_STATUSES",
    "parse_response",
    "parse_response_status",
    "response_from_body",
    "response_param_problem",
    "response_result_from_body",
    "responses_body",
]

# Parameters a Responses request takes as they are (response_create_params.py), and chat's names it renames.
RESPONSES_PARAMS = frozenset({
    "max_output_tokens", "reasoning", "text", "tools", "tool_choice", "parallel_tool_calls", "temperature", "top_p",
    "service_tier", "metadata", "store", "background", "truncation", "user", "safety_identifier", "prompt_cache_key",
    "max_tool_calls", "top_logprobs", "include", "instructions",
})
_RENAMED = frozenset({"max_completion_tokens", "max_tokens", "reasoning_effort", "response_format"})
# Statuses a response does not leave (response_status.py); queued and in_progress are still running.
TERMINAL_RESPONSE_STATUSES = frozenset({"completed", "incomplete", "failed", "cancelled"})


# A generation this long may outlast a connection: a cap at least this large, or reasoning at these efforts, goes
# out in background mode (created, then polled), as OpenAI's background guide advises for long reasoning tasks.
BACKGROUND_MIN_OUTPUT = 32_000
BACKGROUND_EFFORTS = frozenset({"high", "xhigh", "max"})


def runs_in_background(request: ChatRequest) -> bool:
    """Whether ``request`` goes out in background mode: a Responses request that asks for it, that was created in
    it already, routed to a background lane, or whose generation may be long (a large maximum output, or reasoning
    at high effort)."""
    if request.endpoint != "responses":
        return False
    params = request.params
    if request.background_id is not None or params.get("background") is True or request.lane in BACKGROUND_WINDOWS:
        return True
    if params.get("background") is False:
        return False
    cap = params.get("max_output_tokens") or params.get("max_completion_tokens") or params.get("max_tokens")
    effort = params.get("reasoning_effort") or (params.get("reasoning") or {}).get("effort")
    return (isinstance(cap, int) and cap >= BACKGROUND_MIN_OUTPUT) or effort in BACKGROUND_EFFORTS


def response_param_problem(name: str, value: Any) -> str | None:
    """Why ``name`` cannot go in a Responses request (one line), or None."""
    if name in RESPONSES_PARAMS or name in _RENAMED:
        return None
    return (f"the responses endpoint has no {name}; it takes {', '.join(sorted(RESPONSES_PARAMS | _RENAMED))}")


def responses_body(request: ChatRequest) -> dict[str, Any]:
    """The ``/responses`` body for ``request`` (real-time and batch lines alike)."""
    params = dict(request.params)
    body: dict[str, Any] = {name: value for name, value in params.items() if name not in _RENAMED}
    cap = params.get("max_completion_tokens") or params.get("max_tokens")
    if cap is not None and "max_output_tokens" not in body:
        body["max_output_tokens"] = cap
    effort = params.get("reasoning_effort")
    if effort is not None:
        body["reasoning"] = {**(body.get("reasoning") or {}), "effort": effort}
    fmt = params.get("response_format")
    if isinstance(fmt, Mapping):
        body["text"] = {**(body.get("text") or {}), "format": _text_format(fmt)}
    if isinstance(body.get("tools"), list):
        body["tools"] = [_tool(tool) for tool in body["tools"]]
    choice = body.get("tool_choice")
    if isinstance(choice, Mapping) and isinstance(choice.get("function"), Mapping):
        body["tool_choice"] = {"type": "function", "name": choice["function"].get("name")}
    instructions, items = _input(request.messages)
    if instructions and "instructions" not in body:
        body["instructions"] = instructions
    body["model"] = request.model
    body["input"] = items
    return body


def _text_format(fmt: Mapping[str, Any]) -> dict[str, Any]:
    """Chat's ``response_format`` as a Responses ``text.format`` (its json_schema's fields one level up)."""
    if fmt.get("type") == "json_schema" and isinstance(fmt.get("json_schema"), Mapping):
        return {"type": "json_schema", **fmt["json_schema"]}
    return dict(fmt)


def _tool(tool: Any) -> Any:
    """A chat function tool (``{"type": "function", "function": {...}}``) as a Responses one (its fields flat)."""
    if isinstance(tool, Mapping) and tool.get("type") == "function" and isinstance(tool.get("function"), Mapping):
        return {"type": "function", **tool["function"]}
    return tool


def _input(messages: list[dict[str, Any]]) -> tuple[str | None, list[dict[str, Any]]]:
    """(instructions from the leading system/developer messages with text, the rest as input items)."""
    lead: list[str] = []
    rest = list(messages)
    while rest and rest[0].get("role") in ("system", "developer") and isinstance(rest[0].get("content"), str):
        lead.append(rest.pop(0)["content"])
    items: list[dict[str, Any]] = []
    for message in rest:
        role = message.get("role")
        if role == "tool":
            items.append({"type": "function_call_output", "call_id": message.get("tool_call_id"),
                          "output": _plain(message.get("content"))})
            continue
        content = message.get("content")
        if content is not None and content != "":
            items.append({"role": role, "content": _content(content, role=role)})
        for call in message.get("tool_calls") or ():
            function = call.get("function") or {}
            items.append({"type": "function_call", "call_id": call.get("id"), "name": function.get("name"),
                          "arguments": function.get("arguments", "")})
    return ("\n\n".join(lead) or None), items


def _content(content: Any, *, role: Any) -> Any:
    if not isinstance(content, list):
        return content
    parts = []
    for part in content:
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind == "text":
            parts.append({"type": "output_text" if role == "assistant" else "input_text", "text": part.get("text")})
        elif kind == "image_url":
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, Mapping) else image
            parts.append({"type": "input_image", "image_url": url, "detail": (image or {}).get("detail", "auto")
                          if isinstance(image, Mapping) else "auto"})
        else:
            parts.append(part)
    return parts


def _plain(content: Any) -> str:
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))
    return "" if content is None else str(content)


def response_from_body(body: Any) -> Chat | None:
    """A finished response object's answer, or None when it is none (not a response, or still running, failed,
    cancelled). ``status: incomplete`` is an answer cut short: its reason (``max_output_tokens``,
    ``content_filter``) is the finish reason."""
    if not isinstance(body, Mapping) or body.get("status") not in ("completed", "incomplete"):
        return None
    output = body.get("output")
    if not isinstance(output, list):
        return None
    texts: list[str] = []
    refusals: list[str] = []
    calls: list[dict[str, Any]] = []
    for item in output:
        if not isinstance(item, Mapping):
            continue
        if item.get("type") == "message":
            for part in item.get("content") or ():
                if not isinstance(part, Mapping):
                    continue
                if part.get("type") == "output_text" and isinstance(part.get("text"), str):
                    texts.append(part["text"])
                elif part.get("type") == "refusal" and part.get("refusal"):
                    refusals.append(str(part["refusal"]))
        elif item.get("type") == "function_call":
            calls.append({"id": item.get("call_id"), "type": "function",
                          "function": {"name": item.get("name"), "arguments": item.get("arguments", "")}})
    if body.get("status") == "incomplete":
        details = body.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, Mapping) else None
        finish = str(reason or "incomplete")
    else:
        finish = "tool_calls" if calls else "stop"
    usage = body.get("usage") if isinstance(body.get("usage"), Mapping) else {}
    assert isinstance(usage, Mapping)
    given = usage.get("input_tokens_details")
    given = given if isinstance(given, Mapping) else {}
    made = usage.get("output_tokens_details")
    made = made if isinstance(made, Mapping) else {}
    prompt_tokens, completion_tokens = _count(usage.get("input_tokens")), _count(usage.get("output_tokens"))
    tier, model, response_id = body.get("service_tier"), body.get("model"), body.get("id")
    result = ChatResult(
        text="".join(texts) if texts or not (refusals or calls) else None,
        finish_reason=finish, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
        cached_tokens=_count(given.get("cached_tokens")), model=model if isinstance(model, str) else None,
        response_id=response_id if isinstance(response_id, str) else None, latency_s=0.0,
        cache_creation_tokens=_count(given.get("cache_write_tokens")),
        reasoning_tokens=_count(made.get("reasoning_tokens")),
        service_tier=tier if isinstance(tier, str) else None, tool_calls=calls or None,
        refusal="\n".join(refusals) or None,
    )
    return Chat(result, _count(usage.get("total_tokens")) or prompt_tokens + completion_tokens)


def parse_response_status(response: httpx.Response) -> tuple[str, Any]:
    """(status, body) of a response object, as a background poll reads it."""
    body = parse_json(response)
    status = body.get("status") if isinstance(body, Mapping) else None
    if not isinstance(status, str) or not isinstance(body.get("id"), str):
        raise APIResponseValidationError(f"the body is no response object: {str(body)[:300]!r}")
    return status, body


def parse_response(response: httpx.Response) -> Chat:
    return parse_answer(response, response_from_body, what="no finished response (status completed or incomplete)")


def response_result_from_body(body: Any) -> ChatResult | None:
    """A batch output line's response object as a result, or None when it is no finished response."""
    chat = response_from_body(body)
    return None if chat is None else chat.result
