"""Files and batches of one simulator: their API objects, and the temporary directory that holds their bytes.

One store per app (``batch_store``), shared by OpenAI's Batch API and Anthropic's Message Batches: its
directory, its running batches' tasks and its queue of batch faults serve both.
"""

from __future__ import annotations

import asyncio
import secrets
import shutil
import tempfile
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar

from aiohttp import web

from ._batch_faults import BatchFault
from ._state import SimState

__all__ = [
    "COMPLETION_WINDOW",
    "TERMINAL",
    "WINDOW_SECONDS",
    "Batch",
    "BatchStore",
    "BatchWork",
    "Sink",
    "StoredFile",
    "batch_store",
    "now",
    "requested_page",
]

# The only completion window OpenAI's Batch API offers, and how long it is.
COMPLETION_WINDOW = "24h"
WINDOW_SECONDS = 24 * 3600
TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})
_WRITE_BUFFER = 1024 * 1024


_Listed = TypeVar("_Listed")


def requested_page(
    items: Mapping[str, _Listed], query: Mapping[str, str], *, cursor: str, maximum: int,
    to_api: Callable[[_Listed], dict[str, Any]], default: int = 20,
) -> dict[str, Any] | None:
    """The page of ``items`` a listing's query asks for (``newest_page``): after the id in its ``cursor`` value, as
    many as its ``limit`` (``default`` if absent); None when that limit is not an integer from 1 to ``maximum``."""
    limit = _list_limit(query.get("limit"), default=default, maximum=maximum)
    if limit is None:
        return None
    return newest_page(items, after=query.get(cursor), limit=limit, to_api=to_api)


def _list_limit(raw: str | None, *, default: int, maximum: int) -> int | None:
    """A listing's ``limit`` query value as an integer from 1 to ``maximum`` (``default`` if absent), else None."""
    if raw is None:
        return default
    try:
        limit = int(raw)
    except ValueError:
        return None
    return limit if 1 <= limit <= maximum else None


def newest_page(
    items: Mapping[str, _Listed], *, after: str | None, limit: int, to_api: Callable[[_Listed], dict[str, Any]]
) -> dict[str, Any]:
    """A page of ``items`` (id -> item, in creation order) newest first, after the cursor id, as both providers
    list batches: ``{"data", "first_id", "last_id", "has_more"}``. An unknown cursor (a batch forgotten by a
    reset) ends the listing rather than restarting it."""
    ids = list(items)[::-1]
    start = 0
    if after:
        start = ids.index(after) + 1 if after in items else len(ids)
    page = ids[start : start + limit]
    return {
        "data": [to_api(items[item_id]) for item_id in page],
        "first_id": page[0] if page else None,
        "last_id": page[-1] if page else None,
        "has_more": start + limit < len(ids),
    }


def now() -> int:
    return int(time.time())


@dataclass(slots=True)
class StoredFile:
    id: str
    path: Path
    bytes: int
    filename: str
    purpose: str
    created_at: int

    def to_api(self) -> dict[str, Any]:
        return {
            "id": self.id, "object": "file", "bytes": self.bytes, "created_at": self.created_at,
            "filename": self.filename, "purpose": self.purpose, "status": "processed", "status_details": None,
            "expires_at": None,
        }


@dataclass(slots=True, kw_only=True)
class Batch:
    id: str
    input_file_id: str
    input_path: Path
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None
    fault: BatchFault | None
    created_at: int
    status: str = "validating"
    output_file_id: str | None = None
    error_file_id: str | None = None
    in_progress_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    total: int = 0
    completed: int = 0
    failed: int = 0
    errors: list[dict[str, Any]] = field(default_factory=list)
    cancel_requested: asyncio.Event = field(default_factory=asyncio.Event)

    def to_api(self) -> dict[str, Any]:
        return {
            "id": self.id, "object": "batch", "endpoint": self.endpoint,
            "errors": {"object": "list", "data": self.errors} if self.errors else None,
            "input_file_id": self.input_file_id, "completion_window": self.completion_window,
            "status": self.status, "output_file_id": self.output_file_id, "error_file_id": self.error_file_id,
            "created_at": self.created_at, "in_progress_at": self.in_progress_at,
            "expires_at": self.created_at + WINDOW_SECONDS, "finalizing_at": self.finalizing_at,
            "completed_at": self.completed_at, "failed_at": self.failed_at, "expired_at": self.expired_at,
            "cancelling_at": self.cancelling_at, "cancelled_at": self.cancelled_at,
            "request_counts": {"total": self.total, "completed": self.completed, "failed": self.failed},
            "metadata": self.metadata,
        }


