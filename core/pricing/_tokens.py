"""Offline token estimates for rate limiting and cost previews, without a tokenizer.

tiktoken would be exact for OpenAI models but downloads its encoding files on first use, and other
providers tokenize differently anyway. So this is a heuristic, and says so:

* text: a weighted sum of counts that a few bytes operations give without a Python loop:
  characters, words, ASCII symbols, digits, newlines, and characters of other scripts by the length
  of their UTF-8 form. The weights are a least-squares fit to the exact o200k_base counts (gpt-4o,
  gpt-4.1, o-series) of ~1,900 texts, measured with ``bench/tokens.py``. Against o200k_base the
  totals come out +3.6% on general English prose, +1.1% on instructions, +0.8% on technical prose,
  +0.4% on licences, -1% to -3.4% on code, -1.9% on JSON, -2% on CJK, Arabic and Hindi, -10% on
  European languages, and +6.7% on ``examples/prompts.jsonl`` (left out of the fit; its documents
  use unusually long, common words). The median text is 2-6% off; one in ten is more than 8% off
  on English, 14% on code, 27% on JSON. Long runs of one symbol (tables, banners) are
  overestimated: o200k holds ``----------------`` in one token. cl100k_base (gpt-4, gpt-3.5)
  counts English within 2% of o200k_base, other scripts 20-60% higher. The rule this replaces (the
  mean of characters/4 and words/0.75) was 8-19% high on English prose (24% on the examples),
  13-22% low on code and 35% low on JSON.
* chat framing: 3 tokens per message plus 1 for its role, 1 more and the name for a ``name``, 3 to
  prime the reply (the OpenAI cookbook's accounting for current chat models).
* images: a flat 765 tokens each (a 1024x1024 image at high detail: 85 + 4 tiles x 170).
"""

from __future__ import annotations

import json
import string
from collections.abc import Iterable, Mapping
from typing import Any

from .._types import ChatRequest

__all__ = [
    "DEFAULT_COMPLETION_TOKENS",
    "reply_cap",
    "estimate_input_tokens",
    "estimate_prompt_tokens",
    "estimate_request_tokens",
    "estimate_text_tokens",
    "input_tokens_at_most",
]

TOKENS_PER_MESSAGE = 3
TOKENS_PER_ROLE = 1  # every role the API accepts (system, developer, user, assistant, tool) is one token
TOKENS_PER_NAME = 1
TOKENS_PER_REPLY = 3
TOKENS_PER_IMAGE = 765
# What a reply is assumed to cost when the request sets no max_tokens; the TPM limiter corrects it
# with the real usage once the answer is in.
DEFAULT_COMPLETION_TOKENS = 256
# Request parameters that the provider renders into the prompt and so bills as input.
_PROMPT_PARAMS = ("tools", "functions", "response_format", "tool_choice")

# Tokens per count, fitted by least squares to o200k_base over bench/tokens.py's corpus (every
# category weighted alike, the examples left out). A word with its space, 5.7 characters of
# English on average, comes to ~1.1 tokens.
_PER_CHARACTER = 0.087
_PER_WORD = 0.62
_PER_PUNCTUATION = 0.48  # ASCII symbols: a word's comma, a JSON brace and a code operator alike
_PER_DIGIT = 0.6  # numbers are split into groups of up to three digits
_PER_NEWLINE = 0.48
# Added per non-ASCII character, told apart by the first byte of its UTF-8 form.
_PER_OTHER_SCRIPT = 0.15  # accented Latin, Greek, Cyrillic, Hebrew, Arabic, Indic; curly quotes, dashes
_PER_CJK = 0.63  # kana, Han ideographs, full-width forms
_PER_HANGUL = 0.42
_PER_ASTRAL = 1.5  # emoji and rare ideographs (4-byte UTF-8)
# No character adds more to ``estimate_text_tokens`` than itself, one word start and one kind (a kind is
# counted by the first byte of its UTF-8 form only): with rounding, a text of n characters is at most 3n tokens.
_MOST_PER_CHARACTER = 3
assert _PER_CHARACTER + _PER_WORD + max(_PER_PUNCTUATION, _PER_DIGIT, _PER_NEWLINE, _PER_OTHER_SCRIPT, _PER_CJK,
                                        _PER_HANGUL, _PER_ASTRAL) + 0.5 <= _MOST_PER_CHARACTER


def _byte_kinds() -> bytes:
    """A ``bytes.translate`` table that names each byte's kind with one letter, counted by ``bytes.count``."""
    kinds = bytearray(b"." * 256)
    for byte in string.punctuation.encode():
        kinds[byte] = ord("p")
    for byte in b"0123456789":
        kinds[byte] = ord("d")
    kinds[ord("\n")] = ord("n")
    for first, last, kind in ((0xC0, 0xE2, "o"), (0xE3, 0xE9, "c"), (0xEE, 0xEF, "c"), (0xEA, 0xED, "k"),
                              (0xF0, 0xF7, "e")):
        kinds[first : last + 1] = kind.encode() * (last + 1 - first)
    return bytes(kinds)


