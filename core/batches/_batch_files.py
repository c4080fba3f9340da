"""Batch API files on disk: JSONL input files written a line at a time, and output/error files read a line at a time.

Neither side ever holds a whole file in memory: a 50,000-request input is streamed to disk as it is
built, and a provider's output is parsed line by line into ``BatchLine`` values.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from .._batch_types import DEFAULT_BATCH_LIMITS, BatchLimits
from ..wire._embeddings import embedding_result_from_body, embeddings_body
from .._endpoints import DEFAULT_ENDPOINT, batch_url
from ..rules._model_rules import openai_body
from ..wire._openai_responses import response_result_from_body, responses_body
from ..wire._responses import chat_result_from_body
from .._exceptions import APIResponseValidationError
from .._json import compact_json, read_json
from .._constants import RAW_BODY_CHARS
from ..wire._line_errors import openai_line_error
from ..wire._packing import unpack_embeddings
from .._types import ChatRequest, ChatResult

__all__ = [
    "INVALID_OUTPUT_LINE",
    "UNUSABLE_ANSWER",
    "BatchFile",
    "BatchFileWriter",
    "BatchLine",
    "garbled_line",
    "unusable_line",
    "read_batch_output",
    "read_result_lines",
    "unpack_line",
    "write_batch_files",
]

# The code a BatchLine carries when the provider's line could not be read at all.
INVALID_OUTPUT_LINE = "invalid_output_line"
# The code of a 2xx line whose body is not an answer: billed, so never sent again.
UNUSABLE_ANSWER = "unusable_answer"

_WRITE_BUFFER = 1024 * 1024
_FILE_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True, slots=True)
class BatchFile:
    """One input file ready to upload: a single model and endpoint, within the provider's limits."""

    path: Path
    model: str
    custom_ids: list[str]
    requests: int
    bytes: int
    endpoint: str = DEFAULT_ENDPOINT


@dataclass(frozen=True, slots=True)
class BatchLine:
    """One line of a batch output or error file: a result, or why there is none.

    ``line`` is the 1-based line number in the file read, so a garbled line can still be found. ``billed`` says
    whether the provider billed a line without an answer (None: it does not say; see ``_line_errors``).
    """

    custom_id: str | None
    result: ChatResult | None
    error_code: str | None
    error_message: str | None
    status_code: int | None
    retryable: bool
    line: int = 0
    billed: bool | None = False
    # What a billed line with no answer said it used (a ChatResult with no text), for its cost; and its body's
    # start, for inspection.
    usage: ChatResult | None = None
    raw_body: str | None = None

    @property
    def ok(self) -> bool:
        return self.result is not None


@dataclass(slots=True)
class _Writer:
    """The file being filled for one model and endpoint."""

    index: int
    model: str
    endpoint: str
    path: Path
    handle: IO[bytes]
    custom_ids: list[str] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)
    size: int = 0
    inputs: int = 0  # an embeddings file's texts (a packed line holds several)

    def fits(self, line_bytes: int, inputs: int, limits: BatchLimits) -> bool:
        return (len(self.custom_ids) < limits.max_requests and self.size + line_bytes <= limits.max_bytes
                and self.inputs + inputs <= limits.max_embedding_inputs)

    def write(self, custom_id: str, line: bytes, inputs: int) -> None:
        self.handle.write(line)
        self.custom_ids.append(custom_id)
        self.seen.add(custom_id)
        self.size += len(line)
        self.inputs += inputs

    def finish(self) -> tuple[int, BatchFile]:
        self.handle.close()
        file = BatchFile(
            path=self.path, model=self.model, custom_ids=self.custom_ids, requests=len(self.custom_ids), bytes=self.size,
            endpoint=self.endpoint,
        )
        return self.index, file