class Sink:
    """An output or error file being written; becomes a file object only if it got a line."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lines = 0
        self.size = 0
        self._handle: IO[bytes] = path.open("wb", _WRITE_BUFFER)

    def write(self, line: bytes) -> None:
        self._handle.write(line)
        self.lines += 1
        self.size += len(line)

    def close(self) -> None:
        self._handle.close()


class BatchStore:
    """Files and batches of one simulator, in a temporary directory it owns."""

    def __init__(self, state: SimState) -> None:
        self._state = state
        self._directory: Path | None = None
        self.files: dict[str, StoredFile] = {}
        self.batches: dict[str, Batch] = {}  # in creation order
        self.queued_faults: deque[BatchFault] = deque()
        # Batch id -> the server error every GET and cancel of it answers (POST /_sim/batch_trouble, or the batch
        # fault ``unreachable``), and for how many more of them when counted.
        self.troubled: dict[str, int] = {}
        self.trouble_left: dict[str, int] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def make_trouble(self, batch_id: str, status: int | None, *, times: int | None = None) -> None:
        """Answer the GETs and cancels of ``batch_id`` with ``status`` (None: heal it), the next ``times`` of them only
        when given: a count, not a time, so a test's client meets it however slow the machine."""
        self.trouble_left.pop(batch_id, None)
        if status is None:
            self.troubled.pop(batch_id, None)
            return
        self.troubled[batch_id] = status
        if times is not None:
            self.trouble_left[batch_id] = times

    def trouble(self, batch_id: str) -> int | None:
        """The server error this call about ``batch_id`` answers, if any (a counted trouble counts it)."""
        status = self.troubled.get(batch_id)
        left = self.trouble_left.get(batch_id)
        if status is not None and left is not None:
            if left <= 1:
                self.make_trouble(batch_id, None)
            else:
                self.trouble_left[batch_id] = left - 1
        return status

    def new_path(self, name: str) -> Path:
        if self._directory is None or not self._directory.exists():
            self._directory = Path(tempfile.mkdtemp(prefix="llm-dispatch-sim-batch-"))
        return self._directory / name

    def add_file(self, *, path: Path, size: int, filename: str, purpose: str) -> StoredFile:
        stored = StoredFile(
            id=f"file-{secrets.token_hex(12)}", path=path, bytes=size, filename=filename, purpose=purpose,
            created_at=now(),
        )
        self.files[stored.id] = stored
        return stored

    def start(self, coroutine: Any) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def reset(self) -> None:
        """Forget every file and batch (POST /_sim/reset); running batches stop where they are."""
        for task in self._tasks:
            task.cancel()
        self.files.clear()
        self.batches.clear()
        self.queued_faults.clear()
        self.troubled.clear()
        self.trouble_left.clear()
        directory, self._directory = self._directory, None
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)

    async def close(self, app: web.Application) -> None:
        tasks = list(self._tasks)
        self.reset()
        await asyncio.gather(*tasks, return_exceptions=True)


class BatchWork:
    """What a batch's run works with: the store its files go to, the simulator's state, and how long a batch takes."""

    def __init__(self, *, store: BatchStore, state: SimState) -> None:
        self._store = store
        self._state = state
        # Read once: a config change applies to the next batch, not halfway through this one.
        self._seconds = state.config.batch_processing_seconds


_BATCH_STORE = web.AppKey("batch_store", BatchStore)


def batch_store(app: web.Application, state: SimState) -> BatchStore:
    """The app's one store, made on first use: cleared by ``/_sim/reset``, closed with the app."""
    store = app.get(_BATCH_STORE)
    if store is None:
        store = app[_BATCH_STORE] = BatchStore(state)
        state.reset_hooks.append(store.reset)
        app.on_cleanup.append(store.close)
    return store
