"""One provider's Batch API as the batch steps use it: OpenAI's (a file uploaded, then a batch of it) or
Anthropic's Message Batches (the requests in the create call). ``batch_api`` picks by the batch's provider.

Both keep a batch's input as a JSONL file on disk in OpenAI's line format (``write_batch_files``): it is
what a crash leaves to finish from, and what a Message Batch's requests are read back from at create time.

Finding a create whose answer was lost: an OpenAI batch carries our job and batch ids in its metadata.
A Message Batch carries no metadata, so it is recognised by its shape instead: created no earlier than
our record (less ``CLOCK_SLACK``), with exactly our number of requests, and not already adopted by
another of our batches. So that two batches of one process, of the same size, never take each other's
provider batch, a process creates Message Batches one at a time and stores each one's id before the
next create or look-up (``creating``). Its results name our custom ids (``p<prompt id>``), so a batch
taken by mistake (another process's, of the same size, in the same minutes) answers none of our
members: they go back to pending and are sent again, never lost.
"""

from __future__ import annotations

import asyncio
import json
from contextlib import AbstractAsyncContextManager, nullcontext
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any, ClassVar, Final


from llm_dispatch import storage
from llm_dispatch.core import (
    BatchInfo,
    BatchLimits,
    BatchLine,
    ChatRequest,
    LLMClient,
    MESSAGE_BATCH_LIMITS,
    OPENAI_BATCH_LIMITS,
    batch_url,
    read_batch_output,
    read_message_batch_results,
)

__all__ = ["BATCH_ID_KEY", "CLOCK_SLACK", "JOB_ID_KEY", "BatchApi", "ResultFile", "batch_api"]

# Keys of an OpenAI batch's metadata: how a batch is found again after a crash.
JOB_ID_KEY: Final = "llm_dispatch_job"
BATCH_ID_KEY: Final = "llm_dispatch_batch"
# Looks a create up that may have worked without saying so (see ``LLMClient.create_batch``).
FindLost = Callable[[], Awaitable[BatchInfo | None]]
# How far before our record's creation a provider batch may claim to be created (clock skew).
CLOCK_SLACK: Final = timedelta(minutes=10)


@dataclass(frozen=True, slots=True)
class ResultFile:
    """A finished batch's file of answers (or errors), and how to read its lines."""

    kind: str
    # Called as ``download(to=path)``: streams the file there and returns the path.
    download: Callable[..., Awaitable[Path]]
    read: Callable[[Path], Iterator[BatchLine]]


class BatchApi:
    """What the batch steps ask of a provider; this base is OpenAI's Batch API."""

    # Whether the input file is uploaded before the create (OpenAI) or its requests travel in it (Anthropic).
    uploads: ClassVar[bool] = True
    provider_limits: ClassVar[BatchLimits] = OPENAI_BATCH_LIMITS

    def __init__(self, client: LLMClient) -> None:
        self.client = client
        # A batch's state by its provider id, and asking the provider to stop it (it answers cancelling).
        self.retrieve: Callable[[str], Awaitable[BatchInfo]] = client.retrieve_batch
        self.cancel: Callable[[str], Awaitable[BatchInfo]] = client.cancel_batch

    def creating(self) -> AbstractAsyncContextManager[object]:
        """Held from a batch's look-up through its create to storing its id: nothing to hold where a batch
        names itself (OpenAI's metadata)."""
        return nullcontext()

    def limits(self, *, max_requests: int | None = None, max_bytes: int | None = None) -> BatchLimits:
        """One batch's limits: the provider's, or the configured ones where given."""
        own = self.provider_limits
        return BatchLimits(max_requests=max_requests or own.max_requests, max_bytes=max_bytes or own.max_bytes)

    async def upload(self, path: Path) -> str | None:
        """Make the input file available to the create; returns its provider file id."""
        return (await self.client.upload_file(path, purpose="batch")).id

    async def create(self, *, record: storage.BatchRecord, path: Path | None, input_file_id: str | None,
                     metadata: Mapping[str, str], max_retries: int, find_lost: FindLost) -> BatchInfo:
        """Create the batch, retried by the client's rules, ``find_lost`` looking it up before each retry."""
        assert input_file_id is not None
        tags = {**metadata, JOB_ID_KEY: record.job_id, BATCH_ID_KEY: str(record.id)}
        return await self.client.create_batch(input_file_id=input_file_id, endpoint=batch_url(record.endpoint),
                                              metadata=tags, max_retries=max_retries, find_lost=find_lost)

    async def find(self, *, sessions: storage.Sessions, record: storage.BatchRecord) -> BatchInfo | None:
        """The provider batch created for our batch ``record`` (by the ids in its metadata), if any.
        Lists newest first and stops at batches older than the record, so it reads a page or two."""
        since = record.created_at - CLOCK_SLACK
        async for info in self.client.iter_batches():
            if info.metadata.get(BATCH_ID_KEY) == str(record.id) and info.metadata.get(JOB_ID_KEY) == record.job_id:
                return info
            if info.created_at is not None and info.created_at < since:
                return None
        return None

    async def locate(self, record: storage.BatchRecord) -> BatchInfo | None:
        """Our created batch ``record`` as the provider lists it now (by its id, or by the ids in its metadata),
        or None when the provider lists no such batch: what a batch that answered 404 is looked up by."""
        since = record.created_at - CLOCK_SLACK
        async for info in self.client.iter_batches():
            if info.id == record.provider_batch_id or (
                    info.metadata.get(BATCH_ID_KEY) == str(record.id) and info.metadata.get(JOB_ID_KEY) == record.job_id):
                return info
            if info.created_at is not None and info.created_at < since:
                return None
        return None

    def result_files(self, record: storage.BatchRecord) -> list[ResultFile]:
        """The files that hold a finished batch's lines: OpenAI's output file, then its error file."""
        read = partial(read_batch_output, endpoint=record.endpoint)  # a batch holds one endpoint's lines
        return [ResultFile(kind=kind, read=read, download=partial(self.client.download_file, file_id))
                for file_id, kind in ((record.output_file_id, "output"), (record.error_file_id, "errors"))
                if file_id is not None]


