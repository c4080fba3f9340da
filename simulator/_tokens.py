"""The simulator's offline token counter and its deterministic completion text.

``count_tokens`` approximates o200k_base, the BPE tokenizer of gpt-4o and later models, without any
vocabulary file:

1. Split the text like cl100k's pre-tokenizer: contractions, words with one leading space or
   symbol, digit groups of up to 3, punctuation runs (with trailing newlines), newline runs,
   other whitespace runs. Each piece is at least one token.
2. Price what one token cannot hold: an ASCII word piece longer than 12 characters (leading space
   included) costs 1 more per 8 further characters or part of them; a punctuation piece costs 1 per
   2 symbols; a word with non-ASCII letters costs 1 per 4 whole UTF-8 bytes, at least 1 (so one CJK
   character is about three quarters of a token).
3. A chat prompt adds 3 tokens per message plus its role (and 1 plus the name when ``name`` is
   set), plus 3 to prime the reply, as OpenAI's cookbook counts it. An image part costs 85.

``bench/tokens.py`` measures it against o200k_base, per kind of text. Scripts with combining marks
(Arabic, Hindi) count high, as the split cuts their words at each mark.

It is deliberately independent of the client's own estimator, so the two can be compared.
"""

from __future__ import annotations

import json
import random
import re
import string
from typing import Any

__all__ = [
    "REPLY_PRIMING_TOKENS",
    "completion_text",
    "count_message_tokens",
    "count_tokens",
    "message_token_counts",
    "natural_length",
]

_PRETOKEN_SOURCE = (
    r"'(?i:[sdmt]|ll|ve|re)"  # English contractions
    r"|[^\r\n\w]?[^\W\d_]+"  # a word, with at most one leading space or symbol
    r"|\d{1,3}"  # numbers in groups of up to three digits
    r"| ?(?:[^\s\w]|_)+[\r\n]*"  # punctuation runs, with the newlines that follow them
    r"|\s*[\r\n]+"  # newline runs
    r"|\s+(?!\S)|\s+"  # other whitespace
)
_PRETOKEN = re.compile(_PRETOKEN_SOURCE)
# Same splits on ASCII text, and cheaper to run: most prompts take this path.
_PRETOKEN_ASCII = re.compile(_PRETOKEN_SOURCE, re.ASCII)

_ASCII_LETTERS = frozenset(string.ascii_letters)
_SHORT_WORD = 12  # characters, leading space included, that one token holds
_CHARS_PER_EXTRA_TOKEN = 8
_BYTES_PER_NON_ASCII_TOKEN = 4
_IMAGE_TOKENS = 85  # OpenAI's price of a low-detail image
_TOKENS_PER_MESSAGE = 3
_TOKENS_PER_NAME = 1
REPLY_PRIMING_TOKENS = 3


