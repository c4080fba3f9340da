"""Gemini's Batch Mode (the Gemini Developer API, ``v1beta``) as a batch backend: the requests inlined in the create
while the batch stays under 20 MB, else a JSONL file uploaded through the Files API; the answers inlined in the
batch, or a responses file downloaded through the Files API.

The wire is the REST reference's (ai.google.dev/api/batch-mode, ai.google.dev/api/files) as google-genai sends it:

    POST /v1beta/models/{model}:batchGenerateContent
         {"batch": {"displayName", "inputConfig": {"requests": {"requests": [{"request", "metadata": {"key"}}]}}}}
         or   {"batch": {"displayName", "inputConfig": {"fileName": "files/..."}}}       -> an operation
    GET  /v1beta/batches/{id}            the operation: metadata is the batch (state, batchStats, output)
    POST /v1beta/batches/{id}:cancel     (an empty answer: the batch is read again after it)
    GET  /v1beta/batches?pageSize=&pageToken=   {"operations", "nextPageToken"}
    POST /upload/v1beta/files            the resumable protocol (``_api_client.upload_file``): a start with
         X-Goog-Upload-Protocol resumable and the file's size and type answers X-Goog-Upload-URL; the bytes go there in
         chunks of 8 MiB, each with its X-Goog-Upload-Offset, the last with the command "upload, finalize"
    GET  /download/v1beta/{file}:download?alt=media   a responses file's bytes

Each input line of the file is ``{"key": <member id>, "request": <generateContent body>}``; an inlined request carries
the member id as ``metadata.key``, which its response carries back. Every call takes the client's one send path.

A batch of embeddings lines (a batch file holds one endpoint's) goes to ``POST /v1beta/models/{model}:
asyncBatchEmbedContent`` in the same envelope, each request an EmbedContentRequest without its model
(``{"content": {"parts": [{"text"}]}, "taskType"?, "title"?, "outputDimensionality"?}``), as google-genai's
``batches.create_embeddings`` sends it (``_EmbeddingsBatchJobSource_to_mldev``, ``_EmbedContentBatch_to_mldev``). An
EmbedContentRequest embeds one text, so Gemini's batch lines are never packed (``GEMINI_BATCH_LIMITS``).

Finding a create whose answer was lost: a batch's ``displayName`` names our job and batch
(``llm-dispatch:<job>:<batch>``); the list is read back to the record's creation (less ``CLOCK_SLACK``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Final
from urllib.parse import parse_qsl, urlsplit

import httpx

from ._batch_api import CLOCK_SLACK, Adopted, BatchApi, BatchRef, FindLost, ResultFile
from ._gemini_batch_results import INLINED_RESPONSES, gemini_batch_info, inlined_lines, read_gemini_batch_results
from .._batch_types import BATCH_CHAT_ENDPOINT, GEMINI_BATCH_LIMITS, BatchInfo, BatchLimits
from .._endpoints import BATCH_URLS
from .._exceptions import APIResponseValidationError
from .._json import compact_json
from .._types import ChatRequest
from ..wire._gemini_embeddings import gemini_embed_request
from ..wire._requests import path_segment
from ..wire._responses import parse_json

if TYPE_CHECKING:
    from ..http._client import LLMClient

__all__ = ["GEMINI_BATCHES_PATH", "GEMINI_UPLOAD_PATH", "INLINE_MAX_BYTES", "UPLOAD_CHUNK", "GeminiBatchApi",
           "gemini_display_name"]

GEMINI_BATCHES_PATH: Final = "/v1beta/batches"
GEMINI_UPLOAD_PATH: Final = "/upload/v1beta/files"
_CREATE_PATH: Final = "/v1beta/models/{model}:batchGenerateContent"
_EMBED_CREATE_PATH: Final = "/v1beta/models/{model}:asyncBatchEmbedContent"
# Inline requests suit "smaller batches that keep the total request size under 20MB" (Google's Batch API guide,
# ai.google.dev/gemini-api/docs/batch-api): the create's whole body is measured, envelope included.
INLINE_MAX_BYTES: Final = 20 * 1024 * 1024
# google-genai's ``_api_client.CHUNK_SIZE``: the bytes of one request of a resumable upload.
UPLOAD_CHUNK: Final = 8 * 1024 * 1024
# The type Google's Batch API guide gives its JSONL input (``UploadFileConfig(mime_type='jsonl')``, as quoted in
# discuss.ai.google.dev/t/95102; the guide's own page was not in the index past its start).
JSONL_MIME_TYPE: Final = "jsonl"
_DISPLAY_PREFIX: Final = "llm-dispatch"
_LIST_PAGE: Final = 100


def gemini_display_name(*, job_id: str, batch_id: int) -> str:
    """The displayName a batch of ours carries: how a create whose answer was lost is found again."""
    return f"{_DISPLAY_PREFIX}:{job_id}:{batch_id}"


# An inlined request's bytes beyond its file line (``{"request":R,"metadata":{"key":K}},`` against
# ``{"key":K,"request":R}\n``), with a margin; and room for the create's display name.
_INLINE_ITEM_EXTRA = 16
_DISPLAY_NAME_ROOM = 256


# The most pages of the batch list a look for a lost create reads (100 batches a page).
_LIST_MAX_PAGES = 200


class GeminiBatchApi(BatchApi):
    """Gemini's Batch Mode and Files API, for a client of the ``gemini`` wire. ``uploads``: a batch over
    ``INLINE_MAX_BYTES`` is uploaded (``upload`` answers None for one that goes inline)."""

    uploads: ClassVar[bool] = True
    provider_limits: ClassVar[BatchLimits] = GEMINI_BATCH_LIMITS

    def __init__(self, client: LLMClient, *, inline_max_bytes: int = INLINE_MAX_BYTES) -> None:
        if client.wire != "gemini":
            raise ValueError(f"Gemini Batch Mode is Gemini's API; this client speaks {client.wire}")
        super().__init__(client)
        self.inline_max_bytes = inline_max_bytes

    # --- the batch steps' interface -------------------------------------------------------------

    async def upload(self, path: Path) -> str | None:
        """The input written as Gemini's JSONL beside ``path``; uploaded (its file name returned) when the batch
        would not fit inline, else removed (None: the requests travel in the create)."""
        converted = path.with_name(path.stem + ".gemini.jsonl")
        size = await asyncio.to_thread(self._write_input, path, converted)
        try:
            if size + len(_INLINE_ENVELOPE) <= self.inline_max_bytes:
                return None
            return await self.upload_file(converted, display_name=path.stem)
        finally:
            converted.unlink(missing_ok=True)

    async def create(self, *, record: BatchRef, path: Path | None, input_file_id: str | None,
                     metadata: Mapping[str, str], max_retries: int, find_lost: FindLost) -> BatchInfo:
        """The batch of the uploaded file ``input_file_id``, or of the requests of ``path`` inlined. Gemini batches
        take no metadata: ``metadata`` is not sent."""
        display = gemini_display_name(job_id=record.job_id, batch_id=record.id)
        if input_file_id is not None:
            body = compact_json({"batch": {"displayName": display,
                                           "inputConfig": {"fileName": input_file_id}}}).encode()
        else:
            assert path is not None
            body = await asyncio.to_thread(self._inline_body, path, display)
        # A declared provider's model is recorded as NAME/model and known to its API as model.
        model = record.model.removeprefix(f"{self.client.provider}/") if self.client.provider != "gemini" else record.model
        create = _EMBED_CREATE_PATH if record.endpoint == "embeddings" else _CREATE_PATH
        return await self._call("POST", create.format(model=path_segment(model)), json_body=body,
                                parse=_parse_batch, max_retries=max_retries, find_lost=find_lost,
                                timeout=self.client._transfer_timeout(None))

    async def retrieve(self, provider_batch_id: str) -> BatchInfo:
        return await self._call("GET", _batch_path(provider_batch_id), parse=_parse_batch)

    async def cancel(self, provider_batch_id: str) -> BatchInfo:
        """Ask Google to stop the batch (its answer is empty), then read it as it stands."""
        await self._call("POST", _batch_path(provider_batch_id) + ":cancel", json={})
        return await self.retrieve(provider_batch_id)

    async def find(self, *, record: BatchRef, adopted: Adopted) -> BatchInfo | None:
        """By the displayName naming our job and batch, not already another of ours."""
        display = gemini_display_name(job_id=record.job_id, batch_id=record.id)
        async for info in self._since(record):
            if info.metadata.get("displayName") == display and not await adopted(info.id):
                return info
        return None

    async def locate(self, record: BatchRef) -> BatchInfo | None:
        """By its name, or by the displayName naming our batch."""
        display = gemini_display_name(job_id=record.job_id, batch_id=record.id)
        async for info in self._since(record):
            if info.id == record.provider_batch_id or info.metadata.get("displayName") == display:
                return info
        return None

    def result_files(self, record: BatchRef) -> list[ResultFile]:
        """The responses file, or the responses inlined in the batch, written out as its lines would be."""
        if record.output_file_id is None or record.provider_batch_id is None:
            return []
        if record.output_file_id == INLINED_RESPONSES:
            download: Callable[..., Any] = partial(self.download_inlined, record.provider_batch_id)
        else:
            download = partial(self.download_file, record.output_file_id)
        read = partial(read_gemini_batch_results, endpoint=record.endpoint)  # a batch holds one endpoint's lines
        return [ResultFile(kind="responses", read=read, download=download)]

    async def _since(self, record: BatchRef) -> AsyncIterator[BatchInfo]:
        """The batches created since ``record`` (less the slack), page by page. The list's order is not documented:
        the pages are read to the end (at most ``_LIST_MAX_PAGES``), unless every batch so far came newest first, in
        which case a page holding none that recent ends the look (a batch missed here is a batch paid twice)."""
        since = record.created_at - CLOCK_SLACK
        token: str | None = None
        newest_first, oldest_seen = True, None
        for _ in range(_LIST_MAX_PAGES):
            params = {"pageSize": str(_LIST_PAGE)}
            if token:
                params["pageToken"] = token
            page: tuple[list[BatchInfo], str | None] = await self._call("GET", GEMINI_BATCHES_PATH, params=params,
                                                                          parse=_parse_page)
            batches, token = page
            recent = [info for info in batches if info.created_at is None or info.created_at >= since]
            for info in recent:
                yield info
            stamps = [info.created_at for info in batches if info.created_at is not None]
            if oldest_seen is not None:
                stamps.insert(0, oldest_seen)
            newest_first = newest_first and all(a >= b for a, b in zip(stamps, stamps[1:]))
            oldest_seen = stamps[-1] if stamps else oldest_seen
            if not token or not batches or (newest_first and not recent):
                return

    # --- the requests ---------------------------------------------------------------------------

    def _requests(self, path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
        """(member id, generateContent body or EmbedContentRequest) of each line of an input file in OpenAI's line
        format."""
        for custom_id, url, body in self._input_lines(path):
            if url == BATCH_URLS["embeddings"]:
                yield custom_id, _embed_request(body)
                continue
            if url != BATCH_CHAT_ENDPOINT:
                raise ValueError(f"Gemini batches send chat and embeddings requests, not {url!r}: "
                                 "route these prompts real-time")
            request = ChatRequest(model=body.pop("model"), messages=body.pop("messages"), params=body)
            yield custom_id, self.client.request_body(request)

    def _write_input(self, path: Path, to: Path) -> int:
        """Gemini's JSONL of ``path`` written to ``to`` (``{"key", "request"}`` a line); returns the size of the
        same requests inlined in a create (``{"request", "metadata": {"key"}}`` each: 13 bytes more than a line)."""
        size = _DISPLAY_NAME_ROOM
        with to.open("wb") as out:
            for key, request in self._requests(path):
                line = compact_json({"key": key, "request": request}).encode() + b"\n"
                out.write(line)
                size += len(line) + _INLINE_ITEM_EXTRA
        return size

    def _inline_body(self, path: Path, display: str) -> bytes:
        """The create's body with every request of ``path`` inlined, encoded a request at a time."""
        body = bytearray(b'{"batch":{"displayName":' + compact_json(display).encode()
                         + b',"inputConfig":{"requests":{"requests":[')
        for index, (key, request) in enumerate(self._requests(path)):
            if index:
                body += b","
            body += compact_json({"request": request, "metadata": {"key": key}}).encode()
        body += b"]}}}}"
        return bytes(body)

    # --- files ----------------------------------------------------------------------------------

    async def upload_file(self, path: Path, *, display_name: str | None = None) -> str:
        """Upload ``path`` by the resumable protocol, 8 MiB a request; returns the file's name (``files/...``). Each
        request is retried by the client's rules; a chunk sent again goes to the same offset."""
        size = path.stat().st_size
        start = {"X-Goog-Upload-Protocol": "resumable", "X-Goog-Upload-Command": "start",
                 "X-Goog-Upload-Header-Content-Length": str(size),
                 "X-Goog-Upload-Header-Content-Type": JSONL_MIME_TYPE}
        file: dict[str, Any] = {"mimeType": JSONL_MIME_TYPE, "sizeBytes": str(size)}
        if display_name:
            file["displayName"] = display_name[:512]
        url = await self._call("POST", GEMINI_UPLOAD_PATH, json={"file": file}, headers=start, parse=_upload_url)
        upload_path, params = _same_host(url)
        timeout = self.client._transfer_timeout(None)
        offset = 0
        with path.open("rb") as handle:
            while True:
                chunk = handle.read(UPLOAD_CHUNK)
                last = offset + len(chunk) >= size
                headers = {"X-Goog-Upload-Command": "upload, finalize" if last else "upload",
                           "X-Goog-Upload-Offset": str(offset)}
                answer = await self._call("POST", upload_path, params=params, content=chunk, headers=headers,
                                          parse=partial(_upload_status, final=last), timeout=timeout)
                offset += len(chunk)
                if last:
                    return str(answer)

    async def download_file(self, name: str, *, to: Path, timeout: float | None = None) -> Path:
        """Stream a file's bytes (``files/...:download?alt=media``) to ``to``, never half a file."""
        to = Path(to)
        to.parent.mkdir(parents=True, exist_ok=True)
        return await self._call("GET", f"/download/v1beta/{_resource(name, 'files')}:download",
                                params={"alt": "media"}, stream_to=to, timeout=self.client._transfer_timeout(timeout))

    async def download_inlined(self, provider_batch_id: str, *, to: Path, timeout: float | None = None) -> Path:
        """A finished batch read whole, its inlined responses written to ``to`` as responses-file lines."""
        to = Path(to)
        to.parent.mkdir(parents=True, exist_ok=True)
        raw = to.with_name(to.name + ".batch.json")
        await self._call("GET", _batch_path(provider_batch_id), stream_to=raw,
                         timeout=self.client._transfer_timeout(timeout))
        await asyncio.to_thread(_write_inlined, raw, to)
        return to


