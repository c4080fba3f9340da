"""One Message Batch: its API object, and its life from ``in_progress`` to ``ended``, each request answered
exactly as ``POST /v1/messages`` answers its ``params``."""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llm_dispatch.core import DEFAULT_ANTHROPIC_VERSION

from ._anthropic_checks import model_refusal
from ._anthropic_http import error_payload, rfc3339
from ._batch_faults import DEFAULT_EXPIRE_FRACTION, LINE_ERROR_MARKER, LINE_FAULTS, LINE_MARKER, BatchFault
from ._config import ANSWER_KINDS
from ._batch_store import WINDOW_SECONDS, BatchStore, BatchWork, Sink
from ._http import json_dumps
from ._markers import MARKER_BYTES, marker_fault
from ._messages import message_digest, plan_message, render_message
from ._pacing import CHUNK_LINES, answer_paced, hold
from ._state import SimState

__all__ = ["MessageBatch", "MessageBatchRun", "MessageRequest", "new_batch_id"]

logger = logging.getLogger(__name__)

# Share of batch_processing_seconds a canceled batch stays "canceling" before it ends.
_CANCELING_SHARE = 0.1
# Marker faults that have no status of their own: a batch has no connection to hang, drop or garble.
_LINE_STATUS = {"hang": 500, "drop": 500, "malformed": 500, LINE_ERROR_MARKER: 500, "line_timeout": 504,
                "insufficient_quota": 429}
_STOPPED = {"line_cancelled": "canceled", "line_expired": "expired"}


def new_batch_id() -> str:
    return f"msgbatch_sim{secrets.token_hex(12)}"


@dataclass(frozen=True, slots=True)
class MessageRequest:
    custom_id: str
    params: dict[str, Any]


@dataclass(slots=True, kw_only=True)
class MessageBatch:
    id: str
    requests: list[MessageRequest]
    fault: BatchFault | None
    created_at: float
    processing_status: str = "in_progress"
    succeeded: int = 0
    errored: int = 0
    canceled: int = 0
    expired: int = 0
    ended_at: float | None = None
    cancel_initiated_at: float | None = None
    results_path: Path | None = None
    cancel_requested: asyncio.Event = field(default_factory=asyncio.Event)
    # The anthropic-version of the create: what a request's model refuses depends on it.
    version: str = DEFAULT_ANTHROPIC_VERSION

    @property
    def processing(self) -> int:
        return len(self.requests) - self.succeeded - self.errored - self.canceled - self.expired

    def to_api(self, *, origin: str) -> dict[str, Any]:
        """The MessageBatch object; ``origin`` (``http://host:port``) makes ``results_url`` absolute."""
        ended = self.processing_status == "ended"
        return {
            "id": self.id,
            "type": "message_batch",
            "processing_status": self.processing_status,
            "request_counts": {
                "processing": self.processing, "succeeded": self.succeeded, "errored": self.errored,
                "canceled": self.canceled, "expired": self.expired,
            },
            "ended_at": rfc3339(self.ended_at) if self.ended_at is not None else None,
            "created_at": rfc3339(self.created_at),
            "expires_at": rfc3339(self.created_at + WINDOW_SECONDS),
            "cancel_initiated_at": rfc3339(self.cancel_initiated_at) if self.cancel_initiated_at is not None else None,
            "archived_at": None,
            "results_url": f"{origin}/v1/messages/batches/{self.id}/results" if ended else None,
        }


