"""Anthropic's Message Batches on ``LLMClient``: create, retrieve, cancel, list and download results.

The requests go in the create call itself (no file upload); each is ``{"custom_id", "params"}`` with
``params`` a Messages body (``anthropic_params``). Every call takes the client's one send path.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._anthropic_answers import parse_message_batch, parse_message_batch_page
from .._batch_types import MESSAGE_BATCH_LIMITS, BatchInfo
from .._constants import DEFAULT_LIST_LIMIT
from .._json import compact_json
from ._requests import path_segment

if TYPE_CHECKING:
    from ._responses import BatchPage

__all__ = ["CUSTOM_ID_PATTERN", "MESSAGE_BATCHES_PATH", "MessageBatchMethods"]

MESSAGE_BATCHES_PATH = "/v1/messages/batches"
CUSTOM_ID_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}")


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


class MessageBatchMethods:
    """Mixed into ``LLMClient``: the calls exist for a client whose ``provider`` is ``anthropic``."""

    provider: str
    _request: Any
    _transfer_timeout: Any

    def _need_anthropic(self) -> None:
        if self.provider != "anthropic":
            raise ValueError(f"Message Batches are Anthropic's API; this client speaks {self.provider}")

    async def create_message_batch(
        self,
        *,
        requests: Iterable[Mapping[str, Any]],
        max_retries: int | None = None,
        find_lost: Callable[[], Awaitable[BatchInfo | None]] | None = None,
        timeout: float | None = None,
    ) -> BatchInfo:
        """Create a batch of ``requests`` (``{"custom_id", "params"}`` each; any iterable, read once, in a worker
        thread). ``max_retries`` and ``find_lost`` are ``create_batch``'s: a create that may have worked without
        saying so is looked up before it is tried again. The body is the whole batch (up to 256 MB), so one
        attempt has the upload deadline (``timeout``, default the client's file timeout), not a chat's."""
        self._need_anthropic()
        body = await asyncio.to_thread(message_batch_body, requests)
        sent = await self._request("POST", MESSAGE_BATCHES_PATH, json_body=body, parse=parse_message_batch,
                                   max_retries=max_retries, find_lost=find_lost, timeout=self._transfer_timeout(timeout))
        return sent.value  # type: ignore[no-any-return]

    async def retrieve_message_batch(self, batch_id: str) -> BatchInfo:
        self._need_anthropic()
        sent = await self._request("GET", f"{MESSAGE_BATCHES_PATH}/{path_segment(batch_id)}",
                                   parse=parse_message_batch)
        return sent.value  # type: ignore[no-any-return]

    async def cancel_message_batch(self, batch_id: str) -> BatchInfo:
        """Ask Anthropic to stop a batch: it answers ``canceling`` (CANCELLING) and ends later."""
        self._need_anthropic()
        sent = await self._request("POST", f"{MESSAGE_BATCHES_PATH}/{path_segment(batch_id)}/cancel",
                                   parse=parse_message_batch)
        return sent.value  # type: ignore[no-any-return]

    async def iter_message_batches(self, *, page_size: int = DEFAULT_LIST_LIMIT) -> AsyncIterator[BatchInfo]:
        """Every message batch of the workspace, newest first, a page at a time."""
        self._need_anthropic()
        if page_size < 1:
            raise ValueError(f"page_size must be at least 1, got {page_size}")
        after: str | None = None
        while True:
            params = {"limit": str(page_size)}
            if after is not None:
                params["after_id"] = after
            sent = await self._request("GET", MESSAGE_BATCHES_PATH, params=params, parse=parse_message_batch_page)
            page: BatchPage = sent.value
            for batch in page.batches:
                yield batch
            if not page.has_more or not page.batches:
                return
            after = page.batches[-1].id

    async def download_message_batch_results(self, batch_id: str, *, to: Path, timeout: float | None = None) -> Path:
        """Stream an ended batch's results JSONL to ``to`` (written beside it and renamed, so never half a file)."""
        self._need_anthropic()
        to = Path(to)
        to.parent.mkdir(parents=True, exist_ok=True)
        sent = await self._request("GET", f"{MESSAGE_BATCHES_PATH}/{path_segment(batch_id)}/results", stream_to=to,
                                   timeout=self._transfer_timeout(timeout))
        return sent.value  # type: ignore[no-any-return]