_INLINE_ENVELOPE: Final = b'{"batch":{"displayName":"","inputConfig":{"requests":{"requests":[]}}}}'


def _embed_request(body: dict[str, Any]) -> dict[str, Any]:
    """The EmbedContentRequest of an embeddings line's body (``wire.embeddings_body``: one text as ``input``)."""
    body.pop("model", None)
    body.pop("encoding_format", None)  # the line writer's default: Gemini answers floats only
    given = body.pop("input")
    texts = given if isinstance(given, list) else [given]
    if len(texts) != 1 or not isinstance(texts[0], str):
        raise ValueError(f"a Gemini batch line embeds one text, not {len(texts)}: its lines are never packed")
    return gemini_embed_request(texts[0], body)


def _batch_path(name: str) -> str:
    return f"/v1beta/{_resource(name, 'batches')}"


def _resource(name: str, collection: str) -> str:
    """``batches/abc`` (or ``abc``) as the path segment pair ``batches/abc``, its id quoted."""
    own = name.split("/", 1)[1] if name.startswith(f"{collection}/") else name
    return f"{collection}/{path_segment(own)}"


def _parse_batch(response: httpx.Response) -> BatchInfo:
    return gemini_batch_info(parse_json(response))


def _parse_page(response: httpx.Response) -> tuple[list[BatchInfo], str | None]:
    body = parse_json(response)
    operations = body.get("operations", []) if isinstance(body, dict) else None
    if not isinstance(operations, list):
        raise APIResponseValidationError(f"the body is not a list of batches: {response.text[:300]!r}")
    token = body.get("nextPageToken")
    return [gemini_batch_info(item) for item in operations], token if isinstance(token, str) else None


