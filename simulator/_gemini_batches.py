"""The simulator's Gemini Batch Mode and Files API (``v1beta``), batches kept in memory, files on disk.

    POST /v1beta/models/{model}:batchGenerateContent   {"batch": {"displayName", "inputConfig": {"requests":
                                        {"requests": [{"request", "metadata"}]}} | {"fileName"}}} -> an operation
    GET  /v1beta/batches/{id}           the operation; its metadata the GenerateContentBatch (state, batchStats,
                                        and once succeeded its output: inlinedResponses, or responsesFile)
    POST /v1beta/batches/{id}:cancel    {} ; the batch ends BATCH_STATE_CANCELLED, the unanswered as CANCELLED
    GET  /v1beta/batches?pageSize=&pageToken=   newest first, {"operations", "nextPageToken"}
    POST /upload/v1beta/files           the resumable protocol: a ``start`` answers X-Goog-Upload-URL, the bytes go
                                        there (``upload``, ``upload, finalize``) at their X-Goog-Upload-Offset
    GET  /download/v1beta/files/{id}:download?alt=media   a responses file's bytes

Each request is answered as ``generateContent`` answers it (``_gemini``, a ``cachedContent`` too), without latency,
quotas or random faults; a line of an input file is ``{"key", "request"}``, a responses line ``{"key", "response"}`` or
``{"key", "error"}`` (a google.rpc.Status: ``[[sim:400]]`` INVALID_ARGUMENT, ``[[sim:429]]`` RESOURCE_EXHAUSTED,
``[[sim:500]]`` INTERNAL, ``[[sim:503]]`` UNAVAILABLE; ``line_cancelled`` CANCELLED, ``line_timeout`` and
``line_expired`` DEADLINE_EXCEEDED). A batch is pending for a tenth of ``batch_processing_seconds``, then running.

The ``/_sim/batch_faults`` queue (shared with the other providers' batches) applies: ``expire[:FRACTION]`` answers
that fraction, then ends BATCH_STATE_EXPIRED with no output; ``fail_validation`` refuses the create with a 400;
``hang_create[:SECONDS]`` holds it, then answers 503 creating nothing; ``create_lost_hang[:SECONDS]``,
``create_lost_drop`` and ``create_lost_502`` create the batch and lose the answer; ``unreachable[:COUNT]`` answers
the batch's first COUNT gets and cancels with a 503; ``slow_finalizing[:SECONDS]`` keeps it running that long after
its last answer; ``hang_upload[:SECONDS]`` (when it heads the queue at an upload's start) holds that upload's last
chunk, then answers 503 with no file made.
"""

from __future__ import annotations

import asyncio
import json
import math
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from ._anthropic_http import rfc3339
from ._batch_faults import CREATE_ANSWER_FAULTS, DEFAULT_EXPIRE_FRACTION, HANG_CREATE_SECONDS, LINE_FAULTS, \
    LINE_MARKER, BatchFault, lose_create_answer
from ._batch_store import BatchStore, BatchWork, Sink, batch_store
from ._completions import body_digest, canonical_json
from ._config import ANSWER_KINDS
from ._gemini import GEMINI_PATH, CacheRefused, as_chat, body_problem, gemini_error, plan_content, render_content, target
from ._gemini_embeddings import batch_embed_answer, batch_embed_problem, models_handler
from ._http import json_dumps, json_response
from ._markers import MARKER_BYTES, marker_fault
from ._pacing import answer_paced, hold
from ._state import SimState

__all__ = ["GeminiBatch", "GeminiBatchRoutes", "register"]

_LIST_MAX = 1000
# A marker's google.rpc status: (code, name, message).
_LINE_STATUS = {"400": (3, "INVALID_ARGUMENT"), "401": (16, "UNAUTHENTICATED"), "403": (7, "PERMISSION_DENIED"),
                "404": (5, "NOT_FOUND"), "429": (8, "RESOURCE_EXHAUSTED"), "insufficient_quota": (8, "RESOURCE_EXHAUSTED"),
                "503": (14, "UNAVAILABLE"), "529": (14, "UNAVAILABLE"), "504": (4, "DEADLINE_EXCEEDED"),
                "line_timeout": (4, "DEADLINE_EXCEEDED"), "line_expired": (4, "DEADLINE_EXCEEDED"),
                "line_cancelled": (1, "CANCELLED")}
