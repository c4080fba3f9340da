"""The batch backend interface: what the batch steps (submit, poll, ingest, cancel) ask of a provider's Batch API.

Each provider's backend is one module beside its wire, holding that provider's batch calls over the client's one
send path (the client sends and reads; it knows no batch): OpenAI's files and batches in ``_openai_batches.py``,
Anthropic's Message Batches in ``_message_batches.py``, Gemini's Batch Mode in ``_gemini_batches.py``. ``batch_api`` (``_batch_backends.py``) picks one by the
client's provider.

Adding a provider's Batch API: write ``_<provider>_batches.py`` with a subclass of ``BatchApi`` (its limits, whether
it uploads, and each abstract method, calling ``self._call`` with the provider's paths and parsers) and add its line
to ``BACKENDS`` in ``_batch_backends.py``. Nothing in the client or in ``jobs`` changes.

Every backend keeps a batch's input as a JSONL file on disk in OpenAI's line format (``write_batch_files``): it is
what a crash leaves to finish from. A create whose answer was lost is found again by ``find`` before any retry.
"""

from __future__ import annotations

import dataclasses
import json
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Final, Protocol, TypeVar, overload

import httpx

from ._batch_files import BatchLine
from .._batch_types import BatchInfo, BatchLimits

if TYPE_CHECKING:
    from ..http._client import LLMClient

_T = TypeVar("_T")
__all__ = ["CLOCK_SLACK", "Adopted", "BatchApi", "BatchRef", "FindLost", "ResultFile"]

# Looks a create up that may have worked without saying so (``LLMClient._request``'s ``find_lost``).
FindLost = Callable[[], Awaitable[BatchInfo | None]]
# Whether one of our batches already holds a provider batch id: a lost create's look-up never takes it twice.
Adopted = Callable[[str], Awaitable[bool]]
# How far before our record's creation a provider batch may claim to be created (clock skew).
CLOCK_SLACK: Final = timedelta(minutes=10)


class BatchRef(Protocol):
    """What a backend reads of our stored batch (``storage.BatchRecord`` is one)."""

    @property
    def id(self) -> int: ...
    @property
    def job_id(self) -> str: ...
    @property
    def model(self) -> str: ...
    @property
    def endpoint(self) -> str: ...
    @property
    def created_at(self) -> datetime: ...
    @property
    def request_total(self) -> int: ...
    @property
    def provider_batch_id(self) -> str | None: ...
    @property
    def output_file_id(self) -> str | None: ...
    @property
    def error_file_id(self) -> str | None: ...


@dataclass(frozen=True, slots=True)
class ResultFile:
    """A finished batch's file of answers (or errors), and how to read its lines."""

    kind: str
    # Called as ``download(to=path)``: streams the file there and returns the path.
    download: Callable[..., Awaitable[Path]]
    read: Callable[[Path], Iterator[BatchLine]]


class BatchApi(ABC):
    """One provider's Batch API as the batch steps use it: submit (``upload``, ``create``), poll (``retrieve``),
    results (``result_files``), ``cancel``, finding a lost create (``find``) and a batch that answered 404
    (``locate``). Made with the client whose send path (its retries, limits and errors) every call takes."""

    # Whether the input file is uploaded before the create, or its requests travel in the create.
    uploads: ClassVar[bool]
    provider_limits: ClassVar[BatchLimits]

    def __init__(self, client: LLMClient) -> None:
        self.client = client

    @overload
    async def _call(self, method: str, path: str, *, parse: Callable[[httpx.Response], _T], **options: Any) -> _T: ...
    @overload
    async def _call(self, method: str, path: str, *, stream_to: Path, **options: Any) -> Path: ...
    @overload
    async def _call(self, method: str, path: str, **options: Any) -> Any: ...

    async def _call(self, method: str, path: str, **options: Any) -> Any:
        """One API call by the client's send path (``LLMClient._request``'s options), answered by its value: what
        ``parse`` makes of the answer, the file ``stream_to`` names once the body is saved there, else the JSON."""
        return (await self.client._request(method, path, **options)).value

    @staticmethod
    def _input_lines(path: Path) -> Iterator[tuple[str, str | None, dict[str, Any]]]:
        """(custom id, url, body: a copy) of each line of an input file in OpenAI's line format, one at a time: what a
        backend whose API takes another shape rewrites."""
        with path.open("rb") as handle:
            for raw in handle:
                if raw.strip():
                    line = json.loads(raw)
                    yield line["custom_id"], line.get("url"), dict(line["body"])

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
    async def create(self, *, record: BatchRef, path: Path | None, input_file_id: str | None,
                     metadata: Mapping[str, str], max_retries: int, find_lost: FindLost) -> BatchInfo:
        """Create the batch, retried by the client's rules, ``find_lost`` looking it up before each retry."""

    @abstractmethod
    async def retrieve(self, provider_batch_id: str) -> BatchInfo:
        """How the batch stands at the provider."""

    @abstractmethod
    async def cancel(self, provider_batch_id: str) -> BatchInfo:
        """Ask the provider to stop the batch (it answers while still cancelling)."""

    @abstractmethod
    async def find(self, *, record: BatchRef, adopted: Adopted) -> BatchInfo | None:
        """The provider batch created for our batch ``record``, if any: a create whose answer was lost. ``adopted``
        says whether a provider batch is already another of ours."""

    @abstractmethod
    async def locate(self, record: BatchRef) -> BatchInfo | None:
        """Our created batch ``record`` as the provider lists it now, or None when the provider lists no such
        batch: what a batch that answered 404 is looked up by."""

    @abstractmethod
    def result_files(self, record: BatchRef) -> list[ResultFile]:
        """The files that hold a finished batch's lines, in the order they are read."""
