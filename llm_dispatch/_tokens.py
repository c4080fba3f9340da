"""Offline token estimates for rate limiting and cost previews, without a tokenizer.

tiktoken would be exact for OpenAI models but downloads its encoding files on first use, and other
providers tokenize differently anyway. So this is a heuristic, and says so:

* text: the mean of OpenAI's two rules of thumb for English, one token per ~4 characters and one
  token per ~0.75 words. Either alone drifts on text with unusually long or short words; the mean
  drifts less. On typical English prose the two agree to within a few percent (both give ~1.3-1.4
  tokens a word, a little over cl100k/o200k). It has not been checked against a real tokenizer
  here. Non-Latin scripts (CJK especially) and dense code or data are underestimated; do not
  rely on it there.
* chat framing: 3 tokens per message, 1 more for a ``name``, 3 to prime the reply (the OpenAI
  cookbook's accounting for current chat models).
* images: a flat 765 tokens each (a 1024x1024 image at high detail: 85 + 4 tiles x 170).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from ._types import ChatRequest

__all__ = [
    "DEFAULT_COMPLETION_TOKENS",
    "estimate_prompt_tokens",
    "estimate_request_tokens",
    "estimate_text_tokens",
]

CHARS_PER_TOKEN = 4.0
WORDS_PER_TOKEN = 0.75
TOKENS_PER_MESSAGE = 3
TOKENS_PER_NAME = 1
TOKENS_PER_REPLY = 3
TOKENS_PER_IMAGE = 765
# What a reply is assumed to cost when the request sets no max_tokens; the TPM limiter corrects it
# with the real usage once the answer is in.
DEFAULT_COMPLETION_TOKENS = 256
# Request parameters that the provider renders into the prompt and so bills as input.
_PROMPT_PARAMS = ("tools", "functions", "response_format", "tool_choice")

_WORD = re.compile(r"\S+")


def estimate_text_tokens(text: str) -> int:
    """Tokens in a piece of text: the mean of the characters/4 and words/0.75 estimates, rounded up."""
    if not text:
        return 0
    by_chars = len(text) / CHARS_PER_TOKEN
    by_words = len(_WORD.findall(text)) / WORDS_PER_TOKEN
    return math.ceil((by_chars + by_words) / 2)


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
        total += TOKENS_PER_MESSAGE
        total += _content_tokens(message.get("content"))
        if message.get("name"):
            total += TOKENS_PER_NAME + estimate_text_tokens(str(message["name"]))
        if message.get("tool_calls"):
            total += estimate_text_tokens(_dump(message["tool_calls"]))
    return total


def estimate_request_tokens(request: ChatRequest, *, default_completion_tokens: int = DEFAULT_COMPLETION_TOKENS) -> int:
    """Everything a request may cost against a tokens-per-minute limit: prompt plus the reply allowance.

    The allowance is ``max_completion_tokens`` (or the older ``max_tokens``) per choice, else
    ``default_completion_tokens``.
    """
    params = request.params
    prompt = estimate_prompt_tokens(request.messages)
    prompt += sum(estimate_text_tokens(_dump(params[name])) for name in _PROMPT_PARAMS if params.get(name))
    limit = params.get("max_completion_tokens") or params.get("max_tokens")
    per_choice = int(limit) if limit else default_completion_tokens
    choices = int(params.get("n") or 1)
    return prompt + per_choice * max(choices, 1)