_INTERNAL = (13, "INTERNAL")


@dataclass(slots=True, kw_only=True)
class GeminiBatch:
    name: str
    display_name: str
    model: str
    requests: list[tuple[str | None, dict[str, Any]]]  # (key, request)
    inline: bool
    input_file: str | None
    fault: BatchFault | None
    created_at: float
    state: str = "BATCH_STATE_PENDING"
    succeeded: int = 0
    failed: int = 0
    ended_at: float | None = None
    updated_at: float = 0.0
    responses: list[bytes] = field(default_factory=list)  # inline: each response's JSON
    responses_file: str | None = None
    cancel_requested: asyncio.Event = field(default_factory=asyncio.Event)
    embed: bool = False  # an asyncBatchEmbedContent batch (an EmbedContentBatch): EmbedContentRequests

    def to_api(self) -> dict[str, Any]:
        """The operation, as ``GET batches/{id}`` answers it."""
        total = len(self.requests)
        batch: dict[str, Any] = {
            "@type": "type.googleapis.com/google.ai.generativelanguage.v1beta."
                     + ("EmbedContentBatch" if self.embed else "GenerateContentBatch"),
            "model": f"models/{self.model}", "displayName": self.display_name, "name": self.name,
            "createTime": rfc3339(self.created_at), "updateTime": rfc3339(self.updated_at or self.created_at),
            "batchStats": {"requestCount": str(total), "successfulRequestCount": str(self.succeeded),
                           "failedRequestCount": str(self.failed),
                           "pendingRequestCount": str(total - self.succeeded - self.failed)},
            "state": self.state,
            "inputConfig": {"fileName": self.input_file} if self.input_file else {"requests": {}},
        }
        if self.ended_at is not None:
            batch["endTime"] = rfc3339(self.ended_at)
        if self.state == "BATCH_STATE_SUCCEEDED" or (self.ended_at is not None and self.responses_file):
            batch["output"] = self._output()
        operation: dict[str, Any] = {"name": self.name, "metadata": batch}
        if self.ended_at is not None:
            operation["done"] = True
        return operation

    def _output(self) -> dict[str, Any]:
        if self.responses_file is not None:
            return {"responsesFile": self.responses_file}
        inlined = {"inlinedResponses": [json.loads(item) for item in self.responses]}
        return {"inlinedEmbedContentResponses" if self.embed else "inlinedResponses": inlined}


def register(app: web.Application, state: SimState) -> None:
    """Add ``POST /v1beta/models/{target}`` (``:generateContent`` answered by ``_gemini``, ``:batchGenerateContent``
    here), and the batches, upload and download routes (404 with ``batch_api`` off, as at a server with none)."""
    routes = GeminiBatchRoutes(batch_store(app, state), state)
    state.reset_hooks.append(routes.clear)
    realtime = models_handler(state)

    async def models(request: web.Request) -> web.StreamResponse:
        model, method = target(request)
        if method in ("batchGenerateContent", "asyncBatchEmbedContent") and model and state.config.batch_api:
            return await routes.create(request, model=model, embed=method == "asyncBatchEmbedContent")
        return await realtime(request)

    app.router.add_post(GEMINI_PATH, models)
    app.middlewares.append(_no_batch_api(state))
    app.router.add_get("/v1beta/batches", routes.list)
    app.router.add_get("/v1beta/batches/{batch}", routes.retrieve)
    app.router.add_post("/v1beta/batches/{batch}", routes.cancel)  # {id}:cancel
    app.router.add_post("/upload/v1beta/files", routes.upload)
    app.router.add_get("/download/v1beta/files/{file}", routes.download)


def _no_batch_api(state: SimState) -> Any:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not state.config.batch_api and request.path.startswith(_BATCH_PREFIXES):
            return gemini_error(404, f"Method not found: {request.method} {request.path}")
        return await handler(request)

    return middleware


_BATCH_PREFIXES = ("/v1beta/batches", "/upload/v1beta/files", "/download/v1beta/files")


