"""The simulator's ``/v1/responses``: a Responses request answered as the chat route answers its chat twin, then
written as a response object (output items, ``status: incomplete`` when cut at ``max_output_tokens``).

The twin: ``instructions`` as a system message, ``input`` items as messages, ``max_output_tokens`` as
``max_completion_tokens``, ``reasoning.effort`` as ``reasoning_effort``, flat function tools as chat's. So every
answer kind (``[[sim:refuse]]``, tool calls, truncation, reasoning tokens, ``slow``) and every fault the chat route
has, this one has. ``background: true`` answers at once with a ``queued`` response that ``GET
/v1/responses/{id}`` shows ``in_progress`` and then finished, after the time the answer would have taken; its
``background_options.completion_window`` (``soonest``, ``2h``, ``8h``, OpenAI's background guide) is echoed and
counted (``background_window_2h``...), and refused without ``background: true`` or with another value.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from ._chat import _ChatRoutes
from ._checks import check_auth, invalid_request
from ._completions import plan_completion, render_completion
from ._serving import sample_latency
from ._state import SimState

__all__ = ["RESPONSES_PATH", "chat_twin", "register", "response_object"]

RESPONSES_PATH = "/v1/responses"
_TWIN = "_sim_responses"  # where the request's own fields wait beside its chat twin's


@dataclass
class _Background:
    """One background response: its object as polled, and the task finishing it."""

    body: dict[str, Any]
    task: asyncio.Task[None] | None = field(default=None, repr=False)


def register(app: web.Application, state: SimState) -> None:
    routes = _ResponseRoutes(state)
    app.router.add_post(RESPONSES_PATH, routes.handle)
    app.router.add_get(RESPONSES_PATH + "/{id}", routes.retrieve)


def chat_twin(body: dict[str, Any]) -> dict[str, Any] | str:
    """The chat body that asks what a Responses body asks, or what is wrong with it."""
    given = body.get("input")
    if given is None:
        return "Missing required parameter: 'input'."
    messages: list[dict[str, Any]] = []
    if isinstance(body.get("instructions"), str):
        messages.append({"role": "system", "content": body["instructions"]})
    for item in [{"role": "user", "content": given}] if isinstance(given, str) else given:
        if not isinstance(item, dict):
            return "Invalid 'input': expected a string or a list of items."
        kind = item.get("type", "message")
        if kind == "message":
            content = item.get("content")
            if isinstance(content, list):
                content = [{"type": "text", "text": part.get("text")} if part.get("type") in ("input_text", "output_text")
                           else part for part in content]
            messages.append({"role": item.get("role"), "content": content})
        elif kind == "function_call":
            messages.append({"role": "assistant", "content": None, "tool_calls": [{
                "id": item.get("call_id"), "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments")}}]})
        elif kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": item.get("output")})
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages}
    for name in ("temperature", "top_p", "service_tier", "tool_choice", "parallel_tool_calls", "metadata", "user"):
        if name in body:
            chat[name] = body[name]
    if body.get("max_output_tokens") is not None:
        chat["max_completion_tokens"] = body["max_output_tokens"]
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and reasoning.get("effort") is not None:
        chat["reasoning_effort"] = reasoning["effort"]
    if isinstance(body.get("tools"), list):
        chat["tools"] = [{"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}}
                         if isinstance(tool, dict) and tool.get("type") == "function" else tool
                         for tool in body["tools"]]
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "function" and "name" in choice:
        chat["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    return chat


def response_object(completion: dict[str, Any], *, response_id: str, background: bool = False) -> dict[str, Any]:
    """The response object that says what a chat.completion body says."""
    choice = completion["choices"][0]
    message = choice["message"]
    usage = completion.get("usage") or {}
    output: list[dict[str, Any]] = []
    reasoning = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0
    if reasoning:
        output.append({"type": "reasoning", "id": f"rs_{response_id[5:]}", "summary": []})
    content: list[dict[str, Any]] = []
    if message.get("refusal"):
        content.append({"type": "refusal", "refusal": message["refusal"]})
    elif message.get("content") is not None:
        content.append({"type": "output_text", "text": message["content"], "annotations": []})
    if content:
        output.append({"type": "message", "id": f"msg_{response_id[5:]}", "status": "completed", "role": "assistant",
                       "content": content})
    for call in message.get("tool_calls") or ():
        output.append({"type": "function_call", "id": f"fc_{call['id']}", "call_id": call["id"],
                       "name": call["function"]["name"], "arguments": call["function"]["arguments"],
                       "status": "completed"})
    cut = choice.get("finish_reason") == "length"
    given = usage.get("prompt_tokens_details") or {}
    return {
        "id": response_id, "object": "response", "created_at": completion.get("created", int(time.time())),
        "status": "incomplete" if cut else "completed", "background": background, "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "model": completion.get("model"), "output": output, "service_tier": completion.get("service_tier"),
        "usage": {
            "input_tokens": usage.get("prompt_tokens", 0),
            "input_tokens_details": {"cached_tokens": given.get("cached_tokens", 0),
                                     "cache_write_tokens": given.get("cache_write_tokens", 0) or 0},
            "output_tokens": usage.get("completion_tokens", 0),
            "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": usage.get("total_tokens", 0),
        },
    }


# The completion windows a background response takes (OpenAI's background guide: soonest, the default, 2h, 8h).
COMPLETION_WINDOWS = ("soonest", "2h", "8h")


def _window_problem(body: dict[str, Any]) -> str | None:
    """What is wrong with a body's ``background_options``, as the API words it; None when nothing is."""
    options = body.get("background_options")
    if options is None:
        return None
    if not isinstance(options, dict):
        return "Invalid type for 'background_options': expected an object."
    window = options.get("completion_window", "soonest")
    if window not in COMPLETION_WINDOWS:
        return (f"Invalid value for 'background_options.completion_window': {window!r}. "
                f"Supported values are: {', '.join(repr(w) for w in COMPLETION_WINDOWS)}.")
    if window != "soonest" and body.get("background") is not True:
        return "'background_options.completion_window' requires 'background' to be true."
    return None


