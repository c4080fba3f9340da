"""OpenAI's Responses in background mode: a request created with ``background: true``, then polled until it ends.

What the client sends for it is the usual send path (its retries, gates and errors); this is the provider's surface
around it: the create's body, the poll loop, and what a response that ended without an answer means.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from .._exceptions import APIResponseValidationError
from ._gates import Gates
from ..wire._openai_responses import TERMINAL_RESPONSE_STATUSES, parse_response_status, response_from_body
from ..wire._requests import path_segment
from .._status import BACKGROUND_WINDOWS
from ..pricing._tokens import estimate_request_tokens
from .._types import ChatRequest, ChatResult
from ..wire._wire import Wire

__all__ = ["DEFAULT_BACKGROUND_POLL", "RESPONSES_PATH", "BackgroundResponses", "Creating", "Started"]

logger = logging.getLogger(__name__)

RESPONSES_PATH = "/responses"
# Seconds between polls of a background response.
DEFAULT_BACKGROUND_POLL = 2.0

# Told a background response's id as soon as it is created (to store it: a re-run polls it, never creates again).
Started = Callable[[str], Awaitable[None]]
# Awaited before a background create is sent (to count it: a re-run that finds more creates than stored ids knows
# one may be running, and billed, without its id).
Creating = Callable[[], Awaitable[None]]


class BackgroundResponses:
    """Background responses sent by one client: ``send`` is its ``_request``, ``gates`` its gates."""

    def __init__(self, *, send: Callable[..., Awaitable[Any]], wire: Wire, gates: Gates,
                 sleep: Callable[[float], Awaitable[object]], clock: Callable[[], float], poll: float) -> None:
        self._send = send
        self._wire = wire
        self._gates = gates
        self._sleep = sleep
        self._clock = clock
        self._poll = poll

    async def answer(self, request: ChatRequest, *, started: Started | None, creating: Creating | None) -> ChatResult:
        """A Responses request in background mode: created with ``background: true`` (unless ``background_id``
        says it was), ``creating`` awaited before the create is sent, its id handed to ``started`` before anything
        else, then polled until it leaves queued and in_progress. Only the create is billed: a poll that fails is
        retried by the house rules. A create whose answer was lost may have made a response: it is counted as
        possibly billed, and so is each of ``request.lost_creates``. A response that failed or was cancelled
        raises ``APIResponseValidationError`` (it may have been billed)."""
        admitted = self._clock()
        response_id = request.background_id
        attempts = estimate = 0
        # Creates that may be running, and billed, beside the one whose answer this is.
        unanswered = request.lost_creates
        if unanswered:
            logger.warning("%d background create(s) of this request were sent before and their ids never stored (a run "
                           "was killed between a create's answer and storing its id): counted as possibly billed",
                           unanswered)
        if response_id is None:
            if creating is not None:
                await creating()
            estimate = estimate_request_tokens(request) if self._gates.counts_tokens else 0
            path, body = self._create(request)
            sent = await self._send("POST", path, json=body, parse=parse_response_status, paced=True, tokens=estimate)
            attempts, admitted = sent.attempts, sent.admitted_at
            unanswered += sent.maybe_billed - 1
            status, answer = sent.value
            response_id = answer["id"]
            if started is not None:
                await started(response_id)
        else:
            status, answer = "queued", None
        path = f"{RESPONSES_PATH}/{path_segment(response_id)}"
        while status not in TERMINAL_RESPONSE_STATUSES:
            await self._sleep(self._poll)
            status, answer = (await self._send("GET", path, parse=parse_response_status)).value
        chat = response_from_body(answer)
        if chat is None:
            error = answer.get("error") if isinstance(answer, dict) else None
            detail = error.get("message") if isinstance(error, dict) else None
            raise APIResponseValidationError(
                f"background response {response_id} ended {status}" + (f": {detail}" if detail else "")
                + "; it may have been billed, so it is not sent again: --retry-failed all would")
        self._gates.used_tokens(chat.total_tokens - estimate)
        result = chat.finished(latency_s=self._clock() - admitted, attempts=max(attempts, 1))
        result.maybe_billed += unanswered
        return result

    def _create(self, request: ChatRequest) -> tuple[str, dict[str, Any]]:
        """The create's path and body: the request in background mode, in its lane's completion window."""
        route = self._wire.route("responses")
        body = {**route.body(request), "background": True}
        window = BACKGROUND_WINDOWS.get(request.lane or "")
        if window is not None:
            body["background_options"] = {**(body.get("background_options") or {}), "completion_window": window}
        return route.path, body
