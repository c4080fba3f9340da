"""What a valid chat body is answered with: choices and usage fixed by the body's digest, and the
cached tokens its prompt earns. Shared by real-time chat and batch lines, so both answer alike."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from typing import Any

from ._http import completion_body
from ._state import SimState
from ._tokens import REPLY_PRIMING_TOKENS, completion_text, message_token_counts, natural_length

__all__ = [
    "SYSTEM_FINGERPRINT",
    "PlannedCompletion",
    "body_digest",
    "canonical_json",
    "plan_completion",
    "render_completion",
]

SYSTEM_FINGERPRINT = "fp_llmdsim01"
_CACHE_MIN_TOKENS = 1024  # OpenAI caches prompts from 1024 tokens on...
_CACHE_INCREMENT = 128  # ...and reports cache hits in steps of 128 tokens
_MASK64 = (1 << 64) - 1

# Sorted keys: equal objects encode to equal bytes, whatever order a client wrote them in.
canonical_json = json.JSONEncoder(sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode


@dataclass(frozen=True, slots=True)
class PlannedCompletion:
    """The answer a body gets if nothing refuses it; ``choices`` are (text digest, tokens, finish_reason)."""

    model: str
    messages: list[dict[str, Any]]
    counts: list[int]  # tokens of each message
    prompt_tokens: int
    cap: int | None  # max_completion_tokens, else max_tokens
    n: int
    choices: list[tuple[int, int, str]]
    # What the answer says served it: the tier asked for, as OpenAI reports it ("fast" is reported "priority").
    service_tier: str = "default"

    @property
    def completion_tokens(self) -> int:
        return sum(tokens for _, tokens, _ in self.choices)


def body_digest(raw: bytes, *, state: SimState) -> bytes:
    """The digest that fixes a body's answer (and counts its ``[[sim:FAULTxN]]`` hits); the seed varies it."""
    return hashlib.blake2b(raw, digest_size=8, key=state.seed_key).digest()


# The tiers a request can ask for and what the answer reports (auto and default: the standard tier).
_SERVED_TIERS = {"flex": "flex", "priority": "priority", "fast": "priority", "scale": "scale"}


def plan_completion(body: dict[str, Any], *, digest: bytes) -> PlannedCompletion:
    """The answer to a body that ``validate_chat_body`` accepted."""
    messages: list[dict[str, Any]] = body["messages"]
    counts = message_token_counts(messages)
    cap = body.get("max_completion_tokens") or body.get("max_tokens")
    n = body.get("n") or 1
    return PlannedCompletion(
        model=body["model"], messages=messages, counts=counts, prompt_tokens=sum(counts) + REPLY_PRIMING_TOKENS,
        cap=cap, n=n, choices=_plan_choices(int.from_bytes(digest, "little"), cap=cap, n=n),
        service_tier=_SERVED_TIERS.get(body.get("service_tier"), "default"),
    )


def render_completion(plan: PlannedCompletion, *, state: SimState) -> tuple[bytes, int]:
    """(chat.completion body, cached tokens) of a planned answer; its prompt prefixes join the cache."""
    cached = _cached_tokens(plan, state=state)
    body = completion_body(
        response_id=state.next_response_id(),
        created=int(time.time()),
        model=plan.model,
        choices=[
            (completion_text(digest=choice_digest, tokens=tokens, stop=reason == "stop"), reason)
            for choice_digest, tokens, reason in plan.choices
        ],
        prompt_tokens=plan.prompt_tokens,
        completion_tokens=plan.completion_tokens,
        cached_tokens=cached,
        system_fingerprint=SYSTEM_FINGERPRINT,
        service_tier=plan.service_tier,
    )
    return body, cached


def _choice_digest(digest: int, index: int) -> int:
    # splitmix64-style scramble so each extra choice gets its own length and text.
    x = (digest + index * 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    return ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64


def _plan_choices(digest: int, *, cap: int | None, n: int) -> list[tuple[int, int, str]]:
    """(text digest, completion tokens, finish_reason) of each choice, all fixed by the body's digest."""
    planned = []
    for index in range(n):
        choice_digest = digest if index == 0 else _choice_digest(digest, index)
        tokens = natural_length(choice_digest)
        if cap is not None and tokens > cap:
            planned.append((choice_digest, cap, "length"))
        else:
            planned.append((choice_digest, tokens, "stop"))
    return planned


def _cached_tokens(plan: PlannedCompletion, *, state: SimState) -> int:
    if sum(plan.counts) < _CACHE_MIN_TOKENS:
        return 0
    # Prefixes are whole messages: close enough to OpenAI's 128-token blocks for a simulator.
    chain = hashlib.blake2b(plan.model.encode(), digest_size=16)
    prefixes: list[tuple[bytes, int]] = []
    total = 0
    for message, tokens in zip(plan.messages, plan.counts):
        chain.update(canonical_json(message).encode())
        total += tokens
        if total >= _CACHE_MIN_TOKENS:
            prefixes.append((chain.copy().digest(), total))
    cache = state.prompt_cache
    cached = 0
    for prefix, tokens in reversed(prefixes):
        if prefix in cache:
            cached = tokens // _CACHE_INCREMENT * _CACHE_INCREMENT
            break
    state.remember_prefixes([prefix for prefix, _ in prefixes])
    return cached