class BatchFileWriter:
    """Batch API input files written a line at a time, for a caller that records each file as it is done.

    Requests are grouped by model and endpoint (a batch holds one of each, its lines' ``url`` the endpoint's), with
    one file open per model and endpoint; a
    file is closed and the next one started when the next line would pass ``limits.max_requests`` or
    ``limits.max_bytes`` (or, for embeddings, ``limits.max_embedding_inputs`` texts over its lines), and ``add``
    returns the file it closed. ``close`` returns the files still open,
    ``discard`` removes them. A duplicate ``custom_id`` within a file, an empty one, or a request too
    large for any file raises ``ValueError`` and writes nothing. Files are named
    ``{prefix}-{n:05d}-{model}.jsonl``; an existing file of that name is replaced.
    """

    def __init__(
        self,
        *,
        directory: Path,
        limits: BatchLimits = DEFAULT_BATCH_LIMITS,
        prefix: str = "batch",
    ) -> None:
        self.directory = Path(directory)
        self.limits = limits
        self.prefix = prefix
        self._serial = itertools.count(1)
        self._open: dict[tuple[str, str], _Writer] = {}

    def add(self, custom_id: str, request: ChatRequest) -> BatchFile | None:
        """Write one line; returns its model's previous file when this line did not fit in it."""
        if not isinstance(custom_id, str) or not custom_id:
            raise ValueError(f"custom_id must be a non-empty string, got {custom_id!r}")
        line = _input_line(custom_id, request)
        if len(line) > self.limits.max_bytes:
            raise ValueError(
                f"request {custom_id!r} is {len(line)} bytes as a batch line, more than the {self.limits.max_bytes} "
                "bytes a batch file may hold; send it in real time instead"
            )
        finished = None
        key = (request.model, request.endpoint)
        inputs = len(request.messages) if request.endpoint == "embeddings" else 0
        if inputs > self.limits.max_embedding_inputs:
            raise ValueError(f"request {custom_id!r} holds {inputs} texts, more than the "
                             f"{self.limits.max_embedding_inputs} an embeddings batch may hold")
        writer = self._open.get(key)
        if writer is not None and not writer.fits(len(line), inputs, self.limits):
            finished = self._open.pop(key).finish()[1]
            writer = None
        if writer is None:
            self.directory.mkdir(parents=True, exist_ok=True)
            index = next(self._serial)
            kind = "" if request.endpoint == DEFAULT_ENDPOINT else f"-{request.endpoint}"
            path = self.directory / f"{self.prefix}-{index:05d}-{_FILE_NAME_UNSAFE.sub('_', request.model)}{kind}.jsonl"
            writer = _Writer(index=index, model=request.model, endpoint=request.endpoint, path=path,
                             handle=path.open("wb", _WRITE_BUFFER))
            self._open[key] = writer
        if custom_id in writer.seen:
            raise ValueError(
                f"duplicate custom_id {custom_id!r}: each request in a batch needs its own id to match its answer"
            )
        writer.write(custom_id, line, inputs)
        return finished

    def close(self) -> list[BatchFile]:
        """Finish the files still open, in creation order."""
        done = sorted((writer.finish() for writer in self._open.values()), key=lambda item: item[0])
        self._open.clear()
        return [file for _, file in done]

    def discard(self) -> None:
        """Close and remove the files still open (those ``add`` returned are the caller's)."""
        for writer in self._open.values():
            writer.handle.close()
            writer.path.unlink(missing_ok=True)
        self._open.clear()


