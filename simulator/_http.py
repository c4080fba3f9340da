"""OpenAI-shaped HTTP answers of the simulator: JSON bodies, error bodies and rate-limit headers."""

from __future__ import annotations

import json
import math
from typing import Any

from aiohttp import web

__all__ = [
    "SIM_PREFIX",
    "served_path",
    "client_error_response",
    "completion_body",
    "cut_response",
    "dropped_response",
    "error_response",
    "format_reset",
    "insufficient_quota_response",
    "json_dumps",
    "json_response",
    "message_fields",
    "read_json_object",
    "rate_limited_response",
    "retry_after_headers",
    "server_error_response",
    "unusable_body",
]

# Compact, and UTF-8 rather than \u escapes, as OpenAI writes its JSON.
json_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode

_SERVER_ERRORS = {
    500: "The server had an error while processing your request. Sorry about that!",
    502: "Bad gateway.",
    503: "The server is overloaded or not ready yet.",
    504: "Gateway timeout.",
    529: "The server is overloaded; please try again later.",
}
# Statuses a fault can force that OpenAI answers rarely and without a dedicated shape of their own.
_CLIENT_ERRORS = {
    402: "Payment required (simulator fault 402).",
    403: "You are not allowed to use this model or endpoint (simulator fault 403).",
    413: "The request is larger than the simulator accepts (simulator fault 413).",
}


async def read_json_object(request: web.Request) -> dict[str, Any] | None:
    """The request's body if it is a JSON object, else None (the caller words the 400)."""
    try:
        body = json.loads(await request.read())
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def json_response(payload: Any, *, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        body=json_dumps(payload).encode(), status=status, headers=headers, content_type="application/json"
    )


def message_fields(
    content: str | None, *, refusal: str | None = None, tool_calls: list[dict[str, Any]] | None = None
) -> str:
    """An assistant message's fields after its role, as OpenAI writes them: content (null for a refusal or a
    tool call), refusal, annotations and, when there are any, tool_calls."""
    fields = f'"content":{json_dumps(content)},"refusal":{json_dumps(refusal)},"annotations":[]'
    return fields if tool_calls is None else f'{fields},"tool_calls":{json_dumps(tool_calls)}'


def _usage(
    *, prompt_tokens: int, completion_tokens: int, cached_tokens: int, cache_write_tokens: int | None,
    reasoning_tokens: int,
) -> str:
    written = "" if cache_write_tokens is None else f'"cache_write_tokens":{cache_write_tokens},'
    return (
        f'{{"prompt_tokens":{prompt_tokens},'
        f'"completion_tokens":{completion_tokens},"total_tokens":{prompt_tokens + completion_tokens},'
        f'"prompt_tokens_details":{{{written}"cached_tokens":{cached_tokens},"audio_tokens":0}},'
        f'"completion_tokens_details":{{"reasoning_tokens":{reasoning_tokens},"audio_tokens":0,'
        f'"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}}}'
    )


def completion_body(
    *,
    response_id: str,
    created: int,
    model: str,
    choices: list[tuple[str, str]],
    prompt_tokens: int,
    completion_tokens: int,
    cached_tokens: int,
    system_fingerprint: str,
    cache_write_tokens: int | None = None,
    reasoning_tokens: int = 0,
    service_tier: str = "default",
) -> bytes:
    """A chat.completion body; ``choices`` are (message fields, finish_reason) pairs, the fields as
    ``message_fields`` writes them. ``cache_write_tokens`` is left out when None (a model that reports none).

    Written from a template rather than by encoding a nested dict: it is on every answer's path.
    """
    choice_list = ",".join(
        f'{{"index":{index},"message":{{"role":"assistant",{fields}}},"logprobs":null,'
        f'"finish_reason":"{finish_reason}"}}'
        for index, (fields, finish_reason) in enumerate(choices)
    )
    usage = _usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, cached_tokens=cached_tokens,
                   cache_write_tokens=cache_write_tokens, reasoning_tokens=reasoning_tokens)
    return (
        f'{{"id":"{response_id}","object":"chat.completion","created":{created},"model":{json_dumps(model)},'
        f'"choices":[{choice_list}],"usage":{usage},'
        f'"service_tier":"{service_tier}","system_fingerprint":"{system_fingerprint}"}}'
    ).encode()


