"""One batch's life from validating to its final status, each line answered exactly as chat would answer it."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import secrets
import time
from collections.abc import Iterator
from typing import IO, Any

from aiohttp import web

from llm_dispatch.core import OPENAI_BATCH_LIMITS, BatchLimits

from ._batch_faults import (
    DEFAULT_EXPIRE_FRACTION,
    LINE_FAULTS,
    LINE_MARKER,
    OPENAI_LINE_CODES,
    line_fault_response,
)
from ._batch_store import TERMINAL, Batch, BatchStore, BatchWork, Sink, now
from ._config import ANSWER_KINDS
from ._checks import invalid_request, model_not_found, unknown_marker, validate_chat_body
from ._completions import body_digest, plan_completion, render_completion
from ._embeddings import EMBEDDINGS_PATH, embeddings_answer, embeddings_problem
from ._responses_route import RESPONSES_PATH, chat_twin, response_object
from ._http import json_dumps
from ._markers import MARKER_BYTES, marker_fault
from ._pacing import CHUNK_LINES, PaceOutcome, answer_paced, hold
from ._state import SimState

__all__ = ["BatchRun"]

logger = logging.getLogger(__name__)

# Shares of batch_processing_seconds spent validating and finalizing; in_progress gets the rest.
_VALIDATING_SHARE = 0.1
_FINALIZING_SHARE = 0.1
_MAX_VALIDATION_ERRORS = 100

# Exactly how httpx encodes a JSON body, so a batch line's body hashes to the real-time answer's digest.
_body_bytes = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


def _validation_error(code: str, message: str, *, line: int | None = None, param: str | None = None) -> dict[str, Any]:
    return {"code": code, "message": message, "param": param, "line": line}


class BatchRun(BatchWork):
    """One batch from validating to its final status, in the simulator's event loop."""

    def __init__(self, *, batch: Batch, store: BatchStore, state: SimState,
                 limits: BatchLimits = OPENAI_BATCH_LIMITS) -> None:
        super().__init__(store=store, state=state)
        self._batch = batch
        self._limits = limits

    async def run(self) -> None:
        batch = self._batch
        try:
            await self._run()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # A simulator bug must not leave a batch in_progress forever, with a client polling it.
            logger.exception("simulated batch %s failed", batch.id)
            self._finish("failed", errors=[_validation_error("simulator_error", f"The simulator failed: {exc!r}")])
        finally:
            if batch.status in TERMINAL:
                outcomes = self._state.stats.batch_outcomes
                outcomes[batch.status] = outcomes.get(batch.status, 0) + 1

    async def _run(self) -> None:
        batch = self._batch
        started = time.monotonic()
        try:
            handle = batch.input_path.open("rb")
        except FileNotFoundError:
            self._finish("failed", errors=[_validation_error(
                "file_not_found", f"The input file {batch.input_file_id} was deleted before the batch began.")])
            return
        with handle:
            errors, total = await self._validate(handle)
            await self._hold(started + self._seconds * _VALIDATING_SHARE)
            if batch.cancel_requested.is_set():
                await self._cancelled(None, None)
                return
            if batch.fault is not None and batch.fault.name == "fail_validation":
                errors = [_validation_error(
                    "simulated_validation_failure",
                    "This batch failed validation on purpose (simulator fault fail_validation).", line=1)]
            if errors:
                self._finish("failed", errors=errors)
                return
            batch.status = "in_progress"
            batch.in_progress_at = now()
            batch.total = total
            handle.seek(0)
            stem = batch.id
            output = Sink(self._store.new_path(f"{stem}-output.jsonl"))
            failures = Sink(self._store.new_path(f"{stem}-errors.jsonl"))
            try:
                outcome = await self._answer_lines(handle, output=output, failures=failures)
            finally:
                output.close()
                failures.close()
        if outcome == "cancelled":
            await self._cancelled(output, failures)
            return
        if outcome == "expired":
            self._attach(output, failures)
            self._finish("expired")
            return
        batch.status = "finalizing"
        batch.finalizing_at = now()
        finalizing = self._seconds * _FINALIZING_SHARE
        if batch.fault is not None and batch.fault.name == "slow_finalizing":
            finalizing = batch.fault.argument if batch.fault.argument is not None else self._seconds
        await self._hold(time.monotonic() + finalizing)
        if batch.cancel_requested.is_set():
            await self._cancelled(output, failures)
            return
        self._attach(output, failures)
        self._finish("completed")

    async def _validate(self, handle: IO[bytes]) -> tuple[list[dict[str, Any]], int]:
        """(errors, requests) for the input file, read line by line as OpenAI validates it."""
        errors: list[dict[str, Any]] = []
        seen: set[str] = set()
        model: str | None = None
        total = inputs = 0
        allowed = self._state.allowed_models

        def fail(code: str, message: str, line: int, param: str | None = None) -> None:
            errors.append(_validation_error(code, message, line=line, param=param))

        for number, raw in enumerate(handle, start=1):
            if number % CHUNK_LINES == 0:
                await asyncio.sleep(0)
            if len(errors) >= _MAX_VALIDATION_ERRORS:
                break
            if not raw.strip():
                continue
            total += 1
            try:
                record = json.loads(raw)
            except ValueError:
                fail("invalid_json_line", "This line is not parseable as valid JSON.", number)
                continue
            if not isinstance(record, dict):
                fail("invalid_json_line", "This line is not a JSON object.", number)
                continue
            custom_id = record.get("custom_id")
            if not isinstance(custom_id, str) or not custom_id:
                fail("missing_required_parameter", "Missing required parameter: 'custom_id'.", number, "custom_id")
                continue
            if custom_id in seen:
                fail("duplicate_custom_id",
                     "The custom_id for this request is a duplicate of another request. "
                     "The custom_id parameter must be unique for each request in a batch.", number, "custom_id")
                continue
            seen.add(custom_id)
            if record.get("method") != "POST":
                fail("invalid_method", f"Only POST is supported, got {record.get('method')!r}.", number, "method")
                continue
            if record.get("url") != self._batch.endpoint:
                fail("invalid_url", f"The URL {record.get('url')!r} does not match the batch's endpoint "
                     f"'{self._batch.endpoint}'.", number, "url")
                continue
            body = record.get("body")
            if self._batch.endpoint == EMBEDDINGS_PATH and isinstance(body, dict):
                given = body.get("input")
                inputs += len(given) if isinstance(given, list) else 1
            line_model = body.get("model") if isinstance(body, dict) else None
            if not isinstance(line_model, str) or not line_model:
                fail("missing_required_parameter", "Missing required parameter: 'body.model'.", number, "body.model")
                continue
            if model is None:
                model = line_model
                if allowed is not None and model not in allowed:
                    fail("model_not_found", f"The model `{model}` does not exist or you do not have access to it.",
                         number, "body.model")
            elif line_model != model:
                fail("mismatched_model", f"The model '{line_model}' differs from '{model}' of the batch's other "
                     "requests; a batch may use one model only.", number, "body.model")
        if not errors:
            size = os.fstat(handle.fileno()).st_size  # the path may be gone: its file was deleted
            if total == 0:
                errors.append(_validation_error("empty_file", "The input file has no requests."))
            elif total > self._limits.max_requests:
                errors.append(_validation_error(
                    "too_many_requests",
                    f"The input file has {total} requests; a batch may hold at most {self._limits.max_requests}."))
            elif inputs > self._limits.max_embedding_inputs:
                errors.append(_validation_error(
                    "too_many_embedding_inputs",
                    f"The input file has {inputs} embedding inputs; an embeddings batch may hold at most "
                    f"{self._limits.max_embedding_inputs} across its requests."))
            elif size > self._limits.max_bytes:
                errors.append(_validation_error(
                    "file_too_large", f"The input file is {size} bytes; a batch may be at most "
                    f"{self._limits.max_bytes}."))
        return errors, total

    async def _answer_lines(self, handle: IO[bytes], *, output: Sink, failures: Sink) -> PaceOutcome:
        """Answer lines paced over the in_progress share; 'done', 'expired' or 'cancelled'."""
        batch = self._batch
        total = batch.total
        stop_after: int | None = None
        if batch.fault is not None and batch.fault.name == "expire":
            fraction = batch.fault.argument if batch.fault.argument is not None else DEFAULT_EXPIRE_FRACTION
            stop_after = math.floor(total * fraction)

        def answer(record: dict[str, Any]) -> None:
            ok, line = self._answer(record)
            (output if ok else failures).write(line)
            if ok:
                batch.completed += 1
            else:
                batch.failed += 1
            self._state.stats.batch_lines += 1

        lines = _records(handle)
        # Awaited into one name first: unpacked at once, mypy infers the record type as optional.
        paced = await answer_paced(
            lines, total=total, duration=self._seconds * (1.0 - _VALIDATING_SHARE - _FINALIZING_SHARE),
            stop_after=stop_after, cancel=batch.cancel_requested, answer=answer)
        outcome, first_unanswered = paced
        if first_unanswered is not None:
            await self._expire_rest(first_unanswered, lines, failures)
        return outcome

    async def _expire_rest(self, first: dict[str, Any], rest: Iterator[dict[str, Any]], failures: Sink) -> None:
        error = {"code": "batch_expired",
                 "message": "This request could not be executed before the completion window expired."}
        failures.write(_error_line(first["custom_id"], error))
        for number, record in enumerate(rest, start=1):
            failures.write(_error_line(record["custom_id"], error))
            if number % CHUNK_LINES == 0:
                await asyncio.sleep(0)

    def _answer(self, record: dict[str, Any]) -> tuple[bool, bytes]:
        """(success, output line) for one input record: exactly what the batch's endpoint answers for its body."""
        state = self._state
        custom_id: str = record["custom_id"]
        body = record["body"]
        try:
            raw = _body_bytes(body).encode()
        except ValueError:  # NaN or Infinity: Python's JSON reader takes them, OpenAI's does not
            refused = invalid_request("The body contains a number JSON cannot hold (NaN or Infinity).",
                                      param="body", code="invalid_value")
            return False, self._response_line(custom_id, refused.status, refused.body)
        digest = body_digest(raw, state=state)
        kind = None
        if MARKER_BYTES in raw:
            forced = self._marker_fault(body, digest)
            if isinstance(forced, str) and forced in OPENAI_LINE_CODES:
                return False, _error_line(custom_id, {
                    "code": OPENAI_LINE_CODES[forced],
                    "message": f"This request was stopped inside the batch (simulator marker [[sim:{forced}]])."})
            if isinstance(forced, web.Response):
                return False, self._response_line(custom_id, forced.status, forced.body)
            if forced in ANSWER_KINDS:
                kind = forced  # a batch line has no latency or connection: slow and cut are plain answers
            elif forced is not None:
                refused = line_fault_response(forced, model=str(body.get("model")))
                return False, self._response_line(custom_id, refused.status, refused.body)
        if self._batch.endpoint == EMBEDDINGS_PATH:
            return self._embedding_line(custom_id, body)
        responses = self._batch.endpoint == RESPONSES_PATH
        if responses:
            twin = chat_twin(body)
            if isinstance(twin, str):
                refused = invalid_request(twin, param="input", code="invalid_value")
                return False, self._response_line(custom_id, refused.status, refused.body)
            body = twin
        # A responses line is checked as its chat twin but for its tools (the Responses API takes them with reasoning).
        invalid = validate_chat_body({k: v for k, v in body.items() if not responses or k not in ("tools", "tool_choice")})
        if invalid is None and state.allowed_models is not None and body["model"] not in state.allowed_models:
            invalid = model_not_found(body["model"])
        if invalid is not None:
            return False, self._response_line(custom_id, invalid.status, invalid.body)
        # Chat's answer without latency, quotas and random faults, which a batch does not meet.
        completion, _ = render_completion(plan_completion(
            body, digest=digest, kind=kind, invalid_json_rate=state.config.invalid_json_rate), state=state)
        if responses:
            answer = json.loads(completion)
            completion = json_dumps(response_object(
                answer, response_id="resp_" + answer["id"].removeprefix("chatcmpl-"))).encode()
        return True, self._response_line(custom_id, 200, completion)

    def _embedding_line(self, custom_id: str, body: dict[str, Any]) -> tuple[bool, bytes]:
        problem = embeddings_problem(body)
        if problem is not None:
            message, param, code = problem
            refused = invalid_request(message, param=param, code=code)
            return False, self._response_line(custom_id, refused.status, refused.body)
        answer, tokens = embeddings_answer(body)
        self._state.stats.prompt_tokens += tokens
        self._state.stats.embedding_inputs += len(answer["data"])
        return True, self._response_line(custom_id, 200, json_dumps(answer).encode())

    def _marker_fault(self, body: dict[str, Any], digest: bytes) -> str | web.Response | None:
        given = body.get("input")
        # An embeddings line's inputs stand for its messages: markers work in them as in a chat line's.
        messages = ([{"role": "user", "content": text} for text in ([given] if isinstance(given, str) else given)]
                    if isinstance(given, (str, list)) else body.get("messages"))
        return marker_fault(messages, digest=digest, hits=self._state.marker_hits, pattern=LINE_MARKER,
                            allowed=LINE_FAULTS, where="in a batch ", refuse=unknown_marker)

    def _response_line(self, custom_id: str, status: int, body: Any) -> bytes:
        return b"".join((
            b'{"id":"batch_req_', secrets.token_hex(16).encode(), b'","custom_id":', json_dumps(custom_id).encode(),
            b',"response":{"status_code":', str(status).encode(), b',"request_id":"',
            self._state.next_request_id().encode(), b'","body":', bytes(body),
            b'},"error":null}\n',
        ))

    def _attach(self, output: Sink | None, failures: Sink | None) -> None:
        """Make the written files downloadable; an empty one gets no id, as OpenAI leaves it null."""
        batch = self._batch
        for sink, kind in ((output, "output"), (failures, "error")):
            if sink is None:
                continue
            if sink.lines == 0:
                sink.path.unlink(missing_ok=True)
                continue
            stored = self._store.add_file(
                path=sink.path, size=sink.size, filename=f"{batch.id}_{kind}.jsonl", purpose="batch_output"
            )
            if kind == "output":
                batch.output_file_id = stored.id
            else:
                batch.error_file_id = stored.id

    async def _cancelled(self, output: Sink | None, failures: Sink | None) -> None:
        # "cancelling" is visible for a moment, as it is (for much longer) at OpenAI.
        await asyncio.sleep(self._seconds * _FINALIZING_SHARE)
        self._attach(output, failures)
        self._finish("cancelled")

    def _finish(self, status: str, *, errors: list[dict[str, Any]] | None = None) -> None:
        batch = self._batch
        batch.status = status
        setattr(batch, f"{status}_at", now())
        if errors:
            batch.errors = errors

    async def _hold(self, until: float) -> None:
        await hold(until, cancel=self._batch.cancel_requested)


def _records(handle: IO[bytes]) -> Iterator[dict[str, Any]]:
    # Already validated, so every non-blank line is a well-formed record.
    for raw in handle:
        if raw.strip():
            yield json.loads(raw)


def _error_line(custom_id: str, error: dict[str, str]) -> bytes:
    line = {"id": f"batch_req_{secrets.token_hex(16)}", "custom_id": custom_id, "response": None, "error": error}
    return json_dumps(line).encode() + b"\n"
