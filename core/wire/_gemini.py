"""An OpenAI-style ``ChatRequest`` as the Gemini Developer API's ``generateContent`` body, faithfully or not at all.

The wire is Google's own SDK's, to the letter (google-genai ``models.py``: ``_GenerateContentParameters_to_mldev``,
``_GenerateContentConfig_to_mldev``, ``_Content_to_mldev``, ``_Part_to_mldev``, ``_Tool_to_mldev``,
``_ToolConfig_to_mldev``): the model is in the path (``/v1beta/models/{model}:generateContent``), never in the
body; every field is camelCase; ``systemInstruction``, ``tools`` and ``toolConfig`` sit beside ``contents``, the
sampling settings in ``generationConfig``.

Rules: system (and developer) turns become ``systemInstruction`` (a user-role Content, as the SDK's ``t_content``
makes of a string), in order; ``assistant`` is the ``model`` role; string content is one text part, ``image_url``
parts with a ``data:`` URL ``inlineData``; an assistant's ``tool_calls`` become ``functionCall`` parts, and each
``tool`` message a ``functionResponse`` part (its name found from the call it answers) in a user turn; a call's
thought signature (kept on the answer's tool call as Gemini's OpenAI compatibility does,
``extra_content.google.thought_signature``) goes back as its part's ``thoughtSignature``;
``max_tokens`` / ``max_completion_tokens`` -> ``maxOutputTokens``, ``temperature``, ``top_p`` -> ``topP``,
``top_k`` -> ``topK``, ``stop`` -> ``stopSequences``, ``presence_penalty`` / ``frequency_penalty`` / ``seed``;
OpenAI function tools -> one tool of ``functionDeclarations`` (their JSON Schema as ``parametersJsonSchema``),
``tool_choice`` -> ``toolConfig.functionCallingConfig``; ``reasoning_effort`` -> ``thinkingConfig``
(``_model_rules.gemini_thinking``); a ``json_schema`` ``response_format`` -> ``responseMimeType``
``application/json`` with ``responseJsonSchema`` (the JSON Schema field; ``responseSchema`` takes only Google's
OpenAPI subset). Gemini's own ``generationConfig``, ``safetySettings``, ``cachedContent`` and ``thinkingConfig``
pass through. What a model refuses is ``_model_rules``' to say (``gemini_refusal``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ..rules._gemini_rules import gemini_25_family, gemini_thinking
from .._params import shown, suggestion
from ._structured import answer_schema
from .._types import ChatRequest

__all__ = ["GEMINI_CHAT_PATH", "GEMINI_PARAMS", "SKIP_SIGNATURE", "gemini_body", "gemini_param_problem",
           "thought_signature"]

# The SDK's path for ``generate_content`` (``models.py``: ``'{model}:generateContent'`` under ``t_model``'s
# ``models/``), after the API version its client puts first (``_api_client.py``: ``v1beta``).
GEMINI_API_VERSION = "v1beta"
GEMINI_CHAT_PATH = f"/{GEMINI_API_VERSION}/models/{{model}}:generateContent"

# OpenAI's names with a Gemini equivalent: each becomes a generationConfig field (or the contents, tools, tool
# config, thinking config).
_CONFIG_NAMES = {
    "temperature": "temperature", "top_p": "topP", "top_k": "topK", "presence_penalty": "presencePenalty",
    "frequency_penalty": "frequencyPenalty", "seed": "seed",
}
_TRANSLATED = frozenset({"max_tokens", "max_completion_tokens", "stop", "tools", "tool_choice", "n",
                         "response_format", "reasoning_effort", "parallel_tool_calls"})
# Gemini's own, as its REST reference names them: sent as given.
_OWN = frozenset({"generationConfig", "safetySettings", "cachedContent", "thinkingConfig"})
GEMINI_PARAMS = frozenset(_CONFIG_NAMES) | _TRANSLATED | _OWN
# OpenAI parameters with no Gemini equivalent, named so the refusal can say so.
_OPENAI_ONLY = frozenset({
    "logprobs", "top_logprobs", "logit_bias", "store", "modalities", "audio", "prediction", "web_search_options",
    "functions", "function_call", "stream", "stream_options", "prompt_cache_key", "safety_identifier",
    "verbosity", "user", "metadata",
})
# Gemini has these, llm-dispatch does not send them yet.
_NOT_YET = {"service_tier": "Gemini's service tiers (serviceTier flex, priority) are not sent by llm-dispatch yet: "
                            "remove service_tier for gemini models"}
_TOOL_MODES = {"auto": "AUTO", "required": "ANY", "none": "NONE"}
# What a function call with no thought signature of its own carries on Gemini 3 and later: "set thoughtSignature to
# skip_thought_signature_validator" for a call the model did not make (ai.google.dev/gemini-api/docs/thought-signatures).
SKIP_SIGNATURE = "skip_thought_signature_validator"
_IMAGE_DATA_PREFIX = "data:"


def gemini_param_problem(name: str, value: Any) -> str | None:
    """Why the request parameter ``name`` cannot go to Gemini, or None when it translates."""
    if name in _NOT_YET:
        return _NOT_YET[name]
    if name in _OPENAI_ONLY:
        return f"'{name}' has no Gemini equivalent; remove it for gemini models (or map the model to openai)"
    if name not in GEMINI_PARAMS:
        likely = suggestion(name, GEMINI_PARAMS)
        tail = f"; did you mean '{likely}'?" if likely is not None else ""
        return f"{shown(name)} is not a parameter llm-dispatch sends to Gemini's generateContent{tail}"
    if name == "n" and value not in (None, 1):
        return "llm-dispatch keeps one answer per request: n must be 1 (send the prompt n times instead)"
    if name == "parallel_tool_calls" and value is False:
        return "Gemini has no switch for parallel function calls: remove parallel_tool_calls"
    if name == "response_format" and isinstance(value, Mapping) and value.get("type") not in (
            "json_schema", "json_object", "text"):
        return "response_format must be of type json_schema, json_object or text"
    if name == "tool_choice" and isinstance(value, str) and value not in _TOOL_MODES:
        return f"tool_choice {shown(value)} is not one of {', '.join(_TOOL_MODES)}"
    if name in _OWN and value is not None and not isinstance(value, Mapping) and name != "cachedContent":
        return f"{name} must be an object"
    return None


def gemini_body(request: ChatRequest) -> dict[str, Any]:
    """The generateContent body for ``request``; raises ``ValueError`` naming what does not translate."""
    params = request.params
    system, contents = _contents(request.messages, model=request.model)
    body: dict[str, Any] = {"contents": contents}
    if system:
        body["systemInstruction"] = {"parts": system, "role": "user"}
    config: dict[str, Any] = {}
    for name, value in params.items():
        problem = gemini_param_problem(name, value)
        if problem is not None:
            raise ValueError(f"params.{name}: {problem}")
        if value is None:
            continue
        if name in _CONFIG_NAMES:
            config[_CONFIG_NAMES[name]] = value
        elif name in ("max_tokens", "max_completion_tokens"):
            config["maxOutputTokens"] = value
        elif name == "stop":
            config["stopSequences"] = [value] if isinstance(value, str) else list(value)
        elif name == "tools":
            body["tools"] = _tools(value)
        elif name == "tool_choice":
            body["toolConfig"] = {"functionCallingConfig": _function_calling(value)}
        elif name == "response_format" and value.get("type") == "json_object":
            config["responseMimeType"] = "application/json"
        elif name == "reasoning_effort":
            config["thinkingConfig"] = gemini_thinking(request.model, value)
        elif name == "thinkingConfig":
            config["thinkingConfig"] = {**config.get("thinkingConfig", {}), **value}
        elif name == "generationConfig":
            config.update(value)
        elif name in ("safetySettings", "cachedContent"):
            body[name] = value
    schema = answer_schema(params)
    if schema is not None:
        config["responseMimeType"] = "application/json"
        config["responseJsonSchema"] = schema
    if config:
        body["generationConfig"] = config
    return body


def _contents(messages: list[dict[str, Any]], *, model: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the system instruction's parts, the other turns as Contents)."""
    signs = gemini_25_family(model) is None
    system: list[dict[str, Any]] = []
    contents: list[dict[str, Any]] = []
    # A tool message names only the call it answers: its function's name comes from that call.
    names: dict[str, str] = {}
    for message in messages:
        role = message.get("role")
        content = message.get("content")
        if role in ("system", "developer"):
            system += _parts(content)
        elif role == "tool":
            call_id = message.get("tool_call_id")
            name = message.get("name") or names.get(str(call_id))
            if not name:
                raise ValueError(f"tool message {shown(call_id)} answers no earlier tool call: Gemini needs the "
                                 "function's name")
            part = {"functionResponse": {"name": name, "response": _function_response(content)}}
            # Several results answer one model turn: they share one user turn.
            if contents and contents[-1]["role"] == "user" and all(
                    "functionResponse" in p for p in contents[-1]["parts"]):
                contents[-1]["parts"].append(part)
            else:
                contents.append({"role": "user", "parts": [part]})
        elif role == "assistant":
            parts = _parts(content) if content else []
            for index, call in enumerate(message.get("tool_calls") or ()):
                function = call.get("function") or {}
                if call.get("type") == "custom":
                    raise ValueError(f"tool call {shown(call.get('id'))} is OpenAI's custom kind, which has no "
                                     "Gemini equivalent")
                names[str(call.get("id"))] = str(function.get("name"))
                call_part: dict[str, Any] = {"functionCall": {"name": function.get("name"),
                                                              "args": _arguments(call)}}
                signature = thought_signature(call)
                if signature is not None:
                    call_part["thoughtSignature"] = signature
                elif signs and index == 0:
                    # Gemini 3 and later refuse a function call of the current turn without its signature; one that
                    # never had one (written by hand, or another model's) carries the validator's documented skip.
                    call_part["thoughtSignature"] = SKIP_SIGNATURE
                parts.append(call_part)
            contents.append({"role": "model", "parts": parts})
        else:
            contents.append({"role": "user", "parts": _parts(content)})
    return system, contents