class MessageBatchRun(BatchWork):
    """One Message Batch from creation to ``ended``, in the simulator's event loop."""

    def __init__(self, *, batch: MessageBatch, store: BatchStore, state: SimState) -> None:
        super().__init__(store=store, state=state)
        self._batch = batch

    async def run(self) -> None:
        batch = self._batch
        sink = Sink(self._store.new_path(f"{batch.id}-results.jsonl"))
        try:
            await self._answer_all(sink)
        except asyncio.CancelledError:
            raise
        except Exception:
            # A simulator bug must not leave a batch in_progress forever, with a client polling it.
            logger.exception("simulated message batch %s failed", batch.id)
            batch.errored += batch.processing
        finally:
            sink.close()
        batch.results_path = sink.path
        batch.processing_status = "ended"
        batch.ended_at = time.time()

    async def _answer_all(self, sink: Sink) -> None:
        batch = self._batch
        total = len(batch.requests)
        stop_after: int | None = None
        if batch.fault is not None and batch.fault.name == "expire":
            fraction = batch.fault.argument if batch.fault.argument is not None else DEFAULT_EXPIRE_FRACTION
            stop_after = math.floor(total * fraction)

        # The requests are answered a wave at a time (``SimulatorConfig.batch_cache_wave``): what a wave writes to
        # the prompt cache turns warm once the whole wave is answered.
        width = self._state.config.batch_cache_wave
        wave: list[bytes] = []
        answered = 0

        def answer(request: MessageRequest) -> None:
            nonlocal answered
            state = self._state
            state.cache_wave = None if width is None else wave
            try:
                ok, line = self._answer(request)
            finally:
                state.cache_wave = None
            answered += 1
            if width is not None and answered % width == 0:
                self._settle(wave)
            sink.write(line)
            if ok:
                batch.succeeded += 1
            else:
                batch.errored += 1
            self._state.stats.message_batch_lines += 1

        pending = iter(batch.requests)
        # Awaited into one name first: unpacked at once, mypy infers the record type as optional.
        paced = await answer_paced(
            pending, total=total, duration=self._seconds, stop_after=stop_after, cancel=batch.cancel_requested,
            answer=answer)
        outcome, first_unanswered = paced
        self._settle(wave)
        if outcome == "expired":
            if first_unanswered is not None:
                await self._close_out(first_unanswered, pending, sink=sink, kind="expired")
            return
        if outcome == "cancelled":
            # "canceling" is visible for a moment, as it is (for much longer) at Anthropic.
            await asyncio.sleep(self._seconds * _CANCELING_SHARE)
            await self._close_out(None, pending, sink=sink, kind="canceled")
            return
        if batch.fault is not None and batch.fault.name == "slow_finalizing":
            # Every request is answered, yet the batch stays in_progress that long (cancel ends it at once).
            seconds = batch.fault.argument if batch.fault.argument is not None else self._seconds
            await hold(time.monotonic() + seconds, cancel=batch.cancel_requested)

    def _settle(self, wave: list[bytes]) -> None:
        """The prefixes ``wave`` wrote turn warm now, its requests answered."""
        now = time.monotonic()
        for digest in wave:
            self._state.prompt_cache.settle(digest, answered_at=now)
        wave.clear()

    async def _close_out(
        self, first: MessageRequest | None, rest: Iterator[MessageRequest], *, sink: Sink, kind: str
    ) -> None:
        """Write a ``canceled`` or ``expired`` result for each request never answered."""
        batch = self._batch
        requests = rest if first is None else itertools.chain((first,), rest)
        for number, request in enumerate(requests, start=1):
            sink.write(b'{"custom_id":%s,"result":{"type":"%s"}}\n' % (json_dumps(request.custom_id).encode(),
                                                                        kind.encode()))
            setattr(batch, kind, getattr(batch, kind) + 1)
            if number % CHUNK_LINES == 0:
                await asyncio.sleep(0)

    def _answer(self, request: MessageRequest) -> tuple[bool, bytes]:
        """(succeeded, results line): what ``POST /v1/messages`` answers for these params, without latency,
        quotas and random faults, which a batch does not meet."""
        state = self._state
        params = request.params
        digest = message_digest(params, state=state)
        error: dict[str, Any] | None = None
        kind = None
        custom_id = json_dumps(request.custom_id).encode()
        if MARKER_BYTES in json_dumps(params.get("messages")).encode():
            forced = marker_fault(params.get("messages"), digest=digest, hits=state.marker_hits, pattern=LINE_MARKER,
                                  allowed=LINE_FAULTS, where="in a batch ",
                                  refuse=lambda text: error_payload(400, text))
            if isinstance(forced, dict):
                error = forced
            elif forced in _STOPPED:
                # Never answered: canceled or expired results, as a stopped batch writes them.
                return False, b'{"custom_id":%s,"result":{"type":"%s"}}\n' % (custom_id, _STOPPED[forced].encode())
            elif forced in ANSWER_KINDS:
                kind = forced  # a batch line has no latency or connection: slow and cut are plain answers
            elif forced is not None:
                error = error_payload(_LINE_STATUS.get(forced) or int(forced))
        if error is None and state.allowed_models is not None and params["model"] not in state.allowed_models:
            error = error_payload(404, f"model: {params['model']}")
        if error is None:
            # What the model refuses is an errored result of its own, as a Message Batch answers it: the create
            # checks only the shape of each request.
            refused = model_refusal(params, version=self._batch.version)
            if refused is not None:
                error = error_payload(400, refused)
        if error is not None:
            return False, b'{"custom_id":%s,"result":{"type":"errored","error":%s}}\n' % (
                custom_id, json_dumps(error).encode())
        message, _ = render_message(plan_message(
            params, digest=digest, kind=kind, invalid_json_rate=self._state.config.invalid_json_rate), state=state, batch=True)
        return True, b'{"custom_id":%s,"result":{"type":"succeeded","message":%s}}\n' % (custom_id, message)

