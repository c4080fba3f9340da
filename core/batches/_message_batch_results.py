"""Reading a Message Batch's results file (Anthropic's JSONL): each line settled as ``BatchLine``, as an OpenAI
batch's output is by ``_batch_files``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .._exceptions import APIResponseValidationError
from ..wire._anthropic_answers import message_result_from_body
from ..wire._line_errors import anthropic_line_error
from ._batch_files import BatchLine, garbled_line, read_result_lines, unusable_line

__all__ = ["read_message_batch_results"]


def read_message_batch_results(path: Path) -> Iterator[BatchLine]:
    """Every line of a Message Batch's results file, in file order; blank lines are skipped.

    ``succeeded`` carries its ``ChatResult``; ``errored`` the error's type, ``canceled`` and ``expired`` their
    kind, each settled by ``_line_errors`` (whether it is sent again; none of them is billed). A line that
    cannot be read becomes ``error_code == INVALID_OUTPUT_LINE``: one bad line never costs the others.
    """
    return read_result_lines(path, _result_line)


def _result_line(record: dict[str, Any], custom_id: str, number: int) -> BatchLine:
    result = record.get("result")
    kind = result.get("type") if isinstance(result, dict) else None
    if kind == "succeeded":
        assert isinstance(result, dict)
        try:
            chat = message_result_from_body(result.get("message"))
        except APIResponseValidationError as exc:
            return unusable_line(custom_id, number, 200, exc.message, usage=exc.usage, body=result.get("message"))
        return BatchLine(custom_id=custom_id, result=chat, error_code=None, error_message=None, status_code=200,
                         retryable=False, line=number)
    if kind == "errored":
        assert isinstance(result, dict)
        envelope = result.get("error")
        error = envelope.get("error") if isinstance(envelope, dict) else None
        if not isinstance(error, dict):
            error = envelope if isinstance(envelope, dict) else {}
        code = str(error.get("type") or "unknown_error")
        message = error.get("message")
        rule = anthropic_line_error(code)
        return BatchLine(custom_id=custom_id, result=None, error_code=code,
                         error_message=message if isinstance(message, str) else "", status_code=None,
                         retryable=rule.retry, line=number, billed=rule.billed)
    if kind in ("canceled", "expired"):
        rule = anthropic_line_error(kind)
        return BatchLine(custom_id=custom_id, result=None, error_code=kind,
                         error_message=f"the batch {'was canceled' if kind == 'canceled' else 'expired'} "
                                       "before this request was answered",
                         status_code=None, retryable=rule.retry, line=number, billed=rule.billed)
    return garbled_line(custom_id, number, f"result type {kind!r} is not succeeded, errored, canceled or expired")
