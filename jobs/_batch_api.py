"""The batch backend interface: what the batch steps (submit, poll, ingest, cancel) ask of a provider's Batch API.

Each provider implements it in a module of its own, side by side: OpenAI's Batch API (a file uploaded, then a
batch of it) in ``_batch_openai.py``, Anthropic's Message Batches (the requests in the create call) in
``_batch_anthropic.py``; ``Clients.batch_api`` picks by the batch's provider (``BACKENDS`` in ``_clients.py``), so a
third provider is one more module and its line there.

Every backend keeps a batch's input as a JSONL file on disk in OpenAI's line format (``write_batch_files``): it is
what a crash leaves to finish from. A create whose answer was lost is found again by ``find`` before any retry.
"""

from __future__ import annotations

import dataclasses

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import ClassVar, Final

from llm_dispatch import storage
from llm_dispatch.core import BatchInfo, BatchLimits, BatchLine, LLMClient

__all__ = ["CLOCK_SLACK", "BatchApi", "FindLost", "ResultFile"]

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


class BatchApi(ABC):
    """One provider's Batch API as the batch steps use it: submit (``upload``, ``create``), poll (``retrieve``),
    results (``result_files``), ``cancel``, finding a lost create (``find``) and a batch that answered 404 (``locate``)."""

    # Whether the input file is uploaded before the create, or its requests travel in the create.
    uploads: ClassVar[bool]
    provider_limits: ClassVar[BatchLimits]

    def __init__(self, client: LLMClient) -> None:
        self.client = client

    def creating(self) -> AbstractAsyncContextManager[object]:
        """Held from a batch's look-up through its create to storing its id; nothing to hold where a batch
        names itself (its metadata carries our ids)."""
        return nullcontext()

    def limits(self, *, max_requests: int | None = None, max_bytes: int | None = None) -> BatchLimits:
        """One batch's limits: the provider's, or the configured ones where given."""
        own = self.provider_limits
        return dataclasses.replace(own, max_requests=max_requests or own.max_requests,
                                   max_bytes=max_bytes or own.max_bytes)

    @abstractmethod
    async def upload(self, path: Path) -> str | None:
        """Make the input file available to the create; returns its provider file id (None: nothing uploaded)."""

    @abstractmethod
    async def create(self, *, record: storage.BatchRecord, path: Path | None, input_file_id: str | None,
                     metadata: Mapping[str, str], max_retries: int, find_lost: FindLost) -> BatchInfo:
        """Create the batch, retried by the client's rules, ``find_lost`` looking it up before each retry."""

    @abstractmethod
    async def retrieve(self, provider_batch_id: str) -> BatchInfo:
        """How the batch stands at the provider."""

    @abstractmethod
    async def cancel(self, provider_batch_id: str) -> BatchInfo:
        """Ask the provider to stop the batch (it answers while still cancelling)."""

    @abstractmethod
    async def find(self, *, sessions: storage.Sessions, record: storage.BatchRecord) -> BatchInfo | None:
        """The provider batch created for our batch ``record``, if any: a create whose answer was lost."""

    @abstractmethod
    async def locate(self, record: storage.BatchRecord) -> BatchInfo | None:
        """Our created batch ``record`` as the provider lists it now, or None when the provider lists no such
        batch: what a batch that answered 404 is looked up by."""

    @abstractmethod
    def result_files(self, record: storage.BatchRecord) -> list[ResultFile]:
        """The files that hold a finished batch's lines, in the order they are read."""
