"""The one exception hierarchy of llm-dispatch; every message says what to do next.

Every error llm-dispatch raises for a user to read is one of these; the CLI prints any of them as one line
and an exit code (``llm-dispatch --debug`` shows the traceback). ``tests/test_exceptions.py`` checks that
this drawing names every class below and nothing else.

    LLMDispatchError                base of them all; never raised itself
    ├── ConfigError                 bad settings (unknown model, missing key, bad URL, bad price file)
    │   └── DatabaseError           a database URL that cannot be used, a database that cannot be opened
    ├── InputError                  a prompt file that cannot be used; names file, line, field
    ├── UnknownJobError             no job of that id in the database
    ├── UnknownBatchError           no batch of that id in the database
    ├── UnknownPromptError          prompt ids (answers to store, batch members) gone from the database
    ├── BudgetExceededError         the estimate is above --max-cost; nothing was sent
    ├── ShardRunsFailedError        real-time shard runs (deployment runs) that did not complete
    ├── RunFailedError              a run that ended Failed because some of its work failed; carries its summary
    ├── BatchConflictError          prompts already wait in another open batch; nothing was stored
    ├── BatchInUseError             a batch the provider still holds, not given up: that could pay twice
    └── APIError                    a provider call that failed after its retries
        ├── APIConnectionError      no HTTP answer: refused, dropped, reset
        │   └── APITimeoutError     no answer within the request timeout
        ├── APIResponseValidationError  HTTP 200 with a body that is not what was asked for
        ├── APIStatusError          an HTTP error status
        │   ├── BadRequestError             400
        │   ├── AuthenticationError         401
        │   ├── PermissionDeniedError       403
        │   ├── NotFoundError               404
        │   ├── ConflictError               409
        │   ├── UnprocessableEntityError    422
        │   ├── RateLimitError              429
        │   └── InternalServerError         >= 500
        ├── BatchLineError          one line of a batch's output that carried no answer
        ├── BatchFailedError        a whole batch refused by the provider (its input failed validation)
        └── BatchCancelledError     a batch cancelled with ``llm-dispatch cancel`` before answering
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._retry import should_retry_status

__all__ = [
    "APIConnectionError",
    "APIError",
    "APIResponseValidationError",
    "APIStatusError",
    "APITimeoutError",
    "AuthenticationError",
    "BadRequestError",
    "BudgetExceededError",
    "BatchCancelledError",
    "BatchConflictError",
    "BatchInUseError",
    "BatchFailedError",
    "BatchLineError",
    "ConfigError",
    "ConflictError",
    "DatabaseError",
    "InputError",
    "InternalServerError",
    "LLMDispatchError",
    "NotFoundError",
    "PermissionDeniedError",
    "RateLimitError",
    "RunFailedError",
    "ShardRunsFailedError",
    "UnknownBatchError",
    "UnknownJobError",
    "UnknownPromptError",
    "UnprocessableEntityError",
    "status_error_class",
]


class LLMDispatchError(Exception):
    """Base of every error llm-dispatch raises on purpose."""


class ConfigError(LLMDispatchError):
    """Settings that cannot work; the message names the setting and its environment variable."""


class DatabaseError(ConfigError):
    """A database URL that cannot be used, or a database that cannot be opened (missing, unreachable, refused,
    older than this version); the message names the URL's setting, never its password."""


class InputError(LLMDispatchError):
    """A prompt file that cannot be used. Raised before anything is sent or written.

    Its text is one line of bounded length whatever the input holds (a path, field or message too long is cut
    short with "..."); ``several`` makes one error of many bad lines, a line each, ``problems`` listing them.
    """

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None, field: str | None = None) -> None:
        self.path = path
        self.line = line
        self.field = field
        self.problems: tuple[InputError, ...] = (self,)
        where = ":".join(str(p) for p in (_clip_start(path, _MAX_PATH) if path is not None else None, line)
                         if p is not None)
        prefix = f"{where}: " if where else ""
        suffix = f" (field '{_clip(field, _MAX_FIELD)}')" if field else ""
        text = f"{prefix}{_clip(' '.join(message.split()), _MAX_MESSAGE)}{suffix}"
        # A lone surrogate from the input would make the line unprintable: shown as its escape instead.
        super().__init__(text.encode("utf-8", "backslashreplace").decode("utf-8"))

    @classmethod
    def several(cls, problems: list[InputError], *, total: int) -> InputError:
        """One error for ``problems`` (each bad line's, in input order), of ``total`` found in all: the
        first's path, line and field, its text their lines and, when some are left out, a line saying so."""
        if len(problems) == 1 and total == 1:
            return problems[0]
        first = problems[0]
        error = cls("", path=first.path, line=first.line, field=first.field)
        error.problems = tuple(problems)
        lines = [str(problem) for problem in problems]
        if total > len(problems):
            where = f"{_clip_start(first.path, _MAX_PATH)}: " if first.path else ""
            lines.append(f"{where}{total:,} problems in all, the first {len(problems)} shown; fix them and run again")
        error.args = ("\n".join(lines),)
        return error


