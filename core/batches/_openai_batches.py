"""OpenAI's files and batches (and every API that speaks them) as a batch backend: the input file uploaded, then a
batch of it; answers in an output file and an error file.

Every call takes the client's one send path, so the same loop and rules as a chat: a 5xx or timeout on a create is
retried, and a create that did reach the provider would be made twice, unless ``find_lost`` looks it up first.
Finding a create whose answer was lost: the batch carries our job and batch ids in its metadata.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any, ClassVar, Final

from ._batch_api import CLOCK_SLACK, Adopted, BatchApi, BatchRef, FindLost, ResultFile
from ._batch_files import read_batch_output
from .._batch_types import BATCH_CHAT_ENDPOINT, DEFAULT_COMPLETION_WINDOW, OPENAI_BATCH_LIMITS, BatchInfo, BatchLimits, \
    FileInfo
from .._constants import DEFAULT_LIST_LIMIT
from .._endpoints import batch_url, check_batch_url
from .._exceptions import NotFoundError
from ..wire._requests import path_segment
from ..wire._responses import BatchPage, parse_batch_info, parse_batch_page, parse_file_info

__all__ = ["BATCHES_PATH", "BATCH_ID_KEY", "FILES_PATH", "JOB_ID_KEY", "OpenAIBatchApi"]

FILES_PATH: Final = "/files"
BATCHES_PATH: Final = "/batches"
# Keys of an OpenAI batch's metadata: how a batch is found again after a crash.
JOB_ID_KEY: Final = "llm_dispatch_job"
BATCH_ID_KEY: Final = "llm_dispatch_batch"


class OpenAIBatchApi(BatchApi):
    """OpenAI's files and batches (and every API that speaks them)."""

    uploads: ClassVar[bool] = True
    provider_limits: ClassVar[BatchLimits] = OPENAI_BATCH_LIMITS

    # --- the batch steps' interface -------------------------------------------------------------

    async def upload(self, path: Path) -> str | None:
        return (await self.upload_file(path, purpose="batch")).id

    async def create(self, *, record: BatchRef, path: Path | None, input_file_id: str | None,
                     metadata: Mapping[str, str], max_retries: int, find_lost: FindLost) -> BatchInfo:
        assert input_file_id is not None
        tags = {**metadata, JOB_ID_KEY: record.job_id, BATCH_ID_KEY: str(record.id)}
        return await self.create_batch(input_file_id=input_file_id, endpoint=batch_url(record.endpoint),
                                       metadata=tags, max_retries=max_retries, find_lost=find_lost)

    async def retrieve(self, provider_batch_id: str) -> BatchInfo:
        return await self._call("GET", f"{BATCHES_PATH}/{path_segment(provider_batch_id)}",
                                parse=parse_batch_info)

    async def cancel(self, provider_batch_id: str) -> BatchInfo:
        """Ask the provider to stop a batch; it answers ``cancelling`` and reaches ``cancelled`` later."""
        return await self._call("POST", f"{BATCHES_PATH}/{path_segment(provider_batch_id)}/cancel",
                                parse=parse_batch_info)

    async def find(self, *, record: BatchRef, adopted: Adopted) -> BatchInfo | None:
        """By the ids in its metadata. Lists newest first and stops at batches older than the record, so it
        reads a page or two."""
        return await self._listed(record, lambda info: _names(info, record))

    async def locate(self, record: BatchRef) -> BatchInfo | None:
        """By its id, or by the ids in its metadata."""
        return await self._listed(record, lambda info: info.id == record.provider_batch_id or _names(info, record))

    def result_files(self, record: BatchRef) -> list[ResultFile]:
        """The output file, then the error file."""
        read = partial(read_batch_output, endpoint=record.endpoint)  # a batch holds one endpoint's lines
        return [ResultFile(kind=kind, read=read, download=partial(self.download_file, file_id))
                for file_id, kind in ((record.output_file_id, "output"), (record.error_file_id, "errors"))
                if file_id is not None]

    async def _listed(self, record: BatchRef, match: Callable[[BatchInfo], bool]) -> BatchInfo | None:
        """The first batch listed that ``match``es, newest first, looking no further back than ``record``."""
        since = record.created_at - CLOCK_SLACK
        async for info in self.iter_batches():
            if match(info):
                return info
            if info.created_at is not None and info.created_at < since:
                return None
        return None

    # --- files ----------------------------------------------------------------------------------

    async def upload_file(self, path: Path, *, purpose: str = "batch", timeout: float | None = None) -> FileInfo:
        """Upload ``path`` as multipart form data, streamed from disk; a retry sends the whole file again.

        ``timeout`` bounds one attempt (default: the larger of the client's file timeout and its request timeout).
        """
        path = Path(path)
        with path.open("rb") as handle:
            return await self._call(
                "POST", FILES_PATH, files={"file": (path.name, handle, "application/jsonl")}, data={"purpose": purpose},
                parse=parse_file_info, timeout=self.client._transfer_timeout(timeout),
            )

    async def retrieve_file(self, file_id: str) -> FileInfo:
        return await self._call("GET", f"{FILES_PATH}/{path_segment(file_id)}", parse=parse_file_info)

    async def download_file(self, file_id: str, *, to: Path, timeout: float | None = None) -> Path:
        """Stream a file's content to ``to`` (written beside it and renamed, so never half a file); returns ``to``."""
        to = Path(to)
        # Made up front: a missing directory would otherwise look like a network error and be retried.
        to.parent.mkdir(parents=True, exist_ok=True)
        return await self._call("GET", f"{FILES_PATH}/{path_segment(file_id)}/content", stream_to=to,
                                timeout=self.client._transfer_timeout(timeout))

    async def delete_file(self, file_id: str, *, missing_ok: bool = False) -> None:
        """Delete a file; with ``missing_ok`` a file that is already gone (say, a retried delete) is no error."""
        try:
            await self._call("DELETE", f"{FILES_PATH}/{path_segment(file_id)}")
        except NotFoundError:
            if not missing_ok:
                raise

    # --- batches --------------------------------------------------------------------------------

    async def create_batch(
        self,
        *,
        input_file_id: str,
        endpoint: str = BATCH_CHAT_ENDPOINT,
        completion_window: str = DEFAULT_COMPLETION_WINDOW,
        metadata: Mapping[str, str] | None = None,
        max_retries: int | None = None,
        find_lost: FindLost | None = None,
    ) -> BatchInfo:
        """Create a batch. ``max_retries`` overrides the client's for this call. ``find_lost`` is awaited after each
        attempt that may have made the batch without saying so (a timeout, a dropped connection, a 5xx), once the
        wait before the next has passed; a batch it finds is the answer, and no attempt follows. An ``endpoint``
        whose output lines this package cannot read is refused (``ConfigError``) before anything is sent."""
        check_batch_url(endpoint)
        body: dict[str, Any] = {"input_file_id": input_file_id, "endpoint": endpoint,
                                "completion_window": completion_window}
        if metadata is not None:
            body["metadata"] = dict(metadata)
        return await self._call("POST", BATCHES_PATH, json=body, parse=parse_batch_info,
                                max_retries=max_retries, find_lost=find_lost)

    async def list_batches(self, *, limit: int = DEFAULT_LIST_LIMIT, after: str | None = None) -> list[BatchInfo]:
        """One page of batches, newest first; ``after`` is the id of the last batch of the previous page."""
        return (await self._batch_page(limit=limit, after=after)).batches

    async def iter_batches(self, *, page_size: int = DEFAULT_LIST_LIMIT) -> AsyncIterator[BatchInfo]:
        """Every batch, newest first, fetched a page at a time."""
        after: str | None = None
        while True:
            page = await self._batch_page(limit=page_size, after=after)
            for batch in page.batches:
                yield batch
            if not page.has_more or not page.batches:
                return
            after = page.batches[-1].id

    async def _batch_page(self, *, limit: int, after: str | None) -> BatchPage:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        params = {"limit": str(limit)}
        if after is not None:
            params["after"] = after
        return await self._call("GET", BATCHES_PATH, params=params, parse=parse_batch_page)


def _names(info: BatchInfo, record: BatchRef) -> bool:
    """Whether the provider batch's metadata names our batch ``record``."""
    return info.metadata.get(BATCH_ID_KEY) == str(record.id) and info.metadata.get(JOB_ID_KEY) == record.job_id