def _upload_url(response: httpx.Response) -> str:
    url: str | None = response.headers.get("x-goog-upload-url")
    if not url:
        raise APIResponseValidationError("the upload's start answered no X-Goog-Upload-URL")
    return url


def _upload_status(response: httpx.Response, *, final: bool) -> str | None:
    """A chunk's answer: ``active`` until the last, whose ``final`` answer names the file."""
    status = response.headers.get("x-goog-upload-status")
    if status != ("final" if final else "active"):
        raise APIResponseValidationError(f"the upload answered status {status!r}, not {'final' if final else 'active'}")
    if not final:
        return None
    file = parse_json(response).get("file")
    name = file.get("name") if isinstance(file, dict) else None
    if not isinstance(name, str) or not name:
        raise APIResponseValidationError(f"the finished upload names no file: {response.text[:300]!r}")
    return name


def _same_host(url: str) -> tuple[str, dict[str, str]]:
    """The upload URL's path and query, sent to the client's own host (as google-genai puts the base URL's scheme and
    host on it)."""
    parts = urlsplit(url)
    return parts.path, dict(parse_qsl(parts.query, keep_blank_values=True))


def _write_inlined(raw: Path, to: Path) -> None:
    try:
        with raw.open("rb") as handle:
            body = json.load(handle)
        temporary = to.with_name(to.name + ".part")
        with temporary.open("wb") as out:
            for line in inlined_lines(body):
                out.write(line)
        temporary.replace(to)
    finally:
        raw.unlink(missing_ok=True)