def write_batch_files(
    requests: Iterable[tuple[str, ChatRequest]],
    *,
    directory: Path,
    limits: BatchLimits = DEFAULT_BATCH_LIMITS,
    prefix: str = "batch",
) -> list[BatchFile]:
    """Write ``(custom_id, request)`` pairs as Batch API input files under ``directory`` (see
    ``BatchFileWriter``), in creation order. A ``custom_id`` repeated anywhere in ``requests`` raises
    ``ValueError`` and, like any error, removes every file this call wrote.
    """
    writer = BatchFileWriter(directory=directory, limits=limits, prefix=prefix)
    seen: set[str] = set()
    finished: list[BatchFile] = []
    try:
        for custom_id, request in requests:
            if custom_id in seen:
                raise ValueError(
                    f"duplicate custom_id {custom_id!r}: each request in a batch needs its own id to match its answer"
                )
            seen.add(custom_id)
            file = writer.add(custom_id, request)
            if file is not None:
                finished.append(file)
        finished += writer.close()
    except BaseException:
        # Half a set of files is worse than none: a caller might upload what is there and lose the rest.
        writer.discard()
        for file in finished:
            file.path.unlink(missing_ok=True)
        raise
    return sorted(finished, key=lambda file: file.path.name)


def _input_line(custom_id: str, request: ChatRequest) -> bytes:
    body = _BODIES.get(request.endpoint, openai_body)(request)
    record = {"custom_id": custom_id, "method": "POST", "url": batch_url(request.endpoint), "body": body}
    try:
        # Encoded as httpx encodes a chat body, so a batch line and a real-time call send the same bytes.
        return compact_json(record).encode("utf-8") + b"\n"
    except (ValueError, TypeError) as exc:  # NaN, a lone surrogate, an object JSON cannot hold
        raise ValueError(f"request {custom_id!r} cannot be written as JSON: {exc}") from exc


# Each endpoint's body (a line's, the same as a real-time call's) and its answer's reader; chat's are the defaults.
_BODIES: dict[str, Callable[[ChatRequest], dict[str, Any]]] = {"embeddings": embeddings_body,
                                                                 "responses": responses_body}
_ANSWERS: dict[str, Callable[[Any], ChatResult | None]] = {"embeddings": embedding_result_from_body,
                                                          "responses": response_result_from_body}


def read_batch_output(path: Path, *, endpoint: str = DEFAULT_ENDPOINT) -> Iterator[BatchLine]:
    """Every record of a batch output or error file, in file order, each answer read as ``endpoint``'s (the batch's:
    a file holds one); blank lines are skipped.

    A line that cannot be read becomes a ``BatchLine`` with ``error_code == INVALID_OUTPUT_LINE``
    (and its custom_id when that much could be read), so one bad line never costs the others.
    """
    batch_url(endpoint)  # an endpoint this version cannot read: refused, never read as chat
    answer = _ANSWERS.get(endpoint)
    if answer is None:
        return read_result_lines(path, _read_record)

    def read(body: Any) -> ChatResult:
        result = answer(body)
        if result is None:
            raise APIResponseValidationError(f"the body is no {endpoint} answer: {str(body)[:300]!r}")
        return result

    return read_result_lines(path, functools.partial(_read_record, read=read))


def read_result_lines(path: Path, read: Callable[[dict[str, Any], str, int], BatchLine], *,
                      key: str = "custom_id") -> Iterator[BatchLine]:
    """Each non-blank line of a results JSONL file as ``read(record, custom_id, line_number)`` makes it, once it
    is a JSON object with a custom_id (in its field ``key``); any other line is a garbled ``BatchLine``."""
    with Path(path).open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            try:
                record = read_json(raw)
            except ValueError as exc:  # also UnicodeDecodeError
                yield garbled_line(None, number, f"not JSON ({exc})")
                continue
            if not isinstance(record, dict):
                yield garbled_line(None, number, "not a JSON object")
                continue
            custom_id = record.get(key)
            if not isinstance(custom_id, str) or not custom_id:
                yield garbled_line(None, number, f"no {key}")
                continue
            yield read(record, custom_id, number)


