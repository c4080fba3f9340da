"""The simulator's Batch API: ``/v1/files`` and ``/v1/batches`` in OpenAI's shapes, files kept on disk.

    POST   /v1/files                multipart ``file`` and ``purpose`` -> file object
    GET    /v1/files/{id}           file object
    GET    /v1/files/{id}/content   the bytes, streamed from disk
    DELETE /v1/files/{id}           {"id", "object": "file", "deleted": true}
    POST   /v1/batches              {"input_file_id", "endpoint", "completion_window", "metadata"} -> batch object
    GET    /v1/batches/{id}         batch object
    POST   /v1/batches/{id}/cancel  -> "cancelling", then "cancelled" with the output of what completed
    GET    /v1/batches?limit=&after=  newest first, {"data", "first_id", "last_id", "has_more"}
    GET    /_sim/batch_faults       faults still queued for the next batches
    POST   /_sim/batch_faults       {"faults": ["expire", "slow_finalizing:1.5"]} for the next batches, in order
                                    (OpenAI's or Anthropic's, whichever is created next; see ``_message_batches``)
    POST   /_sim/batch_trouble      {"batch_id": ID, "trouble": "forget" | 500 | 502 | 503 | 504 | null, "times": N}:
                                    forget the batch (a 404 from then on, and gone from the list: a provider that
                                    lost it), or answer every GET and cancel of it with that server error (the next
                                    ``times`` of them only, when given; null: heal)

A batch takes about ``batch_processing_seconds``: a tenth validating, eight tenths in_progress (its
``request_counts`` advancing as lines are answered), a tenth finalizing. Every input line must be
``{"custom_id", "method": "POST", "url": <endpoint>, "body"}`` with unique ids and one model, or the
batch fails validation with ``errors.data = [{code, message, line, param}]``. Each line is answered
with exactly the completion ``POST /v1/chat/completions`` gives for the same body; 200s go to the
output file, everything else to the error file.

Batch faults, from the batch's ``metadata["sim_fault"]`` or else the ``/_sim/batch_faults`` queue:
``expire[:FRACTION]`` answers the first FRACTION of lines (default 0.5), then ends ``expired`` with
the rest in the error file as ``batch_expired``; ``fail_validation`` fails validation;
``slow_finalizing[:SECONDS]`` stays ``finalizing`` that long (default ``batch_processing_seconds``);
``hang_create[:SECONDS]`` holds ``POST /v1/batches`` that long (default an hour), then answers 503
without creating the batch: a client that gives up or dies there has uploaded its file and has no batch.
``unreachable[:COUNT]`` answers the batch's first COUNT (default 1) GETs and cancels with a 503, then serves it.
The ``create_lost_*`` faults create the batch (it runs as usual) and lose the answer: ``create_lost_hang[:SECONDS]``
holds it that long (default an hour, so the client times out), ``create_lost_drop`` closes the connection,
``create_lost_502`` answers 502. A client that simply tries again has two batches for one file.
Line faults, from a chat marker in the line's messages: ``[[sim:400]]``, ``[[sim:401]]``,
``[[sim:404]]``, ``[[sim:429]]``, ``[[sim:500]]``, ``[[sim:503]]`` answer that status with OpenAI's
error body (``hang``, ``drop`` and ``malformed`` become a 500, a batch having no connection to
break); ``[[sim:line_error]]`` gives ``"response": null`` and an ``error`` object. ``xN`` works as
in chat. Random fault rates and quotas apply to real-time chat only.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import BodyPartReader, web
from aiohttp.typedefs import Handler

from ._batch_faults import (
    CREATE_ANSWER_FAULTS,
    HANG_CREATE_SECONDS,
    SIM_FAULT_KEY,
    UNREACHABLE_STATUS,
    BatchFault,
    fault_text,
    lose_create_answer,
    parse_batch_fault,
)
from ._batch_run import BatchRun
from ._batch_store import (
    COMPLETION_WINDOW,
    TERMINAL,
    Batch,
    BatchStore,
    StoredFile,
    batch_store,
    now,
    requested_page,
)
from ._chat import CHAT_COMPLETIONS_PATH
from ._embeddings import EMBEDDINGS_PATH
from ._responses_route import RESPONSES_PATH
from ._checks import check_auth, invalid_request
from ._http import error_response, json_response, read_json_object, served_path, server_error_response
from ._state import SimState

__all__ = ["register"]

_PURPOSES = frozenset({"batch", "fine-tune", "assistants", "vision", "user_data", "evals"})
_METADATA_PAIRS, _METADATA_KEY_CHARS, _METADATA_VALUE_CHARS = 16, 64, 512
_MAX_LIST_LIMIT = 100

_Found = TypeVar("_Found", StoredFile, Batch)


# The batch endpoints the simulator answers (OpenAI's take more: completions, moderations, images...).
_ENDPOINTS = (CHAT_COMPLETIONS_PATH, RESPONSES_PATH, EMBEDDINGS_PATH)


def _no_batch_api(state: SimState) -> Any:
    """With ``batch_api`` off, the files and batches routes are not there: a 404 as for an unknown URL."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not state.config.batch_api and served_path(request).startswith(("/v1/files", "/v1/batches")):
            return error_response(status=404, message=f"Invalid URL ({request.method} {request.path})")
        return await handler(request)

    return middleware


