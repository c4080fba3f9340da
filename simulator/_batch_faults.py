"""Batch faults: what ``metadata["sim_fault"]`` or the ``/_sim/batch_faults`` queue asks of a batch, and
the answers a batch line gets for a ``[[sim:FAULT]]`` marker."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import NamedTuple

from aiohttp import web

from ._checks import invalid_request, model_not_found
from ._config import ANSWER_KINDS, FAULTS
from ._http import (
    client_error_response,
    dropped_response,
    error_response,
    insufficient_quota_response,
    server_error_response,
)
from ._markers import marker_pattern

__all__ = [
    "BATCH_FAULTS",
    "CREATE_ANSWER_FAULTS",
    "DEFAULT_EXPIRE_FRACTION",
    "HANG_CREATE_SECONDS",
    "LINE_ERROR_MARKER",
    "LINE_FAULTS",
    "LINE_MARKER",
    "LINE_STOPS",
    "OPENAI_LINE_CODES",
    "SIM_FAULT_KEY",
    "UNREACHABLE_STATUS",
    "BatchFault",
    "fault_text",
    "line_fault_response",
    "lose_create_answer",
    "parse_batch_fault",
]

# The create happens, then its answer is lost: held until the client gives up, the connection
# closed, or a 502 from a gateway that lost the provider's answer.
CREATE_ANSWER_FAULTS = frozenset({"create_lost_hang", "create_lost_drop", "create_lost_502"})
# ``hang_upload[:SECONDS]``: Gemini's resumable upload holds its last chunk (the Files API; taken by the next upload
# when it heads the queue).
BATCH_FAULTS = frozenset({"expire", "fail_validation", "slow_finalizing", "hang_create", "hang_upload",
                          "unreachable"}) | CREATE_ANSWER_FAULTS
# The server error an ``unreachable[:COUNT]`` batch answers its first COUNT (default 1) retrieves and cancels with.
UNREACHABLE_STATUS = 503
LINE_ERROR_MARKER = "line_error"
# A line the provider stopped without an answer, each in its API's words: OpenAI's error lines request_timeout,
# batch_cancelled and batch_expired; Anthropic's errored timeout_error, and canceled and expired results.
LINE_STOPS = frozenset({"line_timeout", "line_cancelled", "line_expired"})
OPENAI_LINE_CODES = {"line_timeout": "request_timeout", "line_cancelled": "batch_cancelled",
                     "line_expired": "batch_expired", LINE_ERROR_MARKER: "simulated_line_error"}
SIM_FAULT_KEY = "sim_fault"
LINE_FAULTS = FAULTS | ANSWER_KINDS | LINE_STOPS | {LINE_ERROR_MARKER}
LINE_MARKER = marker_pattern(LINE_FAULTS)
DEFAULT_EXPIRE_FRACTION = 0.5
HANG_CREATE_SECONDS = 3600.0
_NO_ARGUMENT = frozenset({"fail_validation", "create_lost_drop", "create_lost_502"})
_USAGE = ("expire[:FRACTION], fail_validation, slow_finalizing[:SECONDS], hang_create[:SECONDS], hang_upload[:SECONDS], "
          "create_lost_hang[:SECONDS], create_lost_drop, create_lost_502 or unreachable[:COUNT]")

_FAULT_TEXT = re.compile(r"(?P<name>[a-z][a-z0-9_]*)(?::(?P<arg>[0-9]*\.?[0-9]+))?")


class BatchFault(NamedTuple):
    name: str
    argument: float | None = None


def parse_batch_fault(text: str) -> BatchFault:
    """``expire[:FRACTION]``, ``fail_validation``, ``slow_finalizing[:SECONDS]``, ``hang_create[:SECONDS]``,
    ``create_lost_hang[:SECONDS]``, ``create_lost_drop``, ``create_lost_502`` or ``unreachable[:COUNT]``; anything
    else is a ValueError."""
    found = _FAULT_TEXT.fullmatch(text.strip())
    name = found.group("name") if found else None
    if found is None or name not in BATCH_FAULTS:
        raise ValueError(f"Unknown batch fault {text!r}; use {_USAGE}.")
    arg = found.group("arg")
    if arg is None:
        return BatchFault(name)
    value = float(arg)
    if name in _NO_ARGUMENT:
        raise ValueError(f"The batch fault {name} takes no argument.")
    if name == "expire" and not 0.0 <= value <= 1.0:
        raise ValueError(f"expire:FRACTION needs a fraction from 0 to 1, got {arg}.")
    if name == "unreachable" and (value < 1 or value != int(value)):
        raise ValueError(f"unreachable:COUNT needs a whole number of calls, 1 or more, got {arg}.")
    return BatchFault(name, value)


def fault_text(fault: BatchFault) -> str:
    return fault.name if fault.argument is None else f"{fault.name}:{fault.argument:g}"


def line_fault_response(fault: str, *, model: str) -> web.Response:
    """What a batch line answers for a marker fault; a batch has no connection to hang, drop or garble: a 500."""
    if fault == "400":
        return invalid_request("Simulated bad request (simulator fault 400).", param=None, code=None)
    if fault == "401":
        return error_response(status=401, message="Incorrect API key provided (simulator fault 401).",
                              code="invalid_api_key")
    if fault == "404":
        return model_not_found(model)
    if fault == "429":
        return error_response(
            status=429, type="requests", code="rate_limit_exceeded",
            message=f"Rate limit reached for {model} in organization org-simulator on requests per min (RPM) "
                    "(simulator fault 429).")
    if fault == "insufficient_quota":
        return insufficient_quota_response()
    if fault in ("402", "403", "413"):
        return client_error_response(int(fault))
    if fault in ("503", "504", "529"):
        return server_error_response(int(fault))
    return server_error_response(500)


async def lose_create_answer(
    request: web.Request, fault: BatchFault, *, answer: Callable[[], web.Response], bad_gateway: web.Response
) -> web.Response:
    """The answer to a create that happened, as a ``create_lost_*`` fault loses it; ``answer()`` is the real one."""
    if fault.name == "create_lost_drop":
        return dropped_response(request)
    if fault.name == "create_lost_502":
        return bad_gateway
    # The client gives up long before this; one that waits gets its batch.
    await asyncio.sleep(HANG_CREATE_SECONDS if fault.argument is None else fault.argument)
    return answer()
