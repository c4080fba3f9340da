"""Type and range checks for the chat-completion parameters a prompt file may set, so a bad value is
refused with the file rather than sent (and billed, or failed) request by request.

The rules are those of OpenAI's chat completions reference (``CompletionCreateParams`` in
openai-python, generated from its OpenAPI spec). Parameters not named here pass through unchecked:
providers add their own, and a newer OpenAI parameter must not be refused by an older llm-dispatch.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["param_problem", "shown", "shown_json"]

MAX_STOP_SEQUENCES = 4
MAX_TOP_LOGPROBS = 20
LOGIT_BIAS_LIMIT = 100


def _integer(value: Any) -> bool:
    # JSON true is a Python bool, which is an int: it is never a count.
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return (_integer(value) or isinstance(value, float)) and math.isfinite(value)


def _between(low: float, high: float) -> Callable[[Any], bool]:
    return lambda value: _number(value) and low <= value <= high


def _string(value: Any) -> bool:
    return isinstance(value, str)


def _object(value: Any) -> bool:
    return isinstance(value, Mapping)


def _stop(value: Any) -> bool:
    return _string(value) or (isinstance(value, list) and len(value) <= MAX_STOP_SEQUENCES
                              and all(_string(item) for item in value))


def _logit_bias(value: Any) -> bool:
    return _object(value) and all(_between(-LOGIT_BIAS_LIMIT, LOGIT_BIAS_LIMIT)(bias) for bias in value.values())


def _response_format(value: Any) -> bool:
    return _object(value) and _string(value.get("type"))


def _list_of_objects(value: Any) -> bool:
    return isinstance(value, list) and all(_object(item) for item in value)


@dataclass(frozen=True, slots=True)
class _Rule:
    valid: Callable[[Any], bool]
    expected: str
    # JSON null means "the provider's default" for the parameters the reference marks optional.
    nullable: bool = True


_TOKENS = _Rule(lambda value: _integer(value) and value >= 1, "an integer >= 1")
_PENALTY = _Rule(_between(-2, 2), "a number from -2 to 2")

RULES: dict[str, _Rule] = {
    "max_tokens": _TOKENS,
    "max_completion_tokens": _TOKENS,
    "temperature": _Rule(_between(0, 2), "a number from 0 to 2"),
    "top_p": _Rule(_between(0, 1), "a number from 0 to 1"),
    "presence_penalty": _PENALTY,
    "frequency_penalty": _PENALTY,
    "stop": _Rule(_stop, f"a string or a list of up to {MAX_STOP_SEQUENCES} strings"),
    "seed": _Rule(_integer, "an integer"),
    "logprobs": _Rule(lambda value: isinstance(value, bool), "true or false"),
    "top_logprobs": _Rule(lambda value: _integer(value) and 0 <= value <= MAX_TOP_LOGPROBS,
                          f"an integer from 0 to {MAX_TOP_LOGPROBS}"),
    "logit_bias": _Rule(_logit_bias, f"an object of token id -> number from -{LOGIT_BIAS_LIMIT} to {LOGIT_BIAS_LIMIT}"),
    "response_format": _Rule(_response_format, "an object with a 'type' string", nullable=False),
    "user": _Rule(_string, "a string", nullable=False),
    "tools": _Rule(_list_of_objects, "a list of tool objects", nullable=False),
    "tool_choice": _Rule(lambda value: _string(value) or _object(value), "a string or an object", nullable=False),
    "parallel_tool_calls": _Rule(lambda value: isinstance(value, bool), "true or false", nullable=False),
    "reasoning_effort": _Rule(_string, "a string"),
    "service_tier": _Rule(_string, "a string"),
    "metadata": _Rule(lambda value: _object(value) and all(_string(v) for v in value.values()),
                      "an object of string values"),
    "store": _Rule(lambda value: isinstance(value, bool), "true or false"),
    "modalities": _Rule(lambda value: isinstance(value, list) and all(_string(v) for v in value), "a list of strings"),
    "prediction": _Rule(_object, "an object"),
    "audio": _Rule(_object, "an object"),
    "web_search_options": _Rule(_object, "an object", nullable=False),
    "functions": _Rule(_list_of_objects, "a list of function objects", nullable=False),
    "function_call": _Rule(lambda value: _string(value) or _object(value), "a string or an object", nullable=False),
}


def param_problem(name: str, value: Any) -> str | None:
    """What is wrong with the request parameter ``name`` set to ``value``; None when it is fine or unknown."""
    rule = RULES.get(name)
    if rule is None or (value is None and rule.nullable) or rule.valid(value):
        return None
    return f"must be {rule.expected}, got {shown_json(value)}"


def shown_json(value: Any, *, limit: int = 40) -> str:
    """``value`` as JSON, cut to ``limit`` characters (a parameter's value, as the file gives it)."""
    try:
        text = json.dumps(value, default=str, ensure_ascii=False)
    except (ValueError, RecursionError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def shown(value: Any, *, limit: int = 40) -> str:
    """``value`` as a message quotes it (a string as its repr, anything else as JSON), cut to ``limit``
    characters: what a one-line message shows of a value from a prompt file, whatever its size."""
    if isinstance(value, str):
        text = repr(value[:limit])
    else:
        try:
            text = json.dumps(value, default=str, ensure_ascii=False)
        except (ValueError, RecursionError):
            text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
