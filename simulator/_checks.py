"""What a simulated chat request must satisfy, and the 400/401/404 bodies OpenAI answers when it does not.

Message shapes and what each model refuses are the core's rules (``openai_messages_refusal``, ``openai_refusal``:
the input check refuses the same with the file), answered here in OpenAI's own words, so a body the real API
would refuse is refused here too.
"""

from __future__ import annotations

import hmac
from typing import Any

from aiohttp import web

from llm_dispatch.core import openai_messages_refusal, openai_refusal, response_format_problem

from ._http import error_response
from ._state import SimState

__all__ = [
    "check_auth",
    "invalid_request",
    "missing_model_or",
    "model_not_found",
    "unknown_marker",
    "validate_chat_body",
]

_MAX_CHOICES = 128


def check_auth(request: web.Request, state: SimState) -> web.Response | None:
    """A 401 unless the request carries the configured key (Bearer, or Azure's ``api-key``)."""
    expected = state.config.api_key
    if expected is None:
        return None
    header = request.headers.get("Authorization")
    if header is not None:
        given = header[7:].strip() if header[:7].lower() == "bearer " else ""
    else:
        given = request.headers.get("api-key", "")
    if given and hmac.compare_digest(given.encode(), expected.encode()):
        return None
    if not given:
        message = (
            "You didn't provide an API key. You need to provide your API key in an Authorization "
            "header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
        )
        return error_response(status=401, message=message)
    shown = f"{given[:3]}...{given[-4:]}" if len(given) > 8 else "***"
    return error_response(status=401, message=f"Incorrect API key provided: {shown}.", code="invalid_api_key")


def model_not_found(model: str) -> web.Response:
    return error_response(
        status=404,
        message=f"The model `{model}` does not exist or you do not have access to it.",
        code="model_not_found",
    )


def invalid_request(message: str, *, param: str | None, code: str | None) -> web.Response:
    return error_response(status=400, message=message, param=param, code=code)


def unknown_marker(message: str) -> web.Response:
    return invalid_request(message, param="messages", code="invalid_value")


def _type_name(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number"
    )


def validate_chat_body(body: Any) -> web.Response | None:
    """The 400 OpenAI would answer for this body, or None if it is a usable chat request."""
    problem = _problem(body)
    if problem is None:
        return None
    message, param, code = problem
    return invalid_request(message, param=param, code=code)


def missing_model_or(body: dict[str, Any], field: str) -> tuple[str, str, str] | None:
    """(message, param, code) for an OpenAI body without its model or its other required ``field``, in OpenAI's
    words, or None when it has both."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        return "you must provide a model parameter", "model", "missing_required_parameter"
    if body.get(field) is None:
        return f"Missing required parameter: '{field}'.", field, "missing_required_parameter"
    return None


def _problem(body: Any) -> tuple[str, str | None, str | None] | None:
    """(message, param, code) of the first thing wrong with a chat body, in OpenAI's words."""
    if not isinstance(body, dict):
        return f"Invalid type for body: expected an object, but got {_type_name(body)} instead.", None, "invalid_type"
    missing = missing_model_or(body, "messages")
    if missing is not None:
        return missing
    model, messages = body["model"], body["messages"]
    shape = openai_messages_refusal(messages, parts="openai")
    if shape is not None:
        return shape.api_message, shape.api_param, shape.api_code
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            got = _type_name(value)
            return f"Invalid type for '{name}': expected an integer, but got {got} instead.", name, "invalid_type"
        if value < 1:
            return f"Invalid '{name}': expected a value >= 1, but got {value} instead.", name, "integer_below_min_value"
    n = body.get("n")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= _MAX_CHOICES):
        message = f"Invalid 'n': expected an integer from 1 to {_MAX_CHOICES}, but got {n!r} instead."
        return message, "n", "invalid_value"
    if body.get("stream"):
        message = "The llm-dispatch simulator does not stream; send the request with stream=false."
        return message, "stream", "unsupported_value"
    refusal = openai_refusal(model, body)
    if refusal is not None:
        return refusal.api_message, refusal.api_param, refusal.api_code
    schema_problem = response_format_problem(body.get("response_format"))
    if schema_problem is not None:
        return (f"Invalid schema for response_format: {schema_problem}.", "response_format",
                "invalid_json_schema")
    return None
