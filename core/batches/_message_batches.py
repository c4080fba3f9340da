"""Anthropic's Message Batches as a batch backend: no upload, no metadata; the requests travel in the create, read
back from the input file (OpenAI's line format) as Messages bodies; every line's result in one results file.

Each request is ``{"custom_id", "params"}`` with ``params`` a Messages body (``anthropic_params``). Every call takes
the client's one send path.

Finding a create whose answer was lost: a Message Batch carries no metadata, so it is recognised by its shape:
created no earlier than our record (less ``CLOCK_SLACK``), with exactly our number of requests, and not already
adopted by another of our batches. So that two batches of one process, of the same size, never take each other's
provider batch, a process creates Message Batches one at a time and stores each one's id before the next create or
look-up (``creating``). Its results name our custom ids (``p<prompt id>``), so a batch taken by mistake (another
process's, of the same size, in the same minutes) answers none of our members: they go back to pending and are sent
again, never lost.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Final

from ..wire._anthropic_answers import parse_message_batch, parse_message_batch_page
from ._message_batch_results import read_message_batch_results
from ._batch_api import CLOCK_SLACK, Adopted, BatchApi, BatchRef, FindLost, ResultFile
from .._batch_types import MESSAGE_BATCH_LIMITS, BatchInfo, BatchLimits
from .._constants import DEFAULT_LIST_LIMIT
from .._json import compact_json
from ..wire._requests import path_segment
from .._types import ChatRequest

if TYPE_CHECKING:
    from ..http._client import LLMClient
    from ..wire._responses import BatchPage

__all__ = ["CUSTOM_ID_PATTERN", "MESSAGE_BATCHES_PATH", "MessageBatchApi", "message_batch_body"]

MESSAGE_BATCHES_PATH: Final = "/v1/messages/batches"
CUSTOM_ID_PATTERN: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")


class MessageBatchApi(BatchApi):
    """Anthropic's Message Batches, for a client whose ``provider`` is ``anthropic``."""

    uploads: ClassVar[bool] = False
    provider_limits: ClassVar[BatchLimits] = MESSAGE_BATCH_LIMITS

    def __init__(self, client: LLMClient) -> None:
        if client.wire != "anthropic":
            raise ValueError(f"Message Batches are Anthropic's API; this client speaks {client.wire}")
        super().__init__(client)
        self._creating = asyncio.Lock()

    # --- the batch steps' interface -------------------------------------------------------------

    def creating(self) -> AbstractAsyncContextManager[object]:
        """One create (and look-up) at a time, each batch's id stored before the next: see the module notes."""
        return self._creating

    async def upload(self, path: Path) -> str | None:
        return None

    async def create(self, *, record: BatchRef, path: Path | None, input_file_id: str | None,
                     metadata: Mapping[str, str], max_retries: int, find_lost: FindLost) -> BatchInfo:
        assert path is not None
        return await self.create_message_batch(requests=self._message_requests(path), max_retries=max_retries,
                                               find_lost=find_lost)

    async def retrieve(self, provider_batch_id: str) -> BatchInfo:
        return await self._call("GET", f"{MESSAGE_BATCHES_PATH}/{path_segment(provider_batch_id)}",
                                parse=parse_message_batch)

    async def cancel(self, provider_batch_id: str) -> BatchInfo:
        """Ask Anthropic to stop a batch: it answers ``canceling`` (CANCELLING) and ends later."""
        return await self._call("POST", f"{MESSAGE_BATCHES_PATH}/{path_segment(provider_batch_id)}/cancel",
                                parse=parse_message_batch)

    async def find(self, *, record: BatchRef, adopted: Adopted) -> BatchInfo | None:
        """A message batch of our record's size, created since the record was (less ``CLOCK_SLACK``), that no
        other batch of ours holds; the oldest such, as creates are answered in order."""
        found: BatchInfo | None = None
        async for info in self._since(record.created_at - CLOCK_SLACK):
            if info.request_counts.total != record.request_total:
                continue
            if not await adopted(info.id):
                found = info  # newest first: the last one kept is the oldest
        return found

    async def locate(self, record: BatchRef) -> BatchInfo | None:
        """By its id only: a Message Batch names nothing of ours, and taking one by its shape is for a create whose
        answer was lost, never for a batch that had an id."""
        async for info in self._since(record.created_at - CLOCK_SLACK):
            if info.id == record.provider_batch_id:
                return info
        return None

    def result_files(self, record: BatchRef) -> list[ResultFile]:
        """One results file, every line of the batch in it (succeeded, errored, canceled or expired)."""
        if record.provider_batch_id is None or record.output_file_id is None:
            return []
        return [ResultFile(kind="results", read=read_message_batch_results,
                           download=partial(self.download_message_batch_results, record.provider_batch_id))]

    async def _since(self, since: datetime) -> AsyncIterator[BatchInfo]:
        async for info in self.iter_message_batches():
            if info.created_at is not None and info.created_at < since:
                return
            yield info

    def _message_requests(self, path: Path) -> Iterator[dict[str, Any]]:
        """The Message Batch requests of an input file in OpenAI's line format, as Messages bodies, one at a time."""
        for custom_id, _, body in self._input_lines(path):
            request = ChatRequest(model=body.pop("model"), messages=body.pop("messages"), params=body)
            yield {"custom_id": custom_id, "params": self.client.request_body(request)}

    # --- Message Batches ------------------------------------------------------------------------

    async def create_message_batch(
        self,
        *,
        requests: Iterable[Mapping[str, Any]],
        max_retries: int | None = None,
        find_lost: FindLost | None = None,
        timeout: float | None = None,
    ) -> BatchInfo:
        """Create a batch of ``requests`` (``{"custom_id", "params"}`` each; any iterable, read once, in a worker
        thread). ``max_retries`` overrides the client's for this call; ``find_lost``, awaited after each attempt
        that may have made the batch without saying so, looks it up before it is tried again. The body is the whole
        batch (up to 256 MB), so one attempt has the upload deadline (``timeout``, default the client's file
        timeout), not a chat's."""
        body = await asyncio.to_thread(message_batch_body, requests)
        return await self._call("POST", MESSAGE_BATCHES_PATH, json_body=body, parse=parse_message_batch,
                                max_retries=max_retries, find_lost=find_lost,
                                timeout=self.client._transfer_timeout(timeout))

    async def iter_message_batches(self, *, page_size: int = DEFAULT_LIST_LIMIT) -> AsyncIterator[BatchInfo]:
        """Every message batch of the workspace, newest first, a page at a time."""
        if page_size < 1:
            raise ValueError(f"page_size must be at least 1, got {page_size}")
        after: str | None = None
        while True:
            params = {"limit": str(page_size)}
            if after is not None:
                params["after_id"] = after
            page: BatchPage = await self._call("GET", MESSAGE_BATCHES_PATH, params=params,
                                               parse=parse_message_batch_page)
            for batch in page.batches:
                yield batch
            if not page.has_more or not page.batches:
                return
            after = page.batches[-1].id

    async def download_message_batch_results(self, batch_id: str, *, to: Path, timeout: float | None = None) -> Path:
        """Stream an ended batch's results JSONL to ``to`` (written beside it and renamed, so never half a file)."""
        to = Path(to)
        to.parent.mkdir(parents=True, exist_ok=True)
        return await self._call("GET", f"{MESSAGE_BATCHES_PATH}/{path_segment(batch_id)}/results", stream_to=to,
                                timeout=self.client._transfer_timeout(timeout))


def message_batch_body(requests: Iterable[Mapping[str, Any]]) -> bytes:
    """The create call's JSON body, encoded a request at a time: what is held is the body's bytes, not the
    requests as objects (several times their size). ``ValueError`` for a request Anthropic would refuse."""
    body = bytearray(b'{"requests":[')
    count = 0
    for request in requests:
        custom_id = request.get("custom_id")
        if not isinstance(custom_id, str) or not CUSTOM_ID_PATTERN.fullmatch(custom_id):
            raise ValueError(f"custom_id {custom_id!r} must be 1-64 characters of A-Z, a-z, 0-9, _ and -")
        if not isinstance(request.get("params"), Mapping):
            raise ValueError(f"request {custom_id!r} has no params object (a Messages body)")
        count += 1
        if count > MESSAGE_BATCH_LIMITS.max_requests:
            raise ValueError(f"a message batch holds at most {MESSAGE_BATCH_LIMITS.max_requests:,} requests; split it")
        if count > 1:
            body += b","
        body += compact_json({"custom_id": custom_id, "params": request["params"]}).encode()
    if not count:
        raise ValueError("a message batch needs at least one request")
    body += b"]}"
    return bytes(body)
