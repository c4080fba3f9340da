"""What a valid Messages body is answered with: the chat side's text and token counts, in a Message.

The body's turns (``system`` first, as a system turn) are counted and answered exactly as ``_completions``
answers the same turns on the chat side; ``max_tokens`` cuts the text, with ``stop_reason`` ``max_tokens``.
The digest is taken over the body's canonical JSON (sorted keys), so a batch request's ``params`` get the very
answer ``POST /v1/messages`` gives them.

Prompt caching, kept simple and deterministic: the cached prefix is the turns up to and including the last one
holding a block with ``cache_control`` (the system turn counts). The first time a model sees that prefix its
tokens are ``cache_creation_input_tokens``; every later time (until ``/_sim/reset``) they are
``cache_read_input_tokens``. ``input_tokens`` is the rest. Unlike Anthropic, any length of prefix is cached.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from ._completions import PlannedCompletion, body_digest, canonical_json, plan_completion
from ._http import json_dumps
from ._state import SimState
from ._tokens import completion_text

__all__ = ["MessageUsage", "PlannedMessage", "message_digest", "plan_message", "render_message"]

_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens"}
# Keeps Messages prefixes apart from chat prefixes in the one prompt cache.
_CACHE_DOMAIN = b"anthropic-messages\0"


@dataclass(frozen=True, slots=True)
class PlannedMessage:
    """The answer a body gets if nothing refuses it, and the prefix it marked for caching (if any)."""

    completion: PlannedCompletion
    cache_prefix: bytes | None  # digest of the marked prefix
    cache_prefix_tokens: int
    # The last mark asks for a 1-hour cache ({"ttl": "1h"}): its writes are 1-hour writes.
    cache_hour: bool = False

    @property
    def prompt_tokens(self) -> int:
        return self.completion.prompt_tokens

    @property
    def output_tokens(self) -> int:
        return self.completion.completion_tokens


@dataclass(frozen=True, slots=True)
class MessageUsage:
    """A Message's ``usage``; the four parts add up to the prompt and reply the chat side would count."""

    input_tokens: int
    output_tokens: int
    cache_read_input_tokens: int
    cache_creation_input_tokens: int


def message_digest(body: dict[str, Any], *, state: SimState) -> bytes:
    """The digest that fixes a body's answer (and counts its ``[[sim:FAULTxN]]`` hits)."""
    return body_digest(canonical_json(body).encode(), state=state)


def plan_message(body: dict[str, Any], *, digest: bytes) -> PlannedMessage:
    """The answer to a body that ``messages_body_problem`` accepted."""
    turns: list[dict[str, Any]] = list(body["messages"])
    system = body.get("system")
    if system is not None:
        turns.insert(0, {"role": "system", "content": system})
    completion = plan_completion({"model": body["model"], "messages": turns, "max_tokens": body["max_tokens"]},
                                 digest=digest)
    marked = [index for index, turn in enumerate(turns) if _marks_cache(turn.get("content"))]
    if not marked:
        return PlannedMessage(completion=completion, cache_prefix=None, cache_prefix_tokens=0)
    end = marked[-1] + 1
    prefix = hashlib.blake2b(_CACHE_DOMAIN + canonical_json([body["model"], turns[:end]]).encode(),
                             digest_size=16).digest()
    return PlannedMessage(completion=completion, cache_prefix=prefix, cache_prefix_tokens=sum(completion.counts[:end]),
                          cache_hour=_cache_ttl(turns[end - 1].get("content")) == "1h")


def render_message(plan: PlannedMessage, *, state: SimState) -> tuple[bytes, MessageUsage]:
    """(Message body, its usage); a marked prefix joins the prompt cache."""
    cache_read = cache_creation = 0
    if plan.cache_prefix is not None:
        if plan.cache_prefix in state.prompt_cache:
            cache_read = plan.cache_prefix_tokens
        else:
            cache_creation = plan.cache_prefix_tokens
        state.remember_prefixes([plan.cache_prefix])
    usage = MessageUsage(
        input_tokens=plan.prompt_tokens - cache_read - cache_creation, output_tokens=plan.output_tokens,
        cache_read_input_tokens=cache_read, cache_creation_input_tokens=cache_creation,
    )
    completion = plan.completion
    text_digest, tokens, finish_reason = completion.choices[0]
    message = {
        "id": state.next_response_id(prefix="msg_"),
        "type": "message",
        "role": "assistant",
        "model": completion.model,
        "content": [{"type": "text", "text": completion_text(digest=text_digest, tokens=tokens,
                                                             stop=finish_reason == "stop")}],
        "stop_reason": _STOP_REASONS[finish_reason],
        "stop_sequence": None,
        "usage": {
            "input_tokens": usage.input_tokens,
            "cache_creation_input_tokens": usage.cache_creation_input_tokens,
            "cache_read_input_tokens": usage.cache_read_input_tokens,
            "cache_creation": {
                "ephemeral_5m_input_tokens": 0 if plan.cache_hour else usage.cache_creation_input_tokens,
                "ephemeral_1h_input_tokens": usage.cache_creation_input_tokens if plan.cache_hour else 0,
            },
            "output_tokens": usage.output_tokens,
            "service_tier": "standard",
        },
    }
    return json_dumps(message).encode(), usage


def _cache_ttl(content: Any) -> str | None:
    """The ttl of the last cache mark in a turn's content ("5m" when a mark gives none)."""
    marks = [block["cache_control"] for block in content if isinstance(block, dict) and "cache_control" in block] \
        if isinstance(content, list) else []
    return (marks[-1].get("ttl") or "5m") if marks and isinstance(marks[-1], dict) else None


def _marks_cache(content: Any) -> bool:
    return isinstance(content, list) and any(isinstance(block, dict) and "cache_control" in block
                                             for block in content)