def unusable_body(
    *, kind: str, response_id: str, model: str, prompt_tokens: int, completion_tokens: int, cached_tokens: int,
    cache_write_tokens: int | None, reasoning_tokens: int,
) -> bytes:
    """A 200 body with usage and no answer, as misbehaving providers send: ``empty_choices`` (``"choices": []``)
    or ``error200`` (an error object where the completion should be)."""
    usage = json.loads(_usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                              cached_tokens=cached_tokens, cache_write_tokens=cache_write_tokens,
                              reasoning_tokens=reasoning_tokens))
    if kind == "empty_choices":
        body: dict[str, Any] = {"id": response_id, "object": "chat.completion", "created": 0, "model": model,
                                "choices": [], "usage": usage}
    else:
        body = {"error": {"message": "The server had an error while processing your request "
                                     "(simulator marker error200).", "type": "server_error", "param": None,
                          "code": None}, "usage": usage}
    return json_dumps(body).encode()


def error_response(
    *,
    status: int,
    message: str,
    type: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    body = {"error": {"message": message, "type": type, "param": param, "code": code}}
    return json_response(body, status=status, headers=headers)


def server_error_response(status: int) -> web.Response:
    return error_response(status=status, message=_SERVER_ERRORS[status], type="server_error")


def client_error_response(status: int) -> web.Response:
    """A forced 403 or 413 in OpenAI's error shape."""
    return error_response(status=status, message=_CLIENT_ERRORS[status])


async def cut_response(request: web.Request, body: bytes, *, headers: dict[str, str] | None = None) -> web.StreamResponse:
    """A 200 whose headers promise ``body`` whole (its Content-Length) and whose connection closes half way
    through it: the client has the status line, and half an answer."""
    response = web.StreamResponse(status=200, headers=headers)
    response.content_type = "application/json"
    response.content_length = len(body)
    await response.prepare(request)
    await response.write(body[: len(body) // 2])
    transport = request.transport
    if transport is not None:
        transport.close()
    return response


def dropped_response(request: web.Request) -> web.Response:
    """Close the connection without answering: the peer sees it close before a single response byte."""
    transport = request.transport
    if transport is not None:
        transport.close()
    # aiohttp's write to the closed transport fails with a ConnectionError, which it treats as a
    # client that went away.
    return web.Response(status=204)


def format_reset(seconds: float) -> str:
    """A duration the way OpenAI writes ``x-ratelimit-reset-*``: ``"20ms"``, ``"1.5s"``, ``"1m0s"``."""
    if seconds < 1.0:
        return f"{max(0, math.ceil(seconds * 1000))}ms"
    if seconds < 60.0:
        return f"{seconds:.3g}s"
    minutes, rest = divmod(seconds, 60.0)
    return f"{int(minutes)}m{rest:.3g}s"


def retry_after_headers(seconds: float) -> dict[str, str]:
    # retry-after must be whole seconds per RFC 9110; retry-after-ms carries the precise wait.
    return {
        "retry-after": str(max(0, math.ceil(seconds))),
        "retry-after-ms": str(max(0, math.ceil(seconds * 1000))),
    }


def insufficient_quota_response() -> web.Response:
    """OpenAI's 429 for an account out of credit: no Retry-After, since waiting does not help."""
    return error_response(
        status=429, type="insufficient_quota", code="insufficient_quota",
        message="You exceeded your current quota, please check your plan and billing details. For more "
                "information on this error, read the docs: https://platform.openai.com/docs/guides/error-codes/api-errors.")


def rate_limited_response(
    *, message: str, limit_type: str, retry_after: float, headers: dict[str, str] | None = None
) -> web.Response:
    all_headers = retry_after_headers(retry_after)
    if headers:
        all_headers.update(headers)
    return error_response(
        status=429, message=message, type=limit_type, code="rate_limit_exceeded", headers=all_headers
    )


# The path an app is served under: "" for the built-in providers', ``/p/NAME`` for a named provider's.
SIM_PREFIX = web.AppKey("sim_prefix", str)


def served_path(request: web.Request) -> str:
    """``request``'s path within the app answering it (a named provider's without its ``/p/NAME``)."""
    return request.path.removeprefix(request.app.get(SIM_PREFIX, ""))
