"""Type and range checks for the chat-completion parameters a prompt file may set, so a bad value is
refused with the file rather than sent (and billed, or failed) request by request.

The rules are those of OpenAI's chat completions reference (``CompletionCreateParams`` in
openai-python, generated from its OpenAPI spec). Parameters not named there pass through unchecked:
providers add their own, and a newer OpenAI parameter must not be refused by an older llm-dispatch;
only a near miss of a known name (``max_token``, ``temprature``: one letter off) is refused, naming
the parameter it likely means (``misspelling``). What a given model refuses is ``_model_rules``'.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["MAX_METADATA_KEY", "MAX_METADATA_PAIRS", "MAX_METADATA_VALUE", "OPENAI_PARAMS", "misspelling", "counted", "param_problem", "shown", "shown_json", "suggestion"]

# Every chat-completions request parameter (openai-python 3.3.1, ``types/chat/completion_create_params.py``).
OPENAI_PARAMS = frozenset({
    "messages", "model", "audio", "frequency_penalty", "function_call", "functions", "logit_bias", "logprobs",
    "max_completion_tokens", "max_tokens", "metadata", "modalities", "moderation", "n", "parallel_tool_calls",
    "prediction", "presence_penalty", "prompt_cache_key", "prompt_cache_options", "prompt_cache_retention",
    "reasoning_effort", "response_format", "safety_identifier", "seed", "service_tier", "stop", "store", "stream",
    "stream_options", "temperature", "tool_choice", "tools", "top_logprobs", "top_p", "user", "verbosity",
    "web_search_options",
})
# Parameters of OpenAI-compatible servers (vLLM, Ollama, OpenRouter) and of Anthropic one letter off a name above:
# never a typo of it.
_EXTENSIONS = frozenset({"top_k", "top_a", "min_p", "min_tokens", "speed"})
# Requests carry at most 16 metadata pairs, keys up to 64 characters, values up to 512 (the same reference).
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 512
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
    "metadata": _Rule(lambda value: _object(value) and len(value) <= MAX_METADATA_PAIRS
                      and all(_string(k) and len(k) <= MAX_METADATA_KEY and _string(v) and len(v) <= MAX_METADATA_VALUE
                              for k, v in value.items()),
                      f"an object of at most {MAX_METADATA_PAIRS} string values (keys up to {MAX_METADATA_KEY} "
                      f"characters, values up to {MAX_METADATA_VALUE})"),
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


def misspelling(name: str) -> str | None:
    """What is wrong with an OpenAI request parameter named ``name`` that is not one: "did you mean" the known
    name it is one letter (or case, or a dash) away from; None when it is known or near none."""
    if name in OPENAI_PARAMS or name in _EXTENSIONS:
        return None
    likely = suggestion(name, OPENAI_PARAMS)
    if likely is None:
        return None
    return f"{shown(name)} is not a request parameter; did you mean '{likely}'?"


def suggestion(name: str, known: frozenset[str]) -> str | None:
    """The name in ``known`` that ``name`` most likely misspells: the same but for case and dashes, or one
    letter added, dropped, changed or two swapped (names of 4 letters or more); None when there is none."""
    if not isinstance(name, str) or len(name) > 64:
        return None
    normal = name.lower().replace("-", "_").replace(" ", "_")
    if normal in known:
        return normal
    if len(normal) < 4:
        return None
    near = sorted(candidate for candidate in known if len(candidate) >= 4 and _one_edit(normal, candidate))
    return near[0] if near else None


def _one_edit(a: str, b: str) -> bool:
    """Whether ``a`` and ``b`` differ by one insertion, deletion, substitution or swap of two neighbours."""
    if abs(len(a) - len(b)) > 1 or a == b:
        return False
    if len(a) == len(b):
        diff = [i for i in range(len(a)) if a[i] != b[i]]
        return len(diff) == 1 or (len(diff) == 2 and diff[1] == diff[0] + 1
                                  and a[diff[0]] == b[diff[1]] and a[diff[1]] == b[diff[0]])
    short, long = (a, b) if len(a) < len(b) else (b, a)
    i = 0
    while i < len(short) and short[i] == long[i]:
        i += 1
    return short[i:] == long[i + 1:]


def shown_json(value: Any, *, limit: int = 40) -> str:
    """``value`` as JSON, cut to ``limit`` characters (a parameter's value, as the file gives it)."""
    try:
        text = json.dumps(value, default=str, ensure_ascii=False)
    except (ValueError, RecursionError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def counted(count: int, thing: str, *, many: str | None = None) -> str:
    """``count`` things, the noun agreeing with it: ``counted(1, "chunk")`` is "1 chunk", ``counted(2_000, "batch",
    many="batches")`` "2,000 batches" (``many``: the plural where it is not ``thing`` + s)."""
    return f"{count:,} {thing if count == 1 else many or thing + 's'}"


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
