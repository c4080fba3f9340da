"""OpenAI-shaped HTTP answers of the simulator: JSON bodies, error bodies and rate-limit headers."""

from __future__ import annotations

import json
import math
from typing import Any

from aiohttp import web

__all__ = [
    "client_error_response",
    "completion_body",
    "dropped_response",
    "error_response",
    "format_reset",
    "json_dumps",
    "json_response",
    "read_json_object",
    "rate_limited_response",
    "retry_after_headers",
    "server_error_response",
]

# Compact, and UTF-8 rather than \u escapes, as OpenAI writes its JSON.
json_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode

_SERVER_ERRORS = {
    500: "The server had an error while processing your request. Sorry about that!",
    502: "Bad gateway.",
    503: "The server is overloaded or not ready yet.",
    529: "The server is overloaded; please try again later.",
}
# Statuses a fault can force that OpenAI answers rarely and without a dedicated shape of their own.
_CLIENT_ERRORS = {
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
    service_tier: str = "default",
) -> bytes:
    """A chat.completion body; ``choices`` are (content, finish_reason) pairs.

    Written from a template rather than by encoding a nested dict: it is on every answer's path.
    """
    choice_list = ",".join(
        f'{{"index":{index},"message":{{"role":"assistant","content":{json_dumps(content)},"refusal":null,'
        f'"annotations":[]}},"logprobs":null,"finish_reason":"{finish_reason}"}}'
        for index, (content, finish_reason) in enumerate(choices)
    )
    return (
        f'{{"id":"{response_id}","object":"chat.completion","created":{created},"model":{json_dumps(model)},'
        f'"choices":[{choice_list}],"usage":{{"prompt_tokens":{prompt_tokens},'
        f'"completion_tokens":{completion_tokens},"total_tokens":{prompt_tokens + completion_tokens},'
        f'"prompt_tokens_details":{{"cached_tokens":{cached_tokens},"audio_tokens":0}},'
        f'"completion_tokens_details":{{"reasoning_tokens":0,"audio_tokens":0,'
        f'"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}}},'
        f'"service_tier":"{service_tier}","system_fingerprint":"{system_fingerprint}"}}'
    ).encode()


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


def rate_limited_response(
    *, message: str, limit_type: str, retry_after: float, headers: dict[str, str] | None = None
) -> web.Response:
    all_headers = retry_after_headers(retry_after)
    if headers:
        all_headers.update(headers)
    return error_response(
        status=429, message=message, type=limit_type, code="rate_limit_exceeded", headers=all_headers
    )