def register(app: web.Application, state: SimState) -> None:
    app.middlewares.append(_no_batch_api(state))
    """Add the files, batches and batch-fault routes, with the app's batch store."""
    store = batch_store(app, state)
    routes = _BatchRoutes(store, state)
    app.router.add_post("/v1/files", routes.upload_file)
    app.router.add_get("/v1/files/{file_id}", routes.get_file)
    app.router.add_get("/v1/files/{file_id}/content", routes.file_content)
    app.router.add_delete("/v1/files/{file_id}", routes.delete_file)
    app.router.add_post("/v1/batches", routes.create_batch)
    app.router.add_get("/v1/batches", routes.list_batches)
    app.router.add_get("/v1/batches/{batch_id}", routes.get_batch)
    app.router.add_post("/v1/batches/{batch_id}/cancel", routes.cancel_batch)
    app.router.add_get("/_sim/batch_faults", routes.get_faults)
    app.router.add_post("/_sim/batch_faults", routes.queue_faults)
    app.router.add_post("/_sim/batch_trouble", routes.make_trouble)


def _not_found_file(file_id: str) -> web.Response:
    return error_response(status=404, message=f"No such File object: {file_id}", param="id")


def _not_found_batch(batch_id: str) -> web.Response:
    return error_response(status=404, message=f"No batch found with id '{batch_id}'.", param="batch_id")