# An input error's parts are cut to these lengths, so that no value in a prompt file makes a long line.
_MAX_PATH = 120
_MAX_FIELD = 60
_MAX_MESSAGE = 240


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _clip_start(text: str, limit: int) -> str:
    return text if len(text) <= limit else "..." + text[3 - limit:]


class UnknownJobError(LLMDispatchError, LookupError):
    """A job id that is not in the database."""


class UnknownBatchError(LLMDispatchError, LookupError):
    """A batch id that is not in the database."""


class UnknownPromptError(LLMDispatchError, LookupError):
    """Prompt ids that are not in the database (answers to store, members of a new batch): their job was removed,
    or the run writes to another database than the one its prompts were recorded in."""


class BudgetExceededError(LLMDispatchError):
    """The estimate before sending is above ``max_cost`` (or cannot be checked against it): nothing was sent."""


class RunFailedError(LLMDispatchError):
    """A run that ended ``Failed`` because some of its work failed (prompts, chunks, batches): what it did is in
    ``summary`` (its counts say what failed and why). Raised to whoever awaits the flow itself; ``llm-dispatch``
    and ``tasks.result_of`` read the summary instead, as a run that failed in part still did the rest."""

    def __init__(self, message: str, *, summary: Any = None) -> None:
        super().__init__(message)
        self.summary = summary  # pickled with the error (an exception's __dict__ is), as Prefect stores results


class ShardRunsFailedError(LLMDispatchError):
    """Real-time shard runs of a ``dispatch`` run that did not complete; a run of the job again sends what they left."""


class BatchConflictError(LLMDispatchError, ValueError):
    """Some prompts of a new batch already wait in another open batch; nothing was stored."""

    def __init__(self, message: str, *, prompt_ids: Sequence[int], batch_ids: Sequence[int]) -> None:
        super().__init__(message)
        self.prompt_ids = list(prompt_ids)
        self.batch_ids = list(batch_ids)


class BatchInUseError(LLMDispatchError):
    """``abandon`` of a batch the provider still holds (running or finished): its answers are billed, so giving it
    up and sending its prompts again would pay for them twice; nothing was changed."""


class APIError(LLMDispatchError):
    """A provider call that failed; ``attempts`` counts the HTTP attempts made, retries included.

    ``retryable``: whether a later run may send it again. ``usage``: what a 2xx that carried no usable answer
    said it used (a ``ChatResult`` with no text), so that its cost is stored; None otherwise. ``maybe_billed``:
    how many of its attempts the provider may have billed (a 2xx, a generation that timed out or was cut off).
    ``raw_body``: the start of a 2xx body that was no answer, kept for inspection. ``provider``: the name of the
    provider whose client gave up (None: not a client's call).
    """

    retryable: bool = False
    usage: Any = None
    maybe_billed: int = 0
    raw_body: str | None = None
    provider: str | None = None

    def __init__(self, message: str, *, attempts: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.attempts = attempts


class APIConnectionError(APIError):
    retryable = True


class APITimeoutError(APIConnectionError):
    retryable = True


class APIResponseValidationError(APIError):
    # A 2xx was answered, and may have been billed: like openai-python and Anthropic's SDK, never sent again
    # (``--retry-failed all`` does).
    retryable = False


class APIStatusError(APIError):
    """``code``: the provider's machine-readable reason (OpenAI's error.code, Anthropic's error type or its
    details.error_code); ``lasting``: set (``core._stops.LastingKind``) when every other request of the run would
    get the same answer, which the run stops on. Such a prompt is sent again by a later run, once it is fixed."""

    code: str | None = None
    lasting: str | None = None

    def __init__(
        self, message: str, *, status_code: int, request_id: str | None = None, attempts: int = 1,
        retryable: bool | None = None,
    ) -> None:
        super().__init__(message, attempts=attempts)
        self.status_code = status_code
        self.request_id = request_id
        # The client's own decision (the provider's x-should-retry included) when it made this; else the status's.
        self.retryable = should_retry_status(status_code) if retryable is None else retryable


class BadRequestError(APIStatusError): ...
class AuthenticationError(APIStatusError): ...
class PermissionDeniedError(APIStatusError): ...
class NotFoundError(APIStatusError): ...
class ConflictError(APIStatusError): ...
class UnprocessableEntityError(APIStatusError): ...
class RateLimitError(APIStatusError): ...
class InternalServerError(APIStatusError): ...


class BatchLineError(APIError):
    """One line of a Batch API output that carried no answer: the provider's ``code`` and message."""

    def __init__(self, message: str, *, code: str | None, retryable: bool, attempts: int = 1) -> None:
        super().__init__(message, attempts=attempts)
        self.code = code
        self.retryable = retryable


class BatchFailedError(APIError):
    """The provider refused a whole batch (its input failed validation); nothing in it was answered or billed."""


class BatchCancelledError(APIError):
    """The batch was cancelled with ``llm-dispatch cancel`` before it answered this prompt."""


_BY_STATUS: dict[int, type[APIStatusError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    422: UnprocessableEntityError,
    429: RateLimitError,
}


def status_error_class(status_code: int) -> type[APIStatusError]:
    """The exception class for an HTTP error status."""
    if status_code >= 500:
        return InternalServerError
    return _BY_STATUS.get(status_code, APIStatusError)
