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
Line faults, from a chat marker in the line's messages: ``[[sim:400]]``, ``[[sim:401]]``,
``[[sim:404]]``, ``[[sim:429]]``, ``[[sim:500]]``, ``[[sim:503]]`` answer that status with OpenAI's
error body (``hang``, ``drop`` and ``malformed`` become a 500, a batch having no connection to
break); ``[[sim:line_error]]`` gives ``"response": null`` and an ``error`` object. ``xN`` works as
in chat. Random fault rates and quotas apply to real-time chat only.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import os
import re
import secrets
import shutil
import tempfile
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, NamedTuple

from aiohttp import BodyPartReader, web

from llm_dispatch import OPENAI_BATCH_LIMITS, BatchLimits

from ._chat import (
    CHAT_COMPLETIONS_PATH,
    _SYSTEM_FINGERPRINT,
    _ChatRoutes,
    _plan_choices,
    marker_fault,
)
from ._checks import (
    check_auth,
    invalid_request,
    model_not_found,
    validate_chat_body,
)
from ._config import FAULTS
from ._http import (
    completion_body,
    error_response,
    json_response,
    server_error_response,
)
from ._state import SimState
from ._tokens import REPLY_PRIMING_TOKENS, completion_text, message_token_counts

__all__ = ["BATCH_FAULTS", "LINE_ERROR_MARKER", "SIM_FAULT_KEY", "BatchFault", "parse_batch_fault", "register"]

logger = logging.getLogger(__name__)

BATCH_FAULTS = frozenset({"expire", "fail_validation", "slow_finalizing", "hang_create"})
LINE_ERROR_MARKER = "line_error"
SIM_FAULT_KEY = "sim_fault"
# The only completion window OpenAI's Batch API offers, and how long it is.
COMPLETION_WINDOW = "24h"
_WINDOW_SECONDS = 24 * 3600

_FAULT_TEXT = re.compile(r"(?P<name>[a-z_]+)(?::(?P<arg>[0-9]*\.?[0-9]+))?")
_LINE_MARKER = re.compile(rf"({'|'.join(sorted(FAULTS | {LINE_ERROR_MARKER}))})(?:x([1-9][0-9]*))?")
_MARKER_BYTES = b"[[sim:"
_DEFAULT_EXPIRE_FRACTION = 0.5
_HANG_CREATE_SECONDS = 3600.0

# Shares of batch_processing_seconds spent validating and finalizing; in_progress gets the rest.
_VALIDATING_SHARE = 0.1
_FINALIZING_SHARE = 0.1
# Lines handled between yields to the event loop, and the fewest progress steps a batch shows.
_CHUNK_LINES = 256
_MIN_PROGRESS_STEPS = 20
_MAX_VALIDATION_ERRORS = 100
_WRITE_BUFFER = 1024 * 1024
_PURPOSES = frozenset({"batch", "fine-tune", "assistants", "vision", "user_data", "evals"})
_METADATA_PAIRS, _METADATA_KEY_CHARS, _METADATA_VALUE_CHARS = 16, 64, 512
_DEFAULT_LIST_LIMIT, _MAX_LIST_LIMIT = 20, 100
_TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
# Exactly how httpx encodes a JSON body, so a batch line's body hashes to the real-time answer's digest.
_body_bytes = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


class BatchFault(NamedTuple):
    name: str
    argument: float | None = None


def parse_batch_fault(text: str) -> BatchFault:
    """``expire[:FRACTION]``, ``fail_validation``, ``slow_finalizing[:SECONDS]`` or ``hang_create[:SECONDS]``;
    anything else is a ValueError."""
    found = _FAULT_TEXT.fullmatch(text.strip())
    name = found.group("name") if found else None
    if found is None or name not in BATCH_FAULTS:
        raise ValueError(
            f"Unknown batch fault {text!r}; use expire[:FRACTION], fail_validation, slow_finalizing[:SECONDS] "
            "or hang_create[:SECONDS]."
        )
    arg = found.group("arg")
    if arg is None:
        return BatchFault(name)
    value = float(arg)
    if name == "fail_validation":
        raise ValueError("The batch fault fail_validation takes no argument.")
    if name == "expire" and not 0.0 <= value <= 1.0:
        raise ValueError(f"expire:FRACTION needs a fraction from 0 to 1, got {arg}.")
    return BatchFault(name, value)