def thought_signature(call: Mapping[str, Any]) -> str | None:
    """The thought signature an answer's tool call carries, where Gemini's OpenAI compatibility puts it
    (``extra_content.google.thought_signature``; ``_gemini_answers`` writes it there)."""
    extra = call.get("extra_content")
    google = extra.get("google") if isinstance(extra, Mapping) else None
    signature = google.get("thought_signature") if isinstance(google, Mapping) else None
    return signature if isinstance(signature, str) and signature else None


def _parts(content: Any) -> list[dict[str, Any]]:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"text": content}]
    return [_part(part) for part in content]


def _part(part: Mapping[str, Any]) -> dict[str, Any]:
    kind = part.get("type")
    if kind == "text":
        return {"text": part.get("text")}
    if kind == "refusal":  # a refusal an earlier answer made, given back as that turn's text
        return {"text": part.get("refusal")}
    if kind == "image_url":
        image = part.get("image_url")
        url = str(image.get("url") if isinstance(image, Mapping) else image)
        if not url.startswith(_IMAGE_DATA_PREFIX):
            raise ValueError("Gemini takes an image inline: give it as a data: URL (a web address is not fetched)")
        header, _, data = url.partition(",")
        return {"inlineData": {"mimeType": header[len(_IMAGE_DATA_PREFIX):].split(";", 1)[0], "data": data}}
    if kind is None:
        return dict(part)  # Gemini's own part (inlineData, fileData, ...): sent as given
    raise ValueError(f"a {shown(kind)} content part has no Gemini equivalent")