_KINDS = _byte_kinds()
# ASCII whitespace to a space and everything else to "x": a word starts at each " x".
_SPACES = bytes(32 if byte in b" \t\n\r\x0b\x0c" else ord("x") for byte in range(256))


def estimate_text_tokens(text: str) -> int:
    """Tokens in a piece of text: a weighted count of its characters, words, symbols, digits and lines.

    Costs a few bytes operations in C and no Python loop: ~2 µs for a one-line prompt.
    """
    if not text:
        return 0
    data = text.encode("utf-8", "surrogatepass")
    kinds = data.translate(_KINDS)
    words = (b" " + data).translate(_SPACES).count(b" x")
    tokens = (
        _PER_CHARACTER * len(text)
        + _PER_WORD * words
        + _PER_PUNCTUATION * kinds.count(b"p")
        + _PER_DIGIT * kinds.count(b"d")
        + _PER_NEWLINE * kinds.count(b"n")
    )
    if len(data) != len(text):
        tokens += (
            _PER_OTHER_SCRIPT * kinds.count(b"o")
            + _PER_CJK * kinds.count(b"c")
            + _PER_HANGUL * kinds.count(b"k")
            + _PER_ASTRAL * kinds.count(b"e")
        )
    return max(1, round(tokens))


def _content_tokens(content: Any) -> int:
    if content is None:
        return 0
    if isinstance(content, str):
        return estimate_text_tokens(content)
    if isinstance(content, Iterable) and not isinstance(content, Mapping):
        # A list of content parts: {"type": "text", "text": ...}, {"type": "image_url", ...}, ...
        total = 0
        for part in content:
            if isinstance(part, Mapping):
                kind = part.get("type")
                if kind in ("text", "input_text"):
                    total += estimate_text_tokens(str(part.get("text") or ""))
                elif kind in ("image_url", "input_image", "image"):
                    total += TOKENS_PER_IMAGE
                else:
                    total += estimate_text_tokens(_dump(part))
            else:
                total += _content_tokens(part)
        return total
    return estimate_text_tokens(_dump(content))


def _dump(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def estimate_prompt_tokens(messages: Iterable[Mapping[str, Any]]) -> int:
    """Prompt tokens of a chat request's ``messages``, framing included."""
    total = TOKENS_PER_REPLY
    for message in messages:
        total += TOKENS_PER_MESSAGE + TOKENS_PER_ROLE
        total += _content_tokens(message.get("content"))
        if message.get("name"):
            total += TOKENS_PER_NAME + estimate_text_tokens(str(message["name"]))
        if message.get("tool_calls"):
            total += estimate_text_tokens(_dump(message["tool_calls"]))
    return total


def reply_cap(params: Mapping[str, Any]) -> int | None:
    """A request's cap on its reply per choice: ``max_completion_tokens``, else the older ``max_tokens``; None when unset."""
    limit = params.get("max_completion_tokens") or params.get("max_tokens")
    return int(limit) if limit else None


def estimate_input_tokens(request: ChatRequest) -> int:
    """The tokens a request is billed as input: its messages, framing included, and the parameters
    the provider renders into the prompt (tools, response_format)."""
    params = request.params
    prompt = estimate_prompt_tokens(request.messages)
    return prompt + sum(estimate_text_tokens(_dump(params[name])) for name in _PROMPT_PARAMS if params.get(name))


def input_tokens_at_most(request: ChatRequest) -> int | None:
    """An upper bound of ``estimate_input_tokens(request)`` from the messages' lengths alone, for messages of plain
    text and no parameters rendered into the prompt; None for any other request. It costs no pass over the text."""
    params = request.params
    if any(params.get(name) for name in _PROMPT_PARAMS):
        return None
    total = TOKENS_PER_REPLY
    for message in request.messages:
        content = message.get("content")
        if not isinstance(content, str) or message.get("name") or message.get("tool_calls"):
            return None
        total += TOKENS_PER_MESSAGE + TOKENS_PER_ROLE + _MOST_PER_CHARACTER * len(content)
    return total


def estimate_request_tokens(request: ChatRequest, *, default_completion_tokens: int = DEFAULT_COMPLETION_TOKENS) -> int:
    """Everything a request may cost against a tokens-per-minute limit: prompt plus the reply allowance.

    The allowance is ``max_completion_tokens`` (or the older ``max_tokens``) per choice, else
    ``default_completion_tokens``.
    """
    cap = reply_cap(request.params)
    per_choice = cap if cap is not None else default_completion_tokens
    choices = int(request.params.get("n") or 1)
    return estimate_input_tokens(request) + per_choice * max(choices, 1)
