"""The simulator's Message Batches: Anthropic's ``/v1/messages/batches`` routes, batches kept in memory.

    POST /v1/messages/batches               {"requests": [{"custom_id", "params"}]} -> MessageBatch
    GET  /v1/messages/batches/{id}          MessageBatch
    POST /v1/messages/batches/{id}/cancel   -> "canceling", then "ended" with the unanswered as canceled
    GET  /v1/messages/batches?limit=&after_id=  newest first, {"data", "has_more", "first_id", "last_id"}
    GET  /v1/messages/batches/{id}/results  JSONL, once ended (a 404 not_found_error before)

Every call needs ``anthropic-version`` and, when the config sets ``api_key``, ``x-api-key``. A create is
refused whole (400 ``invalid_request_error`` naming ``requests.N...``) unless every request has a unique
``custom_id`` of 1-64 ``[A-Za-z0-9_-]`` and ``params`` that ``POST /v1/messages`` would accept; at most
100,000 requests. A batch is ``in_progress`` for about ``batch_processing_seconds``, its ``request_counts``
advancing as requests are answered, each exactly as ``POST /v1/messages`` answers its params; then ``ended``.
Results come in request order: ``succeeded`` with the Message, or ``errored`` with an error envelope for a
marker (``[[sim:400]]`` invalid_request_error, ``[[sim:429]]`` rate_limit_error, ``[[sim:500]]`` api_error,
``[[sim:529]]`` overloaded_error, and so on; ``hang``, ``drop``, ``malformed`` and ``line_error`` an api_error)
or a model the config does not list (not_found_error).

Batch faults come from the ``/_sim/batch_faults`` queue, shared with OpenAI's batches (Anthropic's have no
metadata): ``expire[:FRACTION]`` answers that fraction (default 0.5), then ends with the rest ``expired``;
``fail_validation`` refuses the create with a 400; ``slow_finalizing[:SECONDS]`` keeps the batch in_progress
that long after its last answer; ``hang_create[:SECONDS]`` holds the create (default an hour), then answers 529
without creating anything; ``create_lost_hang[:SECONDS]``, ``create_lost_drop`` and ``create_lost_502`` create
the batch (it runs as usual) and lose the answer; ``unreachable[:COUNT]`` answers the batch's first COUNT (default 1)
calls (retrieve, cancel, results) with a 529. Quotas and random fault rates apply to real-time calls only.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

from aiohttp import web

from llm_dispatch.core import MESSAGE_BATCH_LIMITS

from ._anthropic_checks import api_version, check_headers, messages_body_problem, required_list
from ._anthropic_http import anthropic_error
from ._batch_faults import CREATE_ANSWER_FAULTS, HANG_CREATE_SECONDS, BatchFault, lose_create_answer
from ._batch_store import BatchStore, batch_store, requested_page
from ._http import SIM_PREFIX, json_response
from ._message_batch_run import MessageBatch, MessageBatchRun, MessageRequest, new_batch_id
from ._state import SimState

__all__ = ["MESSAGE_BATCHES_PATH", "register"]

MESSAGE_BATCHES_PATH = "/v1/messages/batches"
_CUSTOM_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
_MAX_LIST_LIMIT = 1000


def register(app: web.Application, state: SimState) -> None:
    """Add the Message Batches routes, with the app's batch store (its directory, tasks and fault queue)."""
    routes = _MessageBatchRoutes(batch_store(app, state), state)
    state.reset_hooks.append(routes.batches.clear)
    app.router.add_post(MESSAGE_BATCHES_PATH, routes.create)
    app.router.add_get(MESSAGE_BATCHES_PATH, routes.list)
    app.router.add_get(MESSAGE_BATCHES_PATH + "/{batch_id}", routes.retrieve)
    app.router.add_post(MESSAGE_BATCHES_PATH + "/{batch_id}/cancel", routes.cancel)
    app.router.add_get(MESSAGE_BATCHES_PATH + "/{batch_id}/results", routes.results)


def _origin(request: web.Request) -> str:
    """The server's origin and the path the answering app is served under (a named provider's ``/p/NAME``)."""
    return str(request.url.origin()) + request.app.get(SIM_PREFIX, "")