def _arguments(call: Mapping[str, Any]) -> Any:
    arguments = (call.get("function") or {}).get("arguments") or "{}"
    try:
        return json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        raise ValueError(f"tool call {shown(call.get('id'))}: arguments are not JSON: {shown(arguments)}") from None


def _function_response(content: Any) -> dict[str, Any]:
    """A tool result as the object Gemini's ``FunctionResponse.response`` must be: a JSON object as it is, anything
    else under ``output`` (the key the SDK's docs name for a function's output)."""
    if isinstance(content, list):
        content = "".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))
    if isinstance(content, str):
        try:
            parsed = json.loads(content)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            return parsed
    return {"output": content}


def _tools(tools: list[Any]) -> list[dict[str, Any]]:
    """OpenAI function tools as one tool of ``functionDeclarations``; Gemini's own tools (``googleSearch``,
    ``codeExecution``, ...) as given."""
    declarations: list[dict[str, Any]] = []
    own: list[dict[str, Any]] = []
    for tool in tools:
        if not isinstance(tool, Mapping):
            raise ValueError("each tool must be an object")
        if tool.get("type") == "custom":
            raise ValueError("OpenAI's custom (free-form) tools have no Gemini equivalent: give a function tool")
        if tool.get("type") != "function":
            own.append(dict(tool))
            continue
        function = tool.get("function") or {}
        declaration: dict[str, Any] = {"name": function.get("name")}
        if function.get("description"):
            declaration["description"] = function["description"]
        if function.get("parameters"):
            declaration["parametersJsonSchema"] = function["parameters"]
        declarations.append(declaration)
    return ([{"functionDeclarations": declarations}] if declarations else []) + own


def _function_calling(choice: Any) -> dict[str, Any]:
    if isinstance(choice, str):
        return {"mode": _TOOL_MODES[choice]}
    if isinstance(choice, Mapping) and choice.get("type") == "function":
        return {"mode": "ANY", "allowedFunctionNames": [(choice.get("function") or {}).get("name")]}
    return dict(choice)  # Gemini's own functionCallingConfig
