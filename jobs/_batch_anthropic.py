"""Anthropic's Message Batches as a batch backend: no upload, no metadata; the requests travel in the create, read
back from the input file (OpenAI's line format) as Messages bodies; every line's result in one results file.

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
import json
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any, ClassVar

from llm_dispatch import storage
from llm_dispatch.core import MESSAGE_BATCH_LIMITS, BatchInfo, BatchLimits, ChatRequest, LLMClient, read_message_batch_results

from ._batch_api import CLOCK_SLACK, BatchApi, FindLost, ResultFile

__all__ = ["MessageBatchApi"]


class MessageBatchApi(BatchApi):
    """Anthropic's Message Batches."""

    uploads: ClassVar[bool] = False
    provider_limits: ClassVar[BatchLimits] = MESSAGE_BATCH_LIMITS

    def __init__(self, client: LLMClient) -> None:
        super().__init__(client)
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

    async def retrieve(self, provider_batch_id: str) -> BatchInfo:
        return await self.client.retrieve_message_batch(provider_batch_id)

    async def cancel(self, provider_batch_id: str) -> BatchInfo:
        return await self.client.cancel_message_batch(provider_batch_id)

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
        """By its id only: a Message Batch names nothing of ours, and taking one by its shape is for a create whose
        answer was lost, never for a batch that had an id."""
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
