"""``core.read_json`` reads every text as ``json.loads`` does (value and error), orjson where the two agree."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from llm_dispatch.core import read_json

TEXTS: list[str | bytes] = [
    b'{"a": 1, "b": [1.5, -0.0, true, null, "\\u00e9"], "c": {"d": "x"}}',
    '{"a": 1, "a": 2}',  # a repeated key: the last one wins
    b"NaN", "[Infinity, -Infinity]", b"1e400",  # json.loads reads these; orjson refuses them
    '"\\ud800"', b'"\\udc00 alone"',  # lone surrogates
    b"123456789012345678901234567890",  # beyond 64 bits: orjson would make it a float
    '{"seed": 18446744073709551616, "n": -9223372036854775809}',
    "12345678901234567890.5",
    "\ufeff{}", b"\xef\xbb\xbf{}",  # a BOM
    '{"e": "\u00e9\u4e2d"}', bytearray(b"[1, 2]"),
    "  {}  \n",
]
BROKEN: list[str | bytes] = [b"", "[1, 2", b"\xff", '{"a": 1} x', "{'a': 1}", "[1,]"]


def _outcome(read: Any, text: str | bytes) -> Any:
    try:
        value = read(text)
    except ValueError as exc:
        return type(exc), str(exc)
    return "value", repr(value), type(value)


@pytest.mark.parametrize("text", TEXTS + BROKEN)
def test_read_json_reads_as_json_loads(text: str | bytes) -> None:
    assert _outcome(read_json, text) == _outcome(json.loads, text)


def test_large_integers_stay_integers() -> None:
    value = read_json(b'{"big": 123456789012345678901234567890, "small": 9223372036854775807}')
    assert value == {"big": 123456789012345678901234567890, "small": 9223372036854775807}
    assert isinstance(value["big"], int)


@pytest.mark.parametrize("text", TEXTS + BROKEN)
def test_an_answer_body_reads_as_httpx_reads_it(text: str | bytes) -> None:
    """The client reads every answer's body with ``read_json``: the value ``response.json()`` gives, and a body that
    is not JSON is still an unusable answer."""
    from llm_dispatch.core import APIResponseValidationError
    from llm_dispatch.core.wire._responses import parse_json

    response = httpx.Response(200, content=bytes(text) if not isinstance(text, str) else text.encode("utf-8", "surrogatepass"))
    try:
        expected: Any = ("value", repr(response.json()))
    except ValueError:
        expected = "unusable"
    try:
        got: Any = ("value", repr(parse_json(response)))
    except APIResponseValidationError:
        got = "unusable"
    assert got == expected