class MessageBatchApi(BatchApi):
    """Anthropic's Message Batches: no upload, no metadata; the requests travel in the create."""

    uploads: ClassVar[bool] = False
    provider_limits: ClassVar[BatchLimits] = MESSAGE_BATCH_LIMITS

    def __init__(self, client: LLMClient) -> None:
        super().__init__(client)
        self.retrieve = client.retrieve_message_batch
        self.cancel = client.cancel_message_batch
        self._creating = asyncio.Lock()

    def creating(self) -> AbstractAsyncContextManager[object]:
        """One create (and look-up) at a time, each batch's id stored before the next: see the module notes."""
        return self._creating

    async def upload(self, path: Path) -> str | None:
        return None

    async def create(self, *, record: storage.BatchRecord, path: Path | None, input_file_id: str | None,
                     metadata: Mapping[str, str], max_retries: int, find_lost: FindLost) -> BatchInfo:
        assert path is not None
        return await self.client.create_message_batch(requests=_message_requests(path, self.client),
                                                      max_retries=max_retries, find_lost=find_lost)

    async def find(self, *, sessions: storage.Sessions, record: storage.BatchRecord) -> BatchInfo | None:
        """A message batch of our record's size, created since the record was (less ``CLOCK_SLACK``), that no
        other batch of ours holds; the oldest such, as creates are answered in order."""
        since = record.created_at - CLOCK_SLACK
        found: BatchInfo | None = None
        async for info in self._since(since):
            if info.request_counts.total != record.request_total:
                continue
            if await storage.find_batch_by_provider_id(sessions, provider_batch_id=info.id) is None:
                found = info  # newest first: the last one kept is the oldest
        return found

    async def locate(self, record: storage.BatchRecord) -> BatchInfo | None:
        """Our created batch as the provider lists it now, by its id only: a Message Batch names nothing of ours,
        and taking one by its shape is for a create whose answer was lost, never for a batch that had an id."""
        async for info in self._since(record.created_at - CLOCK_SLACK):
            if info.id == record.provider_batch_id:
                return info
        return None

    async def _since(self, since: datetime) -> AsyncIterator[BatchInfo]:
        async for info in self.client.iter_message_batches():
            if info.created_at is not None and info.created_at < since:
                return
            yield info

    def result_files(self, record: storage.BatchRecord) -> list[ResultFile]:
        """One results file, every line of the batch in it (succeeded, errored, canceled or expired)."""
        if record.provider_batch_id is None or record.output_file_id is None:
            return []
        return [ResultFile(kind="results", read=read_message_batch_results,
                           download=partial(self.client.download_message_batch_results, record.provider_batch_id))]


def batch_api(client: LLMClient) -> BatchApi:
    """The Batch API of ``client``'s provider."""
    return MessageBatchApi(client) if client.provider == "anthropic" else BatchApi(client)


def _message_requests(path: Path, client: LLMClient) -> Iterator[dict[str, Any]]:
    """The Message Batch requests of an input file in OpenAI's line format, as Messages bodies, one at a time."""
    with path.open("rb") as handle:
        for raw in handle:
            if not raw.strip():
                continue
            line = json.loads(raw)
            body = dict(line["body"])
            request = ChatRequest(model=body.pop("model"), messages=body.pop("messages"), params=body)
            yield {"custom_id": line["custom_id"], "params": client.request_body(request)}