@dataclass(slots=True)
class _Upload:
    path: Path
    size: int
    received: int = 0
    hang: float | None = None  # a ``hang_upload`` fault: seconds its last chunk is held


class GeminiBatchRoutes:
    def __init__(self, store: BatchStore, state: SimState) -> None:
        self._store = store
        self._state = state
        self.batches: dict[str, GeminiBatch] = {}  # in creation order
        self.files: dict[str, Path] = {}  # "files/abc" -> its bytes
        self._uploads: dict[str, _Upload] = {}

    def clear(self) -> None:
        self.batches.clear()
        self.files.clear()
        self._uploads.clear()

    def _refused(self, request: web.Request) -> web.Response | None:
        expected = self._state.config.api_key
        if expected is None:
            return None
        given = request.headers.get("x-goog-api-key")
        if given is None:
            return gemini_error(403, "Method doesn't allow unregistered callers (callers without established "
                                     "identity). Please use API Key or other form of API consumer identity.")
        if given != expected:
            return gemini_error(400, "API key not valid. Please pass a valid API key.", details=[
                {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "API_KEY_INVALID"}])
        return None

    # --- files ----------------------------------------------------------------------------------

    async def upload(self, request: web.Request) -> web.Response:
        refused = self._refused(request)
        if refused is not None:
            return refused
        upload_id = request.query.get("upload_id")
        if upload_id is None:
            return await self._start(request)
        upload = self._uploads.get(upload_id)
        if upload is None:
            return gemini_error(404, f"No upload session {upload_id!r}.")
        command = {part.strip() for part in request.headers.get("X-Goog-Upload-Command", "").split(",")}
        offset = request.headers.get("X-Goog-Upload-Offset")
        chunk = await request.read()
        if "finalize" in command and upload.hang is not None:
            await asyncio.sleep(upload.hang)  # the client gives up (or dies) with no file
            return gemini_error(503)
        if "upload" not in command or offset is None or not offset.isdigit() or int(offset) > upload.received:
            return gemini_error(400, f"Bad upload command {sorted(command)} at offset {offset!r} "
                                     f"(received {upload.received}).")
        # A chunk sent again (its answer lost) is written again at its offset.
        with upload.path.open("r+b") as handle:
            handle.seek(int(offset))
            handle.write(chunk)
            handle.truncate()
        upload.received = int(offset) + len(chunk)
        if "finalize" not in command:
            return web.Response(status=200, headers={"X-Goog-Upload-Status": "active"})
        if upload.received != upload.size:
            return gemini_error(400, f"The upload holds {upload.received} bytes, not the {upload.size} announced.")
        del self._uploads[upload_id]
        name = f"files/{secrets.token_hex(8)}"
        self.files[name] = upload.path
        file = {"name": name, "mimeType": "jsonl", "sizeBytes": str(upload.size), "state": "ACTIVE",
                "createTime": rfc3339(time.time())}
        return json_response({"file": file}, headers={"X-Goog-Upload-Status": "final"})

    async def _start(self, request: web.Request) -> web.Response:
        headers = request.headers
        if headers.get("X-Goog-Upload-Protocol") != "resumable" or headers.get("X-Goog-Upload-Command") != "start":
            return gemini_error(400, "Uploads take the resumable protocol: X-Goog-Upload-Protocol resumable, "
                                     "X-Goog-Upload-Command start.")
        size = headers.get("X-Goog-Upload-Header-Content-Length", "")
        if not size.isdigit():
            return gemini_error(400, "X-Goog-Upload-Header-Content-Length is required.")
        try:
            body = json.loads(await request.read() or b"{}")
        except ValueError:
            return gemini_error(400, "Invalid JSON payload received.")
        if not isinstance(body, dict) or not isinstance(body.get("file", {}), dict):
            return gemini_error(400, "Invalid JSON payload received. Expected {\"file\": {...}}.")
        upload_id = secrets.token_hex(12)
        path = self._store.new_path(f"gemini-upload-{upload_id}.jsonl")
        path.write_bytes(b"")
        queued = self._store.queued_faults
        hang = None
        if queued and queued[0].name == "hang_upload":
            fault = queued.popleft()
            hang = HANG_CREATE_SECONDS if fault.argument is None else fault.argument
        self._uploads[upload_id] = _Upload(path=path, size=int(size), hang=hang)
        self._state.stats.gemini_uploads += 1
        url = f"{request.url.origin()}/upload/v1beta/files?upload_id={upload_id}&upload_protocol=resumable"
        return web.Response(status=200, headers={"X-Goog-Upload-URL": url, "X-Goog-Upload-Status": "active"})

    async def download(self, request: web.Request) -> web.StreamResponse:
        refused = self._refused(request)
        if refused is not None:
            return refused
        target = request.match_info["file"]
        own, _, method = target.rpartition(":")
        path = self.files.get(f"files/{own}")
        if method != "download" or path is None or request.query.get("alt") != "media":
            return gemini_error(404, f"File files/{own} not found.")
        return web.FileResponse(path, headers={"Content-Type": "application/octet-stream"})

    # --- batches --------------------------------------------------------------------------------

    async def create(self, request: web.Request, *, model: str, embed: bool = False) -> web.Response:
        refused = self._refused(request)
        if refused is not None:
            return refused
        try:
            body = json.loads(await request.read())
        except ValueError:
            return gemini_error(400, "Invalid JSON payload received.")
        parsed = self._parse(body, model=model)
        if isinstance(parsed, web.Response):
            return parsed
        display, requests, input_file = parsed
        store = self._store
        fault = store.queued_faults.popleft() if store.queued_faults else None
        if fault is not None and fault.name == "hang_create":
            await asyncio.sleep(HANG_CREATE_SECONDS if fault.argument is None else fault.argument)
            return gemini_error(503)
        if fault is not None and fault.name == "fail_validation":
            return gemini_error(400, "This batch failed validation on purpose (simulator fault fail_validation).")
        lose = fault if fault is not None and fault.name in CREATE_ANSWER_FAULTS else None
        batch = GeminiBatch(name=f"batches/sim{secrets.token_hex(10)}", display_name=display, model=model,
                            requests=requests, inline=input_file is None, input_file=input_file,
                            fault=None if lose else fault, created_at=time.time(), embed=embed)
        self.batches[batch.name] = batch
        if fault is not None and fault.name == "unreachable":
            store.make_trouble(batch.name, 503, times=int(fault.argument or 1))
        self._state.stats.gemini_batches += 1
        store.start(_GeminiBatchRun(batch=batch, routes=self, store=store, state=self._state).run())
        if lose is not None:
            return await lose_create_answer(request, lose, answer=lambda: json_response(batch.to_api()),
                                            bad_gateway=gemini_error(502, "Bad Gateway", word="UNAVAILABLE"))
        return json_response(batch.to_api())

    def _parse(self, body: Any, *, model: str) -> tuple[str, list[tuple[str | None, dict[str, Any]]], str | None] \
            | web.Response:
        batch = body.get("batch") if isinstance(body, dict) else None
        if not isinstance(batch, dict):
            return gemini_error(400, "* BatchGenerateContentRequest.batch: batch is required.")
        display = batch.get("displayName")
        if not isinstance(display, str) or not display:
            return gemini_error(400, "* GenerateContentBatch.display_name: display_name is required.")
        config = batch.get("inputConfig")
        if not isinstance(config, dict) or ("requests" in config) == ("fileName" in config):
            return gemini_error(400, "* GenerateContentBatch.input_config: exactly one of requests or file_name.")
        requests: list[tuple[str | None, dict[str, Any]]] = []
        if "fileName" in config:
            path = self.files.get(str(config["fileName"]))
            if path is None:
                return gemini_error(404, f"File {config['fileName']} not found.")
            with path.open("rb") as handle:
                for number, raw in enumerate(handle, start=1):
                    if not raw.strip():
                        continue
                    try:
                        line = json.loads(raw)
                    except ValueError:
                        return gemini_error(400, f"Line {number} of {config['fileName']} is not JSON.")
                    if not isinstance(line, dict) or not isinstance(line.get("request"), dict):
                        return gemini_error(400, f"Line {number} of {config['fileName']} has no request object.")
                    requests.append((line.get("key") if isinstance(line.get("key"), str) else None, line["request"]))
            return display, requests, str(config["fileName"])
        inner = config["requests"].get("requests") if isinstance(config["requests"], dict) else None
        if not isinstance(inner, list) or not inner:
            return gemini_error(400, "* InlinedRequests.requests: requests must not be empty.")
        for index, item in enumerate(inner):
            if not isinstance(item, dict) or not isinstance(item.get("request"), dict):
                return gemini_error(400, f"* inlinedRequests.requests[{index}].request: request is required.")
            metadata = item.get("metadata")
            key = metadata.get("key") if isinstance(metadata, dict) else None
            requests.append((key if isinstance(key, str) else None, item["request"]))
        return display, requests, None

    def _batch(self, request: web.Request) -> tuple[GeminiBatch, str] | web.Response:
        refused = self._refused(request)
        if refused is not None:
            return refused
        own, _, method = request.match_info["batch"].partition(":")
        name = f"batches/{own}"
        if self._store.trouble(name) is not None:
            return gemini_error(503)
        batch = self.batches.get(name)
        return (batch, method) if batch is not None else gemini_error(404, f"Batch {name} not found.")

    async def retrieve(self, request: web.Request) -> web.Response:
        found = self._batch(request)
        if isinstance(found, web.Response):
            return found
        batch, method = found
        return json_response(batch.to_api()) if not method else gemini_error(404, f"Method {method} not found.")

    async def cancel(self, request: web.Request) -> web.Response:
        found = self._batch(request)
        if isinstance(found, web.Response):
            return found
        batch, method = found
        if method != "cancel":
            return gemini_error(404, f"Method {method or 'POST'} not found.")
        if batch.ended_at is None:
            batch.cancel_requested.set()
        return json_response({})

    async def list(self, request: web.Request) -> web.Response:
        refused = self._refused(request)
        if refused is not None:
            return refused
        raw = request.query.get("pageSize", "50")
        if not raw.isdigit() or not 1 <= int(raw) <= _LIST_MAX:
            return gemini_error(400, f"pageSize must be from 1 to {_LIST_MAX}, got {raw!r}.")
        size = int(raw)
        newest = list(reversed(self.batches.values()))
        start = int(request.query["pageToken"]) if request.query.get("pageToken", "").isdigit() else 0
        page = newest[start:start + size]
        answer: dict[str, Any] = {"operations": [batch.to_api() for batch in page]}
        if start + size < len(newest):
            answer["nextPageToken"] = str(start + size)
        return json_response(answer)