class _ResponseRoutes(_ChatRoutes):
    """Chat's route with a Responses body on the way in and a response object on the way out."""

    def __init__(self, state: SimState) -> None:
        super().__init__(state)
        self._background: dict[str, _Background] = {}
        state.reset_hooks.append(self._background.clear)

    def _invalid_body(self, body: Any, request: web.Request) -> web.Response | None:
        if not isinstance(body, dict):
            return invalid_request("Invalid type for body: expected an object.", param=None, code="invalid_type")
        window = _window_problem(body)
        if window is not None:
            return invalid_request(window, param="background_options.completion_window", code="invalid_value")
        twin = chat_twin(body)
        if isinstance(twin, str):
            return invalid_request(twin, param="input", code="invalid_value")
        # Checked as chat is but for its tools: the Responses API takes function tools with reasoning, chat not.
        refused = super()._invalid_body({k: v for k, v in twin.items() if k not in ("tools", "tool_choice")}, request)
        if refused is not None:
            return refused
        own = dict(body)
        body.clear()
        body.update(twin)
        body[_TWIN] = own
        return None

    async def _answer_valid(
        self, request: web.Request, *, body: dict[str, Any], model: str, digest: bytes, kind: str | None = None
    ) -> web.StreamResponse:
        own = body.pop(_TWIN)
        if own.get("background"):
            return self._start_background(body, digest=digest, kind=kind, options=own.get("background_options"))
        answer = await super()._answer_valid(request, body=body, model=model, digest=digest, kind=kind)
        if answer.status != 200 or not isinstance(answer, web.Response) or answer.body is None:
            return answer
        # aiohttp types a body as bytes or a Payload; the chat route's answers set bytes.
        completion = json.loads(bytes(answer.body))  # type: ignore[arg-type]
        response_id = "resp_" + completion["id"].removeprefix("chatcmpl-")
        answer.body = json.dumps(response_object(completion, response_id=response_id)).encode()
        return answer

    def _start_background(
        self, body: dict[str, Any], *, digest: bytes, kind: str | None, options: dict[str, Any] | None
    ) -> web.Response:
        state = self._state
        plan = plan_completion(body, digest=digest, kind=kind)
        completion = json.loads(render_completion(plan, state=state)[0])
        response_id = "resp_" + completion["id"].removeprefix("chatcmpl-")
        finished = response_object(completion, response_id=response_id, background=True)
        window = (options or {}).get("completion_window") or "soonest"
        finished["background_options"] = {"completion_window": window}
        state.stats.count(f"background_window_{window}")
        queued = {**finished, "status": "queued", "output": [], "usage": None, "incomplete_details": None}
        entry = _Background(body=queued)
        if kind == "slow":
            seconds = plan.completion_tokens / state.config.slow_tokens_per_second
        else:
            seconds = sample_latency(state, completion_tokens=plan.completion_tokens)

        async def finish() -> None:
            entry.body = {**queued, "status": "in_progress"}
            await asyncio.sleep(seconds)
            entry.body = finished
            state.stats.count("background_completed")

        entry.task = asyncio.get_running_loop().create_task(finish())
        self._background[response_id] = entry
        state.stats.count("background_created")
        return self._counted(web.json_response(queued))

    async def retrieve(self, request: web.Request) -> web.Response:
        denied = check_auth(request, self._state)
        if denied is not None:
            return denied
        self._state.stats.count("background_polls")
        entry = self._background.get(request.match_info["id"])
        if entry is None:
            return web.json_response({"error": {"message": f"No response found with id '{request.match_info['id']}'.",
                                                "type": "invalid_request_error", "param": None, "code": None}},
                                     status=404)
        return web.json_response(entry.body)