def _missing(param: str) -> web.Response:
    return invalid_request(f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter")


class _BatchRoutes:
    def __init__(self, store: BatchStore, state: SimState) -> None:
        self._store = store
        self._state = state
        # The file or batch a request's path names, or the 401 or 404 to answer instead.
        self._file: Callable[[web.Request], StoredFile | web.Response] = partial(
            self._find, table=store.files, key="file_id", not_found=_not_found_file)
        self._batch: Callable[[web.Request], Batch | web.Response] = partial(
            self._find, table=store.batches, key="batch_id", not_found=_not_found_batch)

    # --- files ---------------------------------------------------------------------------------

    async def upload_file(self, request: web.Request) -> web.Response:
        denied = check_auth(request, self._state)
        if denied is not None:
            return denied
        if not request.content_type.startswith("multipart/"):
            return invalid_request("Send the file as multipart/form-data with fields 'file' and 'purpose'.",
                                   param=None, code=None)
        purpose: str | None = None
        upload: tuple[Path, int, str] | None = None
        try:
            reader = await request.multipart()
            async for part in reader:
                if not isinstance(part, BodyPartReader):
                    continue
                if part.name == "purpose":
                    purpose = (await part.text()).strip()
                elif part.name == "file" and upload is None:
                    path = self._store.new_path(f"upload-{secrets.token_hex(8)}.jsonl")
                    size = 0
                    # Chunk by chunk to disk: a 200 MB batch file never sits in memory.
                    with path.open("wb") as out:
                        while chunk := await part.read_chunk():
                            out.write(chunk)
                            size += len(chunk)
                    upload = (path, size, part.filename or "file.jsonl")
        except BaseException:
            if upload is not None:
                upload[0].unlink(missing_ok=True)
            raise
        if upload is None or purpose is None or purpose not in _PURPOSES:
            if upload is not None:
                upload[0].unlink(missing_ok=True)
            if upload is None:
                return _missing("file")
            if purpose is None:
                return _missing("purpose")
            return invalid_request(
                f"Invalid value: '{purpose}'. Supported values are: {', '.join(sorted(_PURPOSES))}.",
                param="purpose", code="invalid_value")
        path, size, filename = upload
        stored = self._store.add_file(path=path, size=size, filename=filename, purpose=purpose)
        return json_response(stored.to_api())

    def _find(
        self, request: web.Request, *, table: Mapping[str, _Found], key: str, not_found: Callable[[str], web.Response]
    ) -> _Found | web.Response:
        """The file or batch that ``request`` names in its path, or the 401 or 404 to answer."""
        denied = check_auth(request, self._state)
        if denied is not None:
            return denied
        found_id = request.match_info[key]
        status = self._store.trouble(found_id)
        if status is not None:
            return server_error_response(status)
        found = table.get(found_id)
        return found if found is not None else not_found(found_id)

    @staticmethod
    def _shown(found: StoredFile | Batch | web.Response) -> web.Response:
        """The file or batch as the API shows it (or the refusal found instead)."""
        return found if isinstance(found, web.Response) else json_response(found.to_api())

    async def file_content(self, request: web.Request) -> web.StreamResponse:
        stored = self._file(request)
        if isinstance(stored, web.Response):
            return stored
        return web.FileResponse(stored.path, headers={"Content-Type": "application/octet-stream"})

    async def delete_file(self, request: web.Request) -> web.Response:
        stored = self._file(request)
        if isinstance(stored, web.Response):
            return stored
        del self._store.files[stored.id]
        # A batch still reading it keeps its open handle; the name goes now.
        stored.path.unlink(missing_ok=True)
        return json_response({"id": stored.id, "object": "file", "deleted": True})

    async def get_file(self, request: web.Request) -> web.Response:
        return self._shown(self._file(request))

    # --- batches -------------------------------------------------------------------------------

    async def create_batch(self, request: web.Request) -> web.Response:
        denied = check_auth(request, self._state)
        if denied is not None:
            return denied
        body = await read_json_object(request)
        if body is None:
            return invalid_request("The body must be a JSON object.", param=None, code=None)
        input_file_id = body.get("input_file_id")
        if not isinstance(input_file_id, str) or not input_file_id:
            return _missing("input_file_id")
        endpoint = body.get("endpoint")
        if endpoint is None:
            return _missing("endpoint")
        if endpoint not in _ENDPOINTS:
            return invalid_request(
                f"Invalid value: '{endpoint}'. The simulator's Batch API supports {', '.join(map(repr, _ENDPOINTS))}.",
                param="endpoint", code="invalid_value")
        window = body.get("completion_window")
        if window is None:
            return _missing("completion_window")
        if window != COMPLETION_WINDOW:
            return invalid_request(f"Invalid value: '{window}'. Supported values are: '{COMPLETION_WINDOW}'.",
                                   param="completion_window", code="invalid_value")
        metadata = body.get("metadata")
        problem = _metadata_problem(metadata)
        if problem is not None:
            return invalid_request(problem, param="metadata", code="invalid_value")
        stored = self._store.files.get(input_file_id)
        if stored is None:
            return _not_found_file(input_file_id)
        if stored.purpose != "batch":
            return invalid_request(
                f"The input file {input_file_id} has purpose '{stored.purpose}'; a batch needs purpose 'batch'.",
                param="input_file_id", code="invalid_value")
        fault: BatchFault | None = None
        if metadata and SIM_FAULT_KEY in metadata:
            try:
                fault = parse_batch_fault(metadata[SIM_FAULT_KEY])
            except ValueError as exc:
                return invalid_request(str(exc), param=f"metadata.{SIM_FAULT_KEY}", code="invalid_value")
        elif self._store.queued_faults:
            fault = self._store.queued_faults.popleft()
        if fault is not None and fault.name == "hang_create":
            # The create never happens: the caller times out (or dies) with its file uploaded and no batch.
            await asyncio.sleep(HANG_CREATE_SECONDS if fault.argument is None else fault.argument)
            return server_error_response(503)

        lose_answer = fault if fault is not None and fault.name in CREATE_ANSWER_FAULTS else None
        batch = Batch(
            id=f"batch_{secrets.token_hex(16)}", input_file_id=input_file_id, input_path=stored.path,
            endpoint=endpoint, completion_window=window, metadata=dict(metadata) if metadata is not None else None,
            fault=None if lose_answer else fault, created_at=now(),
        )
        self._store.batches[batch.id] = batch
        if fault is not None and fault.name == "unreachable":
            self._store.make_trouble(batch.id, UNREACHABLE_STATUS, times=int(fault.argument or 1))
        self._state.stats.batches += 1
        self._store.start(BatchRun(batch=batch, store=self._store, state=self._state).run())
        if lose_answer is not None:
            return await lose_create_answer(request, lose_answer, answer=lambda: json_response(batch.to_api()),
                                            bad_gateway=server_error_response(502))
        return json_response(batch.to_api())

    async def get_batch(self, request: web.Request) -> web.Response:
        return self._shown(self._batch(request))

    async def cancel_batch(self, request: web.Request) -> web.Response:
        batch = self._batch(request)
        if isinstance(batch, web.Response):
            return batch
        if batch.status in TERMINAL:
            return error_response(status=409, message=f"Cannot cancel a batch with status '{batch.status}'.")
        if batch.status != "cancelling":  # a repeated cancel just reports the batch again
            batch.status = "cancelling"
            batch.cancelling_at = now()
            batch.cancel_requested.set()
        return json_response(batch.to_api())

    async def list_batches(self, request: web.Request) -> web.Response:
        denied = check_auth(request, self._state)
        if denied is not None:
            return denied
        page = requested_page(self._store.batches, request.query, cursor="after", maximum=_MAX_LIST_LIMIT,
                              to_api=Batch.to_api)
        if page is None:
            return invalid_request(f"Invalid 'limit': expected an integer from 1 to {_MAX_LIST_LIMIT}, but got "
                                   f"{request.query.get('limit')!r} instead.", param="limit", code="invalid_value")
        return json_response({"object": "list", **page})

    # --- faults --------------------------------------------------------------------------------

    async def get_faults(self, request: web.Request) -> web.Response:
        return json_response({"faults": [fault_text(f) for f in self._store.queued_faults]})

    async def queue_faults(self, request: web.Request) -> web.Response:
        body = await read_json_object(request)
        faults = body.get("faults") if body is not None else None
        if not isinstance(faults, list):
            return invalid_request('Send {"faults": [...]} with a list of batch faults.', param=None, code=None)
        try:
            parsed = [parse_batch_fault(str(f)) for f in faults]
        except ValueError as exc:
            return invalid_request(str(exc), param="faults", code="invalid_value")
        self._store.queued_faults.extend(parsed)
        return json_response({"faults": [fault_text(f) for f in self._store.queued_faults]})


    async def make_trouble(self, request: web.Request) -> web.Response:
        body = await read_json_object(request)
        batch_id = body.get("batch_id") if body is not None else None
        trouble = body.get("trouble") if body is not None else None
        times = body.get("times") if body is not None else None
        if not isinstance(batch_id, str) or batch_id not in self._store.batches and trouble == "forget":
            return invalid_request('Send {"batch_id": <a batch id>, "trouble": "forget" | 500 | 502 | 503 | 504 '
                                   '| null}.', param="batch_id", code=None)
        if times is not None and (not isinstance(times, int) or isinstance(times, bool) or times < 1):
            return invalid_request(f"times must be a whole number of calls, 1 or more, got {times!r}.",
                                   param="times", code="invalid_value")
        if trouble == "forget":
            del self._store.batches[batch_id]
            self._store.make_trouble(batch_id, None)
        elif trouble is None:
            self._store.make_trouble(batch_id, None)
        elif trouble in _TROUBLE_STATUSES:
            self._store.make_trouble(batch_id, int(trouble), times=times)
        else:
            return invalid_request(f"Unknown trouble {trouble!r}; use forget, {sorted(_TROUBLE_STATUSES)} or null.",
                                   param="trouble", code="invalid_value")
        return json_response({"batch_id": batch_id, "trouble": trouble})


_TROUBLE_STATUSES = frozenset({500, 502, 503, 504})


def _metadata_problem(metadata: Any) -> str | None:
    if metadata is None:
        return None
    if not isinstance(metadata, dict):
        return "Invalid type for 'metadata': expected an object."
    if len(metadata) > _METADATA_PAIRS:
        return f"Invalid 'metadata': at most {_METADATA_PAIRS} key-value pairs are allowed."
    for key, value in metadata.items():
        if len(key) > _METADATA_KEY_CHARS:
            return f"Invalid 'metadata': key {key[:20]!r}... is longer than {_METADATA_KEY_CHARS} characters."
        if not isinstance(value, str):
            return f"Invalid type for 'metadata.{key}': expected a string."
        if len(value) > _METADATA_VALUE_CHARS:
            return f"Invalid 'metadata.{key}': longer than {_METADATA_VALUE_CHARS} characters."
    return None