def _read_record(record: dict[str, Any], custom_id: str, number: int,
                 read: Callable[[Any], ChatResult] = chat_result_from_body) -> BatchLine:
    error = record.get("error")
    response = record.get("response")
    if error is not None:
        if not isinstance(error, dict):
            return garbled_line(custom_id, number, f"error is not an object: {error!r}")
        code = str(error.get("code") or "unknown_error")
        rule = openai_line_error(code)
        return BatchLine(
            custom_id=custom_id, result=None, error_code=code, error_message=_text(error.get("message")),
            status_code=None, retryable=rule.retry, line=number, billed=rule.billed,
        )
    if not isinstance(response, dict):
        return garbled_line(custom_id, number, "neither a response nor an error")
    status = response.get("status_code")
    if isinstance(status, bool) or not isinstance(status, int):
        return garbled_line(custom_id, number, f"response.status_code is not an integer: {status!r}")
    body = response.get("body")
    if 200 <= status < 300:
        try:
            result = read(body)
        except APIResponseValidationError as exc:
            return unusable_line(custom_id, number, status, exc.message, usage=exc.usage, body=body)
        return BatchLine(
            custom_id=custom_id, result=result, error_code=None, error_message=None, status_code=status,
            retryable=False, line=number,
        )
    code, message = _body_error(body, status)
    rule = openai_line_error(code, status=status)
    return BatchLine(
        custom_id=custom_id, result=None, error_code=code, error_message=message, status_code=status,
        retryable=rule.retry, line=number, billed=rule.billed,
    )


def unusable_line(
    custom_id: str, number: int, status: int, reason: str, *, usage: ChatResult | None = None, body: Any = None
) -> BatchLine:
    """A line the provider answered (a 2xx, so billed) with a body that is no answer: failed, never sent again;
    ``usage``: what the body said it used, priced with the failure; ``body`` kept (its start) for inspection."""
    try:
        raw = None if body is None else compact_json(body)[:RAW_BODY_CHARS]
    except (TypeError, ValueError):
        raw = repr(body)[:RAW_BODY_CHARS]
    return BatchLine(custom_id=custom_id, result=None, error_code=UNUSABLE_ANSWER,
                     error_message=f"line {number} answered {status} with no usable answer ({reason}); it was "
                                   "billed, so it is not sent again: --retry-failed all would",
                     status_code=status, retryable=False, line=number, billed=True, usage=usage, raw_body=raw)


def _body_error(body: Any, status: int) -> tuple[str, str]:
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        code = error.get("code") or error.get("type") or f"http_{status}"
        return str(code), _text(error.get("message")) or f"HTTP {status}"
    return f"http_{status}", f"HTTP {status}: {str(body)[:300]}"


def _text(value: Any) -> str:
    return value if isinstance(value, str) else "" if value is None else str(value)


def garbled_line(custom_id: str | None, number: int, reason: str) -> BatchLine:
    return BatchLine(
        custom_id=custom_id,
        result=None,
        error_code=INVALID_OUTPUT_LINE,
        error_message=f"line {number} is not a usable batch output record: {reason}",
        status_code=None,
        # The answer is lost, not refused: the request can be sent again if its id is known.
        retryable=custom_id is not None,
        line=number,
    )


def unpack_line(
    line: BatchLine, *, texts: Sequence[str], members: Sequence[tuple[int, str]]
) -> list[tuple[str, BatchLine]]:
    """A packed batch line (its ``texts`` in input order) as a line per member ``(index, name)`` asked for: an answer
    split by ``unpack_embeddings``; an error as it is, each member's; an answer with a vector count other than the
    texts' an unusable line (billed, never sent again), its usage kept once, on the first member."""
    if line.result is None:
        return [(name, dataclasses.replace(line, custom_id=name)) for _, name in members]
    try:
        parts = unpack_embeddings(line.result, texts)
    except APIResponseValidationError as exc:
        return [(name, unusable_line(name, line.line, line.status_code or 200, exc.message,
                                     usage=exc.usage if number == 0 else None))
                for number, (_, name) in enumerate(members)]
    return [(name, dataclasses.replace(line, custom_id=name, result=parts[index])) for index, name in members]
