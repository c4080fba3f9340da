"""What a simulated Anthropic request must satisfy: the ``x-api-key`` and ``anthropic-version`` headers, and a
Messages body. A problem is said in Anthropic's words (``field.path: what is wrong``) for a 400 or 401.

What each model refuses, and the message shapes past the basic ones here, are the core's rules
(``anthropic_refusal``, ``anthropic_messages_refusal``, under the request's ``anthropic-version``): the input
check refuses the same with the file."""

from __future__ import annotations

import hmac
from typing import Any

from aiohttp import web

from llm_dispatch.core import (
    ANTHROPIC_MAX_BREAKPOINTS,
    DEFAULT_ANTHROPIC_VERSION,
    anthropic_messages_refusal,
    anthropic_refusal,
)

from ._anthropic_http import anthropic_error

from ._state import SimState

__all__ = ["api_version", "check_headers", "messages_body_problem", "model_refusal", "required_list"]

_ROLES = frozenset({"user", "assistant"})


def check_headers(request: web.Request, state: SimState) -> web.Response | None:
    """The 401 for a missing or wrong ``x-api-key`` (when the config sets ``api_key``), else the 400 for a
    missing ``anthropic-version``, else None."""
    expected = state.config.api_key
    if expected is not None:
        given = request.headers.get("x-api-key", "")
        if not given:
            return anthropic_error(401, "x-api-key header is required")
        if not hmac.compare_digest(given.encode(), expected.encode()):
            return anthropic_error(401, "invalid x-api-key")
    if not request.headers.get("anthropic-version"):
        return anthropic_error(400, "anthropic-version: header is required")
    return None


def api_version(request: web.Request) -> str:
    """The ``anthropic-version`` a request was sent under (``check_headers`` has refused one without)."""
    return request.headers.get("anthropic-version") or DEFAULT_ANTHROPIC_VERSION


def messages_body_problem(body: Any, *, where: str = "") -> str | None:
    """What is wrong with the shape of a Messages body, prefixed with ``where`` (``requests.3.params.`` in a batch),
    or None. What its model refuses is ``model_refusal``'s (a batch answers it per request, not at the create)."""
    problem = _problem(body)
    return None if problem is None else f"{where}{problem}"


def model_refusal(body: dict[str, Any], *, version: str) -> str | None:
    """What the Messages API refuses in a well-shaped ``body`` for its model under ``version``, or None."""
    refusal = anthropic_refusal(body, version=version) or anthropic_messages_refusal(body, version=version)
    return None if refusal is None else refusal.api_message


def required_list(body: dict[str, Any], name: str) -> list[Any] | str:
    """``body[name]`` if it is a non-empty list, else what is wrong with it."""
    value = body.get(name)
    if value is None:
        return f"{name}: Field required"
    if not isinstance(value, list):
        return f"{name}: Input should be a valid list"
    if not value:
        return f"{name}: List should have at least 1 item after validation, not 0"
    return value


def _problem(body: Any) -> str | None:
    if not isinstance(body, dict):
        return "Input should be a valid dictionary"
    model = body.get("model")
    if model is None:
        return "model: Field required"
    if not isinstance(model, str) or not model:
        return "model: Input should be a non-empty string"
    max_tokens = body.get("max_tokens")
    if max_tokens is None:
        return "max_tokens: Field required"
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
        return "max_tokens: Input should be a valid integer"
    if max_tokens < 1:
        return "max_tokens: Input should be greater than or equal to 1"
    messages = required_list(body, "messages")
    if isinstance(messages, str):
        return messages
    for index, message in enumerate(messages):
        problem = _message_problem(message, f"messages.{index}")
        if problem is not None:
            return problem
    system = body.get("system")
    if system is not None and not isinstance(system, str):
        if not isinstance(system, list):
            return "system: Input should be a valid string or a list of text blocks"
        for index, block in enumerate(system):
            if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
                return f"system.{index}: Input should be a text block ({{\"type\": \"text\", \"text\": ...}})"
    if body.get("stream"):
        return "stream: the llm-dispatch simulator does not stream; send the request with stream=false"
    marks = _cache_marks(body)
    if marks > ANTHROPIC_MAX_BREAKPOINTS:
        return f"A maximum of {ANTHROPIC_MAX_BREAKPOINTS} blocks with cache_control may be provided. Found {marks}."
    return None


def _cache_marks(body: dict[str, Any]) -> int:
    """The ``cache_control`` breakpoints a body sets: on tools, system blocks and message blocks."""
    blocks: list[Any] = list(body.get("tools") or ())
    system = body.get("system")
    blocks += system if isinstance(system, list) else []
    for message in body.get("messages") or ():
        content = message.get("content") if isinstance(message, dict) else None
        blocks += content if isinstance(content, list) else []
    return sum(1 for block in blocks if isinstance(block, dict) and "cache_control" in block)


def _message_problem(message: Any, where: str) -> str | None:
    if not isinstance(message, dict):
        return f"{where}: Input should be a valid dictionary"
    role = message.get("role")
    if role == "system":
        return ('messages: Unexpected role "system". The Messages API accepts a top-level `system` parameter, '
                'not "system" as an input message role.')
    if role not in _ROLES:
        return f"{where}.role: Input should be 'user' or 'assistant'"
    content = message.get("content")
    if content is None:
        return f"{where}.content: Field required"
    if isinstance(content, str):
        return None
    if not isinstance(content, list):
        return f"{where}.content: Input should be a valid string or a list of content blocks"
    for index, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            return f"{where}.content.{index}: Input should be a content block with a 'type'"
    return None