class _MessageBatchRoutes:
    def __init__(self, store: BatchStore, state: SimState) -> None:
        self._store = store
        self._state = state
        self.batches: dict[str, MessageBatch] = {}  # in creation order

    def _answer(self, request: web.Request, batch: MessageBatch) -> web.Response:
        return json_response(batch.to_api(origin=_origin(request)))

    async def create(self, request: web.Request) -> web.Response:
        refused = check_headers(request, self._state)
        if refused is not None:
            return refused
        try:
            body = json.loads(await request.read())
        except ValueError:
            return anthropic_error(400, "There was an error parsing the body of your request as JSON.")
        parsed = _requests(body)
        if isinstance(parsed, str):
            return anthropic_error(400, parsed)
        store = self._store
        fault: BatchFault | None = store.queued_faults.popleft() if store.queued_faults else None
        if fault is not None and fault.name == "hang_create":
            # The create never happens: the caller times out (or dies) with no batch.
            await asyncio.sleep(HANG_CREATE_SECONDS if fault.argument is None else fault.argument)
            return anthropic_error(529, retry_after=self._state.config.retry_after)
        if fault is not None and fault.name == "fail_validation":
            return anthropic_error(400, "This batch failed validation on purpose (simulator fault fail_validation).")
        lose_answer = fault if fault is not None and fault.name in CREATE_ANSWER_FAULTS else None
        batch = MessageBatch(id=new_batch_id(), requests=parsed, fault=None if lose_answer else fault,
                             created_at=time.time(), version=api_version(request))
        self.batches[batch.id] = batch
        if fault is not None and fault.name == "unreachable":
            store.make_trouble(batch.id, 529, times=int(fault.argument or 1))
        self._state.stats.message_batches += 1
        store.start(MessageBatchRun(batch=batch, store=store, state=self._state).run())
        if lose_answer is not None:
            return await lose_create_answer(request, lose_answer, answer=lambda: self._answer(request, batch),
                                            bad_gateway=anthropic_error(502))
        return self._answer(request, batch)

    def _batch(self, request: web.Request) -> MessageBatch | web.Response:
        refused = check_headers(request, self._state)
        if refused is not None:
            return refused
        batch_id = request.match_info["batch_id"]
        if self._store.trouble(batch_id) is not None:
            return anthropic_error(529, retry_after=self._state.config.retry_after)
        batch = self.batches.get(batch_id)
        return batch if batch is not None else anthropic_error(404, f"No batch found with id '{batch_id}'.")

    async def retrieve(self, request: web.Request) -> web.Response:
        batch = self._batch(request)
        return batch if isinstance(batch, web.Response) else self._answer(request, batch)

    async def cancel(self, request: web.Request) -> web.Response:
        batch = self._batch(request)
        if isinstance(batch, web.Response):
            return batch
        if batch.processing_status == "ended":
            return anthropic_error(400, f"Batch {batch.id} has ended; only a batch in progress can be canceled.")
        if batch.processing_status != "canceling":  # a repeated cancel just reports the batch again
            batch.processing_status = "canceling"
            batch.cancel_initiated_at = time.time()
            batch.cancel_requested.set()
        return self._answer(request, batch)

    async def list(self, request: web.Request) -> web.Response:
        refused = check_headers(request, self._state)
        if refused is not None:
            return refused
        origin = _origin(request)
        page = requested_page(self.batches, request.query, cursor="after_id", maximum=_MAX_LIST_LIMIT,
                              to_api=lambda batch: batch.to_api(origin=origin))
        if page is None:
            return anthropic_error(400, f"limit: Input should be an integer from 1 to {_MAX_LIST_LIMIT}, "
                                        f"got {request.query.get('limit')!r}")
        return json_response(page)

    async def results(self, request: web.Request) -> web.StreamResponse:
        batch = self._batch(request)
        if isinstance(batch, web.Response):
            return batch
        if batch.processing_status != "ended" or batch.results_path is None:
            return anthropic_error(404, f"Batch {batch.id} has not ended yet; its results are not available.")
        return web.FileResponse(batch.results_path, headers={"Content-Type": "application/binary"})


def _requests(body: Any) -> list[MessageRequest] | str:
    """The batch's requests, or why the create is refused (in Anthropic's words)."""
    if not isinstance(body, dict):
        return "Input should be a valid dictionary"
    requests = required_list(body, "requests")
    if isinstance(requests, str):
        return requests
    if len(requests) > MESSAGE_BATCH_LIMITS.max_requests:
        return (f"requests: List should have at most {MESSAGE_BATCH_LIMITS.max_requests} items after validation, "
                f"not {len(requests)}")
    parsed: list[MessageRequest] = []
    seen: set[str] = set()
    for index, item in enumerate(requests):
        where = f"requests.{index}"
        if not isinstance(item, dict):
            return f"{where}: Input should be a valid dictionary"
        custom_id = item.get("custom_id")
        if not isinstance(custom_id, str) or not _CUSTOM_ID.fullmatch(custom_id):
            return f"{where}.custom_id: String should match pattern '^[a-zA-Z0-9_-]{{1,64}}$'"
        if custom_id in seen:
            return f"{where}.custom_id: Duplicate custom_id '{custom_id}'; each request in a batch needs its own."
        seen.add(custom_id)
        if item.get("params") is None:
            return f"{where}.params: Field required"
        problem = messages_body_problem(item["params"], where=f"{where}.params.")
        if problem is not None:
            return problem
        parsed.append(MessageRequest(custom_id=custom_id, params=item["params"]))
    return parsed