class _GeminiBatchRun(BatchWork):
    """One batch from pending to its end, each request answered as ``generateContent`` answers it."""

    def __init__(self, *, batch: GeminiBatch, routes: GeminiBatchRoutes, store: BatchStore, state: SimState) -> None:
        super().__init__(store=store, state=state)
        self._batch = batch
        self._routes = routes

    async def run(self) -> None:
        batch = self._batch
        sink = None if batch.inline else Sink(self._store.new_path(f"{batch.name.split('/')[-1]}-responses.jsonl"))
        try:
            await hold(time.monotonic() + self._seconds * 0.1, cancel=batch.cancel_requested)
            batch.state = "BATCH_STATE_RUNNING"
            batch.updated_at = time.time()
            await self._answer_all(sink)
        finally:
            if sink is not None:
                sink.close()
                if batch.state != "BATCH_STATE_EXPIRED":
                    name = f"files/{batch.name.split('/')[-1]}-responses"
                    self._routes.files[name] = sink.path
                    batch.responses_file = name
            batch.ended_at = batch.updated_at = time.time()

    async def _answer_all(self, sink: Sink | None) -> None:
        batch = self._batch
        total = len(batch.requests)
        stop_after = None
        if batch.fault is not None and batch.fault.name == "expire":
            fraction = batch.fault.argument if batch.fault.argument is not None else DEFAULT_EXPIRE_FRACTION
            stop_after = math.floor(total * fraction)

        def answer(item: tuple[str | None, dict[str, Any]] | None) -> None:
            assert item is not None
            key, request = item
            ok, response = self._answer(request)
            self._write(key, response, ok=ok, sink=sink)

        pending = iter(batch.requests)
        outcome, first = await answer_paced(pending, total=total, duration=self._seconds * 0.9, stop_after=stop_after,
                                            cancel=batch.cancel_requested, answer=answer)
        if outcome == "expired":
            batch.state = "BATCH_STATE_EXPIRED"
            return
        if outcome == "cancelled":
            for key, _ in pending:
                self._write(key, {"error": {"code": 1, "message": "The batch was cancelled.", "status": "CANCELLED"}},
                            ok=False, sink=sink)
            batch.state = "BATCH_STATE_CANCELLED"
            return
        if batch.fault is not None and batch.fault.name == "slow_finalizing":
            seconds = batch.fault.argument if batch.fault.argument is not None else self._seconds
            await hold(time.monotonic() + seconds, cancel=batch.cancel_requested)
        batch.state = "BATCH_STATE_SUCCEEDED"

    def _write(self, key: str | None, response: dict[str, Any], *, ok: bool, sink: Sink | None) -> None:
        batch = self._batch
        if ok:
            batch.succeeded += 1
        else:
            batch.failed += 1
        self._state.stats.gemini_batch_lines += 1
        if sink is not None:
            sink.write(json_dumps({"key": key, **response} if key is not None else response).encode() + b"\n")
        else:
            batch.responses.append(json_dumps({**response, "metadata": {"key": key}} if key is not None
                                              else response).encode())

    def _answer(self, request: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
        """(answered, the response or error) as generateContent answers ``request``."""
        state = self._state
        model = self._batch.model
        if self._batch.embed:
            return self._embed(request)
        problem = body_problem(request, model=model)
        if problem is not None:
            return False, {"error": {"code": 3, "message": problem, "status": "INVALID_ARGUMENT"}}
        if state.allowed_models is not None and model not in state.allowed_models:
            return False, {"error": {"code": 5, "message": f"models/{model} is not found.", "status": "NOT_FOUND"}}
        digest = body_digest(canonical_json(request).encode(), state=state)
        kind = None
        turns = as_chat(request, model=model)["messages"]
        if MARKER_BYTES in json_dumps(turns).encode():
            forced = marker_fault(turns, digest=digest, hits=state.marker_hits, pattern=LINE_MARKER,
                                  allowed=LINE_FAULTS, where="in a batch ", refuse=lambda text: text)
            if forced is not None and forced not in LINE_FAULTS:
                return False, {"error": {"code": 3, "message": str(forced), "status": "INVALID_ARGUMENT"}}
            if forced in ANSWER_KINDS:
                kind = forced
            elif forced is not None:
                code, name = _LINE_STATUS.get(str(forced), _INTERNAL)
                return False, {"error": {"code": code, "message": f"Simulated {name} (simulator fault {forced}).",
                                         "status": name}}
        try:
            plan = plan_content(request, model=model, digest=digest, kind=kind,
                                invalid_json_rate=state.config.invalid_json_rate, state=state)
        except CacheRefused as refused:
            return False, refused.line_error()
        rendered = json.loads(render_content(plan, state=state, model=model))
        state.stats.prompt_tokens += plan.completion.prompt_tokens
        state.stats.completion_tokens += plan.output_tokens
        return "error" not in rendered, {"response": rendered} if "error" not in rendered else {
            "error": {"code": 13, "message": rendered["error"].get("message", ""), "status": "INTERNAL"}}

    def _embed(self, request: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
        """(answered, the SingleEmbedContentResponse or error) for one EmbedContentRequest (no ``model``: the batch
        names it), its vector the real-time route's for the same text."""
        model = self._batch.model
        if "model" in request:
            return False, {"error": {"code": 3, "message": 'Invalid JSON payload received. Unknown name "model".',
                                     "status": "INVALID_ARGUMENT"}}
        body = {"requests": [{"model": f"models/{model}", **request}]}
        problem = batch_embed_problem(body, model=model)
        if problem is not None:
            return False, {"error": {"code": 3, "message": problem, "status": "INVALID_ARGUMENT"}}
        answer, tokens = batch_embed_answer(body, model=model)
        self._state.stats.prompt_tokens += tokens
        return True, {"response": {"embedding": answer["embeddings"][0], "tokenCount": str(tokens)}}