def register(app: web.Application, state: SimState) -> None:
    """Add the files, batches and batch-fault routes, with a store that lives and dies with ``app``."""
    store = _BatchStore(state)
    state.reset_hooks.append(store.reset)
    app.on_cleanup.append(store.close)
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


def _now() -> int:
    return int(time.time())


@dataclass(slots=True)
class _StoredFile:
    id: str
    path: Path
    bytes: int
    filename: str
    purpose: str
    created_at: int

    def to_api(self) -> dict[str, Any]:
        return {
            "id": self.id, "object": "file", "bytes": self.bytes, "created_at": self.created_at,
            "filename": self.filename, "purpose": self.purpose, "status": "processed", "status_details": None,
            "expires_at": None,
        }


@dataclass(slots=True, kw_only=True)
class _Batch:
    id: str
    input_file_id: str
    input_path: Path
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None
    fault: BatchFault | None
    created_at: int
    status: str = "validating"
    output_file_id: str | None = None
    error_file_id: str | None = None
    in_progress_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    total: int = 0
    completed: int = 0
    failed: int = 0
    errors: list[dict[str, Any]] = field(default_factory=list)
    cancel_requested: asyncio.Event = field(default_factory=asyncio.Event)

    def to_api(self) -> dict[str, Any]:
        return {
            "id": self.id, "object": "batch", "endpoint": self.endpoint,
            "errors": {"object": "list", "data": self.errors} if self.errors else None,
            "input_file_id": self.input_file_id, "completion_window": self.completion_window,
            "status": self.status, "output_file_id": self.output_file_id, "error_file_id": self.error_file_id,
            "created_at": self.created_at, "in_progress_at": self.in_progress_at,
            "expires_at": self.created_at + _WINDOW_SECONDS, "finalizing_at": self.finalizing_at,
            "completed_at": self.completed_at, "failed_at": self.failed_at, "expired_at": self.expired_at,
            "cancelling_at": self.cancelling_at, "cancelled_at": self.cancelled_at,
            "request_counts": {"total": self.total, "completed": self.completed, "failed": self.failed},
            "metadata": self.metadata,
        }