def _extra_cost(piece: str) -> int:
    """Tokens a piece costs beyond the first."""
    last = piece[-1]
    if last.isalpha():
        if piece.isascii():
            over = len(piece) - _SHORT_WORD
            return -(-over // _CHARS_PER_EXTRA_TOKEN) if over > 0 else 0
        return max(1, len(piece.encode("utf-8", "surrogatepass")) // _BYTES_PER_NON_ASCII_TOKEN) - 1
    if last.isdigit() or piece.isspace():
        return 0
    return max(1, (len(piece.strip()) + 1) // 2) - 1


def count_tokens(text: str) -> int:
    """Approximate BPE token count of ``text`` (see the module docstring for the rules)."""
    if text.isascii():
        pieces = _PRETOKEN_ASCII.findall(text)
        total = len(pieces)
        for piece in pieces:
            # Most pieces are short words that cost exactly one; skip them without a call.
            if len(piece) > 2 and (len(piece) > _SHORT_WORD or piece[-1] not in _ASCII_LETTERS):
                total += _extra_cost(piece)
    else:
        pieces = _PRETOKEN.findall(text)
        total = len(pieces)
        for piece in pieces:
            total += _extra_cost(piece)
    return total


def _content_tokens(content: Any) -> int:
    if content is None:
        return 0
    if isinstance(content, str):
        return count_tokens(content)
    total = 0
    for part in content:
        if not isinstance(part, dict):
            continue
        kind = part.get("type")
        if kind == "text":
            total += count_tokens(str(part.get("text", "")))
        elif kind in ("image_url", "input_image", "image"):  # image: an Anthropic image block
            total += _IMAGE_TOKENS
    return total


_ROLE_TOKENS = {role: count_tokens(role) for role in ("system", "developer", "user", "assistant", "tool", "function")}


def message_token_counts(messages: list[dict[str, Any]]) -> list[int]:
    """Tokens of each chat message, overhead included (the reply priming is not in any of them)."""
    counts = []
    for message in messages:
        role = message.get("role")
        role_tokens = _ROLE_TOKENS.get(role) if isinstance(role, str) else None
        if role_tokens is None:
            role_tokens = count_tokens(str(role or ""))
        tokens = _TOKENS_PER_MESSAGE + role_tokens + _content_tokens(message.get("content"))
        name = message.get("name")
        if name:
            tokens += _TOKENS_PER_NAME + count_tokens(str(name))
        tool_calls = message.get("tool_calls")
        if tool_calls:
            tokens += count_tokens(json.dumps(tool_calls, separators=(",", ":")))
        counts.append(tokens)
    return counts


def count_message_tokens(messages: list[dict[str, Any]]) -> int:
    """Prompt tokens of a chat request's ``messages`` as the simulator reports them in ``usage``."""
    return sum(message_token_counts(messages)) + REPLY_PRIMING_TOKENS


# --- completion text -------------------------------------------------------------------------
# A fixed stream of pieces that each count as exactly one token and never merge with their
# neighbours, so any slice of n pieces is n tokens under count_tokens: the simulator's
# completion_tokens is then the true count of the text it sends, at the cost of a join.

_WORDS = (
    "the of and to in is that it for as with was on be by this are or from at an which not have "
    "has but can all were one their more also when there these may will other into some time "
    "only been its new most such first what over two used would about many like then than them "
    "each well so any could way much where after even because both model data system value "
    "result answer request number order simple small large first second next final point case "
    "example reason method process output input result source answer early later often usually "
    "clearly always rarely perhaps quickly slowly carefully common useful general similar "
    "several various certain different important possible likely typical careful complete short "
    "long quick steady robust gentle bright quiet careful precise review measure compare select "
    "support provide include consider explain describe suggest improve reduce create follow "
    "report return handle update change check test build write read send keep start finish"
).split()
# Words of up to 8 letters, each one token with its leading space. Up to 11 would count as one now,
# but admitting them would change every completion the simulator has ever sent, for nothing.
_VOCABULARY = tuple(dict.fromkeys(w for w in _WORDS if len(w) <= 8))

_STREAM_PIECES = 4096
_MAX_COMPLETION = 300  # the longest natural answer; max_tokens only ever shortens it


def _build_stream() -> tuple[tuple[str, ...], tuple[bool, ...]]:
    rng = random.Random(20240601)  # fixed: the text is part of the simulator's observable contract
    pieces: list[str] = []
    after_paragraph = True
    while len(pieces) < _STREAM_PIECES + _MAX_COMPLETION + 8:
        words = [rng.choice(_VOCABULARY) for _ in range(rng.randint(6, 16))]
        comma_at = rng.randint(2, len(words) - 3) if rng.random() < 0.4 else -1
        for i, word in enumerate(words):
            if i == 0:
                word = word.capitalize()
            pieces.append(word if (i == 0 and after_paragraph) else " " + word)
            if i == comma_at:
                pieces.append(",")
        paragraph_end = rng.random() < 0.2
        pieces.append(".\n\n" if paragraph_end else ".")
        after_paragraph = paragraph_end
    is_word = tuple(p[-1].isalpha() for p in pieces)
    return tuple(pieces), is_word


_STREAM, _IS_WORD = _build_stream()


def natural_length(digest: int) -> int:
    """The completion length a request gets with no max_tokens: 20..300, skewed towards short."""
    a = digest & 0xFFFF
    b = (digest >> 16) & 0xFFFF
    # The product of two uniforms leans towards short answers (mean ~90), as real chat traffic does.
    return 20 + (a % 281) * (b % 281) // 280


def completion_text(*, digest: int, tokens: int, stop: bool) -> str:
    """Exactly ``tokens`` tokens of English-looking text chosen by ``digest``.

    With ``stop`` the text ends a sentence (finish_reason "stop"); without it, it is cut
    mid-sentence like an answer truncated at max_tokens.
    """
    if tokens <= 0:
        return ""
    start = (digest >> 32) % _STREAM_PIECES
    while not _IS_WORD[start]:
        start += 1
    pieces = list(_STREAM[start : start + tokens])
    while len(pieces) < tokens:  # a long generation (a [[sim:slow]] answer) goes round the stream again
        pieces.extend(_STREAM[: tokens - len(pieces)])
    pieces[0] = pieces[0].lstrip().capitalize()
    if stop and tokens > 1:
        last = tokens - 1
        # Punctuation is always between words in the stream; keep it that way at the end.
        if not _IS_WORD[(start + last - 1) % len(_IS_WORD)]:
            pieces[last - 1] = " " + _VOCABULARY[digest % len(_VOCABULARY)]
        pieces[last] = "."
    return "".join(pieces)
