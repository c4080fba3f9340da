"""An OpenAI-style ``ChatRequest`` as Anthropic's Messages API body, faithfully or not at all.

``anthropic_params`` is the one translation (real-time ``chat`` and Message Batches both use it);
``anthropic_param_problem`` is the check behind it, which input checking runs on every prompt first, so a
parameter with no Anthropic equivalent is refused with the file, never request by request.

Rules: system (and developer) messages go to the top-level ``system`` in order; ``max_tokens`` or
``max_completion_tokens`` becomes ``max_tokens``, else the default (a larger one when the request thinks,
``_model_rules.anthropic_max_tokens``); ``stop`` -> ``stop_sequences``; ``user`` -> ``metadata.user_id``;
OpenAI function tools, ``tool_choice``, assistant ``tool_calls`` and ``tool`` messages become Anthropic tools,
tool_use and tool_result blocks; ``image_url`` parts become image blocks. Anthropic's own blocks and parameters
(``thinking``, ``output_config``, top-level ``cache_control``, ``container``, ``inference_geo``, ``service_tier``,
``speed``, ...) pass through unchanged; what a model refuses is ``_model_rules``' to say.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ..rules._model_rules import DEFAULT_THINKING_MAX_TOKENS
from ..rules._claude_rules import anthropic_max_tokens, anthropic_output_format
from .._params import shown, suggestion
from ._structured import STRUCTURED_TOOL, answer_schema
from .._types import ChatRequest

__all__ = [
    "ANTHROPIC_PARAMS",
    "OPENAI_ONLY_PARAMS",
    "anthropic_param_problem",
    "anthropic_params",
    "has_max_tokens",
]

# Sent as they are: Anthropic's own names (its Messages API's parameters: anthropic-sdk-python
# ``types/message_create_params.py``), or OpenAI's where they mean the same.
_PASSTHROUGH = frozenset({
    "temperature", "top_p", "top_k", "stop_sequences", "thinking", "service_tier", "system", "output_config",
    "cache_control", "container", "inference_geo", "speed", "diagnostics",
})
# Translated by a rule of their own.
_TRANSLATED = frozenset({"max_tokens", "max_completion_tokens", "stop", "user", "metadata", "tools", "tool_choice",
                         "parallel_tool_calls", "n", "response_format"})
ANTHROPIC_PARAMS = _PASSTHROUGH | _TRANSLATED
# OpenAI parameters with no Anthropic equivalent, named so the refusal can say so.
OPENAI_ONLY_PARAMS = frozenset({
    "logprobs", "top_logprobs", "logit_bias", "presence_penalty", "frequency_penalty", "seed",
    "store", "modalities", "audio", "prediction", "reasoning_effort", "web_search_options", "functions",
    "function_call", "stream", "stream_options", "prompt_cache_key", "safety_identifier", "verbosity",
})
_IMAGE_DATA_PREFIX = "data:"
# OpenAI content parts with no Anthropic block to become.
_NO_EQUIVALENT = {
    "input_audio": "an input_audio part has no Anthropic equivalent (Claude takes no audio)",
    "file": "a 'file' part does not translate to Anthropic: give Anthropic's own 'document' block instead",
}
_TOOL_CHOICES = {"auto": {"type": "auto"}, "required": {"type": "any"}, "none": {"type": "none"}}


def has_max_tokens(params: Mapping[str, Any]) -> bool:
    return params.get("max_tokens") is not None or params.get("max_completion_tokens") is not None


# What to give instead of an OpenAI parameter that has a near Anthropic equivalent.
_INSTEAD = {
    "reasoning_effort": "give output_config: {effort: ...} instead",
}
_OBJECTS = frozenset({"thinking", "output_config", "cache_control"})


def anthropic_param_problem(name: str, value: Any) -> str | None:
    """Why the request parameter ``name`` cannot go to Anthropic, or None when it translates."""
    if name in OPENAI_ONLY_PARAMS:
        instead = _INSTEAD.get(name, "remove it for claude models (or map the model to openai)")
        return f"'{name}' has no Anthropic equivalent; {instead}"
    if name not in ANTHROPIC_PARAMS:
        likely = suggestion(name, ANTHROPIC_PARAMS)
        if likely is not None:
            return f"{shown(name)} is not a parameter of Anthropic's Messages API; did you mean '{likely}'?"
        return f"{shown(name)} is not a parameter of Anthropic's Messages API"
    if name == "response_format" and (not isinstance(value, Mapping) or value.get("type") != "json_schema"):
        return ("Anthropic takes a response_format only of type 'json_schema' (sent as output_config.format); "
                "give a schema, or output_config: {format: {type: 'json_schema', schema: ...}}")
    if name == "n" and value not in (None, 1):
        return "Anthropic answers once per request: n must be 1 (send the prompt n times instead)"
    if name == "temperature" and isinstance(value, int | float) and value > 1:
        return f"Anthropic's temperature runs from 0 to 1, got {value}"
    if name == "metadata" and isinstance(value, Mapping) and set(value) - {"user_id"}:
        return "Anthropic's metadata holds only 'user_id'"
    if name == "tool_choice" and isinstance(value, str) and value not in _TOOL_CHOICES:
        return f"tool_choice {shown(value)} is not one of {', '.join(_TOOL_CHOICES)}"
    if name in _OBJECTS and value is not None and not isinstance(value, Mapping):
        return f"{name} must be an object"
    return None


def anthropic_params(request: ChatRequest, *, default_max_tokens: int) -> dict[str, Any]:
    """The Messages API body for ``request``; raises ``ValueError`` naming a field that does not translate."""
    params = request.params
    body: dict[str, Any] = {"model": request.model}
    system, messages = _messages(request.messages)
    cap = params.get("max_tokens")
    if cap is None:
        cap = params.get("max_completion_tokens")
    if cap is None:
        cap = anthropic_max_tokens(request.model, params, default=default_max_tokens,
                                   thinking_default=max(default_max_tokens, DEFAULT_THINKING_MAX_TOKENS))
    body["max_tokens"] = cap
    body["messages"] = messages
    if system is not None:
        body["system"] = system
    for name, value in params.items():
        problem = anthropic_param_problem(name, value)
        if problem is not None:
            raise ValueError(f"params.{name}: {problem}")
        if value is None or name in ("max_tokens", "max_completion_tokens", "n", "parallel_tool_calls",
                                     "response_format"):
            continue
        if name == "stop":
            body["stop_sequences"] = [value] if isinstance(value, str) else list(value)
        elif name == "user":
            body.setdefault("metadata", {})["user_id"] = value
        elif name == "metadata":
            body.setdefault("metadata", {}).update(value)
        elif name == "tools":
            body["tools"] = [_tool(tool) for tool in value]
        elif name == "tool_choice":
            body["tool_choice"] = _tool_choice(value)
        elif name == "system" and "system" in body:
            body["system"] = _system_blocks(body["system"]) + _system_blocks(value)
        else:
            body[name] = value
    schema = answer_schema(params)
    if schema is not None:
        _structured(body, schema, model=request.model)
    if params.get("parallel_tool_calls") is False:
        choice = body.setdefault("tool_choice", {"type": "auto"})
        if choice.get("type") != "none":
            choice["disable_parallel_tool_use"] = True
    return body


def _structured(body: dict[str, Any], schema: dict[str, Any], *, model: str) -> None:
    """The answer's schema as Claude takes it: ``output_config.format``, or a tool it must call on a model
    without structured outputs (``_model_rules.anthropic_refusal`` refuses that where forced tools are)."""
    if anthropic_output_format(model):
        body["output_config"] = {**(body.get("output_config") or {}), "format": {"type": "json_schema", "schema": schema}}
        return
    body["tools"] = [*body.get("tools", ()), {"name": STRUCTURED_TOOL, "input_schema": schema,
                                             "description": "Give the answer as this tool's input."}]
    body["tool_choice"] = {"type": "tool", "name": STRUCTURED_TOOL}


def _messages(messages: list[dict[str, Any]]) -> tuple[str | list[dict[str, Any]] | None, list[dict[str, Any]]]:
    """The system prompt (a string, or text blocks when any part is not a plain string) and the other turns."""
    system: list[Any] = []
    turns: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        content = message.get("content")
        if role in ("system", "developer"):
            system.append(content)
        elif role == "tool":
            block = {"type": "tool_result", "tool_use_id": message.get("tool_call_id"), "content": _content(content)}
            # Several tool results answer one assistant turn: they share one user turn.
            if turns and turns[-1]["role"] == "user" and _is_tool_results(turns[-1]["content"]):
                turns[-1]["content"].append(block)
            else:
                turns.append({"role": "user", "content": [block]})
        elif role == "assistant" and message.get("tool_calls"):
            blocks = _blocks(content) if content else []
            blocks += [_tool_use(call) for call in message["tool_calls"]]
            turns.append({"role": "assistant", "content": blocks})
        else:
            turns.append({"role": role, "content": _content(content)})
    if not system:
        return None, turns
    if all(isinstance(part, str) for part in system):
        return "\n\n".join(system), turns
    system_blocks: list[dict[str, Any]] = []
    for part in system:
        system_blocks += _system_blocks(part)
    return system_blocks, turns


def _system_blocks(part: Any) -> list[dict[str, Any]]:
    if isinstance(part, str):
        return [{"type": "text", "text": part}]
    return _blocks(part)


def _is_tool_results(content: Any) -> bool:
    return isinstance(content, list) and all(block.get("type") == "tool_result" for block in content)


def _content(content: Any) -> Any:
    return content if isinstance(content, str) or content is None else _blocks(content)


def _blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [_block(part) for part in content]


def _block(part: dict[str, Any]) -> dict[str, Any]:
    kind = part.get("type")
    if kind == "image_url":
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, Mapping) else image
        block = {"type": "image", "source": _image_source(str(url))}
        if "cache_control" in part:
            block["cache_control"] = part["cache_control"]
        return block
    if kind == "refusal":  # a refusal an earlier answer made, given back as that turn's text
        return {"type": "text", "text": part.get("refusal")}
    if kind in _NO_EQUIVALENT:
        raise ValueError(_NO_EQUIVALENT[kind])
    # text parts are the same in both APIs (cache_control kept); Anthropic's own blocks pass through.
    return part


def _image_source(url: str) -> dict[str, str]:
    if url.startswith(_IMAGE_DATA_PREFIX):
        header, _, data = url.partition(",")
        media_type = header[len(_IMAGE_DATA_PREFIX):].split(";", 1)[0]
        return {"type": "base64", "media_type": media_type, "data": data}
    return {"type": "url", "url": url}


def _tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    if tool.get("type") == "custom" and "custom" in tool:
        raise ValueError("OpenAI's custom (free-form) tools have no Anthropic equivalent: give a function tool")
    if tool.get("type") != "function":
        return dict(tool)  # already Anthropic's (input_schema, or a server tool)
    function = tool.get("function") or {}
    converted: dict[str, Any] = {"name": function.get("name"),
                                 "input_schema": function.get("parameters") or {"type": "object", "properties": {}}}
    if function.get("description"):
        converted["description"] = function["description"]
    if function.get("strict") is not None:  # both APIs: the input matches the schema
        converted["strict"] = function["strict"]
    return converted


def _tool_choice(choice: Any) -> dict[str, Any]:
    if isinstance(choice, str):
        return dict(_TOOL_CHOICES[choice])
    if choice.get("type") == "function":
        return {"type": "tool", "name": (choice.get("function") or {}).get("name")}
    return dict(choice)


def _tool_use(call: Mapping[str, Any]) -> dict[str, Any]:
    if call.get("type") == "custom":
        raise ValueError(f"tool call {shown(call.get('id'))} is OpenAI's custom kind, which has no Anthropic equivalent")
    function = call.get("function") or {}
    arguments = function.get("arguments") or "{}"
    try:
        tool_input = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        raise ValueError(f"tool call {shown(call.get('id'))}: arguments are not JSON: {shown(arguments)}") from None
    return {"type": "tool_use", "id": call.get("id"), "name": function.get("name"), "input": tool_input}