class _Sink:
    """An output or error file being written; becomes a file object only if it got a line."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lines = 0
        self.size = 0
        self._handle: IO[bytes] = path.open("wb", _WRITE_BUFFER)

    def write(self, line: bytes) -> None:
        self._handle.write(line)
        self.lines += 1
        self.size += len(line)

    def close(self) -> None:
        self._handle.close()


class _BatchStore:
    """Files and batches of one simulator, in a temporary directory it owns."""

    def __init__(self, state: SimState) -> None:
        self._state = state
        self._directory: Path | None = None
        self.files: dict[str, _StoredFile] = {}
        self.batches: dict[str, _Batch] = {}  # in creation order
        self.queued_faults: deque[BatchFault] = deque()
        self._tasks: set[asyncio.Task[None]] = set()

    def new_path(self, name: str) -> Path:
        if self._directory is None or not self._directory.exists():
            self._directory = Path(tempfile.mkdtemp(prefix="llm-dispatch-sim-batch-"))
        return self._directory / name

    def add_file(self, *, path: Path, size: int, filename: str, purpose: str) -> _StoredFile:
        stored = _StoredFile(
            id=f"file-{secrets.token_hex(12)}", path=path, bytes=size, filename=filename, purpose=purpose,
            created_at=_now(),
        )
        self.files[stored.id] = stored
        return stored

    def start(self, coroutine: Any) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def reset(self) -> None:
        """Forget every file and batch (POST /_sim/reset); running batches stop where they are."""
        for task in self._tasks:
            task.cancel()
        self.files.clear()
        self.batches.clear()
        self.queued_faults.clear()
        directory, self._directory = self._directory, None
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)

    async def close(self, app: web.Application) -> None:
        tasks = list(self._tasks)
        self.reset()
        await asyncio.gather(*tasks, return_exceptions=True)


def _not_found_file(file_id: str) -> web.Response:
    return error_response(status=404, message=f"No such File object: {file_id}", param="id")


def _not_found_batch(batch_id: str) -> web.Response:
    return error_response(status=404, message=f"No batch found with id '{batch_id}'.", param="batch_id")


def _missing(param: str) -> web.Response:
    return invalid_request(f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter")


def _validation_error(code: str, message: str, *, line: int | None = None, param: str | None = None) -> dict[str, Any]:
    return {"code": code, "message": message, "param": param, "line": line}


class _BatchRoutes:
    def __init__(self, store: _BatchStore, state: SimState) -> None:
        self._store = store
        self._state = state
        # The chat routes' prompt cache is shared, so a batch line sees the same cached_tokens a chat call would.
        self._chat = _ChatRoutes(state)

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

    def _file(self, request: web.Request) -> _StoredFile | web.Response:
        denied = check_auth(request, self._state)
        if denied is not None:
            return denied
        file_id = request.match_info["file_id"]
        stored = self._store.files.get(file_id)
        return stored if stored is not None else _not_found_file(file_id)

    async def get_file(self, request: web.Request) -> web.Response:
        stored = self._file(request)
        return stored if isinstance(stored, web.Response) else json_response(stored.to_api())

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

    # --- batches -------------------------------------------------------------------------------

    async def create_batch(self, request: web.Request) -> web.Response:
        denied = check_auth(request, self._state)
        if denied is not None:
            return denied
        try:
            body = json.loads(await request.read())
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return invalid_request("The body must be a JSON object.", param=None, code=None)
        input_file_id = body.get("input_file_id")
        if not isinstance(input_file_id, str) or not input_file_id:
            return _missing("input_file_id")
        endpoint = body.get("endpoint")
        if endpoint is None:
            return _missing("endpoint")
        if endpoint != CHAT_COMPLETIONS_PATH:
            return invalid_request(
                f"Invalid value: '{endpoint}'. The simulator's Batch API supports '{CHAT_COMPLETIONS_PATH}' only.",
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
            await asyncio.sleep(_HANG_CREATE_SECONDS if fault.argument is None else fault.argument)
            return server_error_response(503)

        batch = _Batch(
            id=f"batch_{secrets.token_hex(16)}", input_file_id=input_file_id, input_path=stored.path,
            endpoint=endpoint, completion_window=window, metadata=dict(metadata) if metadata is not None else None,
            fault=fault, created_at=_now(),
        )
        self._store.batches[batch.id] = batch
        self._state.stats.batches += 1
        self._store.start(_BatchRun(batch=batch, store=self._store, state=self._state, chat=self._chat).run())
        return json_response(batch.to_api())

    def _batch(self, request: web.Request) -> _Batch | web.Response:
        denied = check_auth(request, self._state)
        if denied is not None:
            return denied
        batch_id = request.match_info["batch_id"]
        batch = self._store.batches.get(batch_id)
        return batch if batch is not None else _not_found_batch(batch_id)

    async def get_batch(self, request: web.Request) -> web.Response:
        batch = self._batch(request)
        return batch if isinstance(batch, web.Response) else json_response(batch.to_api())

    async def cancel_batch(self, request: web.Request) -> web.Response:
        batch = self._batch(request)
        if isinstance(batch, web.Response):
            return batch
        if batch.status in _TERMINAL:
            return error_response(status=409, message=f"Cannot cancel a batch with status '{batch.status}'.")
        if batch.status != "cancelling":  # a repeated cancel just reports the batch again
            batch.status = "cancelling"
            batch.cancelling_at = _now()
            batch.cancel_requested.set()
        return json_response(batch.to_api())

    async def list_batches(self, request: web.Request) -> web.Response:
        denied = check_auth(request, self._state)
        if denied is not None:
            return denied
        raw_limit = request.query.get("limit", str(_DEFAULT_LIST_LIMIT))
        try:
            limit = int(raw_limit)
        except ValueError:
            limit = 0
        if not 1 <= limit <= _MAX_LIST_LIMIT:
            return invalid_request(
                f"Invalid 'limit': expected an integer from 1 to {_MAX_LIST_LIMIT}, but got {raw_limit!r} instead.",
                param="limit", code="invalid_value")
        newest_first = list(reversed(self._store.batches.values()))
        start = 0
        after = request.query.get("after")
        if after:
            ids = [batch.id for batch in newest_first]
            # An unknown cursor (a batch forgotten by a reset) ends the listing rather than restarting it.
            start = ids.index(after) + 1 if after in ids else len(ids)
        page = newest_first[start : start + limit]
        return json_response({
            "object": "list",
            "data": [batch.to_api() for batch in page],
            "first_id": page[0].id if page else None,
            "last_id": page[-1].id if page else None,
            "has_more": start + limit < len(newest_first),
        })

    # --- faults --------------------------------------------------------------------------------

    async def get_faults(self, request: web.Request) -> web.Response:
        return json_response({"faults": [_fault_text(f) for f in self._store.queued_faults]})

    async def queue_faults(self, request: web.Request) -> web.Response:
        try:
            body = json.loads(await request.read())
        except ValueError:
            body = None
        faults = body.get("faults") if isinstance(body, dict) else None
        if not isinstance(faults, list):
            return invalid_request('Send {"faults": [...]} with a list of batch faults.', param=None, code=None)
        try:
            parsed = [parse_batch_fault(str(f)) for f in faults]
        except ValueError as exc:
            return invalid_request(str(exc), param="faults", code="invalid_value")
        self._store.queued_faults.extend(parsed)
        return json_response({"faults": [_fault_text(f) for f in self._store.queued_faults]})


def _fault_text(fault: BatchFault) -> str:
    return fault.name if fault.argument is None else f"{fault.name}:{fault.argument:g}"


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


class _Stop(Exception):
    """A cancel arrived: stop answering lines."""


class _BatchRun:
    """One batch from validating to its final status, in the simulator's event loop."""

    def __init__(self, *, batch: _Batch, store: _BatchStore, state: SimState, chat: _ChatRoutes,
                 limits: BatchLimits = OPENAI_BATCH_LIMITS) -> None:
        self._batch = batch
        self._store = store
        self._state = state
        self._chat = chat
        self._limits = limits
        # Read once: a config change applies to the next batch, not halfway through this one.
        self._seconds = state.config.batch_processing_seconds

    async def run(self) -> None:
        batch = self._batch
        try:
            await self._run()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # A simulator bug must not leave a batch in_progress forever, with a client polling it.
            logger.exception("simulated batch %s failed", batch.id)
            self._finish("failed", errors=[_validation_error("simulator_error", f"The simulator failed: {exc!r}")])
        finally:
            if batch.status in _TERMINAL:
                outcomes = self._state.stats.batch_outcomes
                outcomes[batch.status] = outcomes.get(batch.status, 0) + 1

    async def _run(self) -> None:
        batch = self._batch
        started = time.monotonic()
        try:
            handle = batch.input_path.open("rb")
        except FileNotFoundError:
            self._finish("failed", errors=[_validation_error(
                "file_not_found", f"The input file {batch.input_file_id} was deleted before the batch began.")])
            return
        with handle:
            errors, total = await self._validate(handle)
            await self._hold(started + self._seconds * _VALIDATING_SHARE)
            if batch.cancel_requested.is_set():
                await self._cancelled(None, None)
                return
            if batch.fault is not None and batch.fault.name == "fail_validation":
                errors = [_validation_error(
                    "simulated_validation_failure",
                    "This batch failed validation on purpose (simulator fault fail_validation).", line=1)]
            if errors:
                self._finish("failed", errors=errors)
                return
            batch.status = "in_progress"
            batch.in_progress_at = _now()
            batch.total = total
            handle.seek(0)
            stem = batch.id
            output = _Sink(self._store.new_path(f"{stem}-output.jsonl"))
            failures = _Sink(self._store.new_path(f"{stem}-errors.jsonl"))
            try:
                outcome = await self._answer_lines(handle, output=output, failures=failures)
            finally:
                output.close()
                failures.close()
        if outcome == "cancelled":
            await self._cancelled(output, failures)
            return
        if outcome == "expired":
            self._attach(output, failures)
            self._finish("expired")
            return
        batch.status = "finalizing"
        batch.finalizing_at = _now()
        hold = self._seconds * _FINALIZING_SHARE
        if batch.fault is not None and batch.fault.name == "slow_finalizing":
            hold = batch.fault.argument if batch.fault.argument is not None else self._seconds
        await self._hold(time.monotonic() + hold)
        if batch.cancel_requested.is_set():
            await self._cancelled(output, failures)
            return
        self._attach(output, failures)
        self._finish("completed")

    async def _validate(self, handle: IO[bytes]) -> tuple[list[dict[str, Any]], int]:
        """(errors, requests) for the input file, read line by line as OpenAI validates it."""
        errors: list[dict[str, Any]] = []
        seen: set[str] = set()
        model: str | None = None
        total = 0
        allowed = self._state.allowed_models

        def fail(code: str, message: str, line: int, param: str | None = None) -> None:
            errors.append(_validation_error(code, message, line=line, param=param))

        for number, raw in enumerate(handle, start=1):
            if number % _CHUNK_LINES == 0:
                await asyncio.sleep(0)
            if len(errors) >= _MAX_VALIDATION_ERRORS:
                break
            if not raw.strip():
                continue
            total += 1
            try:
                record = json.loads(raw)
            except ValueError:
                fail("invalid_json_line", "This line is not parseable as valid JSON.", number)
                continue
            if not isinstance(record, dict):
                fail("invalid_json_line", "This line is not a JSON object.", number)
                continue
            custom_id = record.get("custom_id")
            if not isinstance(custom_id, str) or not custom_id:
                fail("missing_required_parameter", "Missing required parameter: 'custom_id'.", number, "custom_id")
                continue
            if custom_id in seen:
                fail("duplicate_custom_id",
                     "The custom_id for this request is a duplicate of another request. "
                     "The custom_id parameter must be unique for each request in a batch.", number, "custom_id")
                continue
            seen.add(custom_id)
            if record.get("method") != "POST":
                fail("invalid_method", f"Only POST is supported, got {record.get('method')!r}.", number, "method")
                continue
            if record.get("url") != self._batch.endpoint:
                fail("invalid_url", f"The URL {record.get('url')!r} does not match the batch's endpoint "
                     f"'{self._batch.endpoint}'.", number, "url")
                continue
            body = record.get("body")
            line_model = body.get("model") if isinstance(body, dict) else None
            if not isinstance(line_model, str) or not line_model:
                fail("missing_required_parameter", "Missing required parameter: 'body.model'.", number, "body.model")
                continue
            if model is None:
                model = line_model
                if allowed is not None and model not in allowed:
                    fail("model_not_found", f"The model `{model}` does not exist or you do not have access to it.",
                         number, "body.model")
            elif line_model != model:
                fail("mismatched_model", f"The model '{line_model}' differs from '{model}' of the batch's other "
                     "requests; a batch may use one model only.", number, "body.model")
        if not errors:
            size = os.fstat(handle.fileno()).st_size  # the path may be gone: its file was deleted
            if total == 0:
                errors.append(_validation_error("empty_file", "The input file has no requests."))
            elif total > self._limits.max_requests:
                errors.append(_validation_error(
                    "too_many_requests",
                    f"The input file has {total} requests; a batch may hold at most {self._limits.max_requests}."))
            elif size > self._limits.max_bytes:
                errors.append(_validation_error(
                    "file_too_large", f"The input file is {size} bytes; a batch may be at most "
                    f"{self._limits.max_bytes}."))
        return errors, total

    async def _answer_lines(self, handle: IO[bytes], *, output: _Sink, failures: _Sink) -> str:
        """Answer lines in chunks, paced over the in_progress share; 'done', 'expired' or 'cancelled'."""
        batch = self._batch
        total = batch.total
        duration = self._seconds * (1.0 - _VALIDATING_SHARE - _FINALIZING_SHARE)
        expiring = batch.fault is not None and batch.fault.name == "expire"
        stop_after = total
        if expiring:
            assert batch.fault is not None
            fraction = batch.fault.argument if batch.fault.argument is not None else _DEFAULT_EXPIRE_FRACTION
            stop_after = math.floor(total * fraction)
        chunk = max(1, min(_CHUNK_LINES, total // _MIN_PROGRESS_STEPS))
        started = time.monotonic()
        answered = 0
        lines = _records(handle)
        for record in lines:
            if answered >= stop_after:
                await self._expire_rest(record, lines, failures)
                return "expired"
            ok, line = self._answer(record)
            (output if ok else failures).write(line)
            if ok:
                batch.completed += 1
            else:
                batch.failed += 1
            self._state.stats.batch_lines += 1
            answered += 1
            if answered % chunk == 0:
                await self._hold(started + duration * answered / total)
                if batch.cancel_requested.is_set():
                    return "cancelled"
        if expiring:  # expire:1 answers every line and still expires
            return "expired"
        await self._hold(started + duration)
        return "cancelled" if batch.cancel_requested.is_set() else "done"

    async def _expire_rest(self, first: dict[str, Any], rest: Iterator[dict[str, Any]], failures: _Sink) -> None:
        error = {"code": "batch_expired",
                 "message": "This request could not be executed before the completion window expired."}
        failures.write(_error_line(first["custom_id"], error))
        for number, record in enumerate(rest, start=1):
            failures.write(_error_line(record["custom_id"], error))
            if number % _CHUNK_LINES == 0:
                await asyncio.sleep(0)

    def _answer(self, record: dict[str, Any]) -> tuple[bool, bytes]:
        """(success, output line) for one input record: exactly what the chat endpoint answers for its body."""
        state = self._state
        custom_id: str = record["custom_id"]
        body = record["body"]
        try:
            raw = _body_bytes(body).encode()
        except ValueError:  # NaN or Infinity: Python's JSON reader takes them, OpenAI's does not
            refused = invalid_request("The body contains a number JSON cannot hold (NaN or Infinity).",
                                      param="body", code="invalid_value")
            return False, self._response_line(custom_id, refused.status, refused.body)
        digest_bytes = hashlib.blake2b(raw, digest_size=8, key=state.seed_key).digest()
        if _MARKER_BYTES in raw:
            forced = self._marker_fault(body, digest_bytes)
            if forced == LINE_ERROR_MARKER:
                return False, _error_line(custom_id, {
                    "code": "simulated_line_error",
                    "message": "This request failed inside the batch (simulator marker [[sim:line_error]])."})
            if isinstance(forced, web.Response):
                return False, self._response_line(custom_id, forced.status, forced.body)
            if forced is not None:
                refused = _fault_response(forced, model=str(body.get("model")))
                return False, self._response_line(custom_id, refused.status, refused.body)
        invalid = validate_chat_body(body)
        if invalid is None and state.allowed_models is not None and body["model"] not in state.allowed_models:
            invalid = model_not_found(body["model"])
        if invalid is not None:
            return False, self._response_line(custom_id, invalid.status, invalid.body)
        return True, self._response_line(custom_id, 200, self._completion(body, digest_bytes))

    def _completion(self, body: dict[str, Any], digest_bytes: bytes) -> bytes:
        # The success path of _chat, minus latency, quotas and random faults, which a batch does not meet.
        state = self._state
        model: str = body["model"]
        messages: list[dict[str, Any]] = body["messages"]
        counts = message_token_counts(messages)
        prompt_tokens = sum(counts) + REPLY_PRIMING_TOKENS
        cap = body.get("max_completion_tokens") or body.get("max_tokens")
        choices = _plan_choices(int.from_bytes(digest_bytes, "little"), cap=cap, n=body.get("n") or 1)
        completion_tokens = sum(tokens for _, tokens, _ in choices)
        cached = self._chat._cached_tokens(model=model, messages=messages, counts=counts)
        return completion_body(
            response_id=state.next_response_id(),
            created=_now(),
            model=model,
            choices=[
                (completion_text(digest=choice_digest, tokens=tokens, stop=reason == "stop"), reason)
                for choice_digest, tokens, reason in choices
            ],
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cached_tokens=cached,
            system_fingerprint=_SYSTEM_FINGERPRINT,
        )

    def _marker_fault(self, body: dict[str, Any], digest: bytes) -> str | web.Response | None:
        return marker_fault(body.get("messages"), digest=digest, hits=self._state.marker_hits, pattern=_LINE_MARKER,
                            allowed=FAULTS | {LINE_ERROR_MARKER}, where="in a batch ")

    def _response_line(self, custom_id: str, status: int, body: Any) -> bytes:
        state = self._state
        return b"".join((
            b'{"id":"batch_req_', secrets.token_hex(16).encode(), b'","custom_id":', _dumps(custom_id).encode(),
            b',"response":{"status_code":', str(status).encode(), b',"request_id":"req_sim',
            f"{state.boot_id}{next(state.request_ids):x}".encode(), b'","body":', bytes(body),
            b'},"error":null}\n',
        ))

    def _attach(self, output: _Sink | None, failures: _Sink | None) -> None:
        """Make the written files downloadable; an empty one gets no id, as OpenAI leaves it null."""
        batch = self._batch
        for sink, kind in ((output, "output"), (failures, "error")):
            if sink is None:
                continue
            if sink.lines == 0:
                sink.path.unlink(missing_ok=True)
                continue
            stored = self._store.add_file(
                path=sink.path, size=sink.size, filename=f"{batch.id}_{kind}.jsonl", purpose="batch_output"
            )
            if kind == "output":
                batch.output_file_id = stored.id
            else:
                batch.error_file_id = stored.id

    async def _cancelled(self, output: _Sink | None, failures: _Sink | None) -> None:
        # "cancelling" is visible for a moment, as it is (for much longer) at OpenAI.
        await asyncio.sleep(self._seconds * _FINALIZING_SHARE)
        self._attach(output, failures)
        self._finish("cancelled")

    def _finish(self, status: str, *, errors: list[dict[str, Any]] | None = None) -> None:
        batch = self._batch
        batch.status = status
        setattr(batch, f"{status}_at", _now())
        if errors:
            batch.errors = errors

    async def _hold(self, until: float) -> None:
        """Wait until ``until`` (monotonic) or a cancel, whichever is first; always yields once."""
        delay = until - time.monotonic()
        if delay <= 0:
            await asyncio.sleep(0)
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay):
                await self._batch.cancel_requested.wait()


def _records(handle: IO[bytes]) -> Iterator[dict[str, Any]]:
    # Already validated, so every non-blank line is a well-formed record.
    for raw in handle:
        if raw.strip():
            yield json.loads(raw)


def _error_line(custom_id: str, error: dict[str, str]) -> bytes:
    line = {"id": f"batch_req_{secrets.token_hex(16)}", "custom_id": custom_id, "response": None, "error": error}
    return _dumps(line).encode() + b"\n"


def _fault_response(fault: str, *, model: str) -> web.Response:
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
    if fault == "503":
        return server_error_response(503)
    return server_error_response(500)
