"""OpenAI's Batch API as a batch backend: the input file uploaded, then a batch of it; answers in an output file
and an error file.

Finding a create whose answer was lost: the batch carries our job and batch ids in its metadata.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import ClassVar, Final

from llm_dispatch import storage
from llm_dispatch.core import OPENAI_BATCH_LIMITS, BatchInfo, BatchLimits, batch_url, read_batch_output

from ._batch_api import CLOCK_SLACK, BatchApi, FindLost, ResultFile

__all__ = ["BATCH_ID_KEY", "JOB_ID_KEY", "OpenAIBatchApi"]

# Keys of an OpenAI batch's metadata: how a batch is found again after a crash.
JOB_ID_KEY: Final = "llm_dispatch_job"
BATCH_ID_KEY: Final = "llm_dispatch_batch"


class OpenAIBatchApi(BatchApi):
    """OpenAI's files and batches (and every API that speaks them)."""

    uploads: ClassVar[bool] = True
    provider_limits: ClassVar[BatchLimits] = OPENAI_BATCH_LIMITS

    async def upload(self, path: Path) -> str | None:
        return (await self.client.upload_file(path, purpose="batch")).id

    async def create(self, *, record: storage.BatchRecord, path: Path | None, input_file_id: str | None,
                     metadata: Mapping[str, str], max_retries: int, find_lost: FindLost) -> BatchInfo:
        assert input_file_id is not None
        tags = {**metadata, JOB_ID_KEY: record.job_id, BATCH_ID_KEY: str(record.id)}
        return await self.client.create_batch(input_file_id=input_file_id, endpoint=batch_url(record.endpoint),
                                              metadata=tags, max_retries=max_retries, find_lost=find_lost)

    async def retrieve(self, provider_batch_id: str) -> BatchInfo:
        return await self.client.retrieve_batch(provider_batch_id)

    async def cancel(self, provider_batch_id: str) -> BatchInfo:
        return await self.client.cancel_batch(provider_batch_id)

    async def find(self, *, sessions: storage.Sessions, record: storage.BatchRecord) -> BatchInfo | None:
        """By the ids in its metadata. Lists newest first and stops at batches older than the record, so it
        reads a page or two."""
        since = record.created_at - CLOCK_SLACK
        async for info in self.client.iter_batches():
            if info.metadata.get(BATCH_ID_KEY) == str(record.id) and info.metadata.get(JOB_ID_KEY) == record.job_id:
                return info
            if info.created_at is not None and info.created_at < since:
                return None
        return None

    async def locate(self, record: storage.BatchRecord) -> BatchInfo | None:
        """By its id, or by the ids in its metadata."""
        since = record.created_at - CLOCK_SLACK
        async for info in self.client.iter_batches():
            if info.id == record.provider_batch_id or (
                    info.metadata.get(BATCH_ID_KEY) == str(record.id) and info.metadata.get(JOB_ID_KEY) == record.job_id):
                return info
            if info.created_at is not None and info.created_at < since:
                return None
        return None

    def result_files(self, record: storage.BatchRecord) -> list[ResultFile]:
        """The output file, then the error file."""
        read = partial(read_batch_output, endpoint=record.endpoint)  # a batch holds one endpoint's lines
        return [ResultFile(kind=kind, read=read, download=partial(self.client.download_file, file_id))
                for file_id, kind in ((record.output_file_id, "output"), (record.error_file_id, "errors"))
                if file_id is not None]
