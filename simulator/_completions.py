"""What a valid chat body is answered with: choices and usage fixed by the body's digest, and the
cached tokens its prompt earns. Shared by real-time chat and batch lines, so both answer alike."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from typing import Any, TypedDict

from llm_dispatch.core import THINKING_PER_ANSWER_TOKEN, cache_rules

from ._config import STRUCTURED_FAULTS
from ._http import completion_body, message_fields, unusable_body
from ._state import SimState
from ._tokens import REPLY_PRIMING_TOKENS, completion_text, count_tokens, message_token_counts, natural_length

__all__ = [
    "REASONING_MODELS",
    "REASONING_PER_TOKEN",
    "REFUSAL_TEXT",
    "SYSTEM_FINGERPRINT",
    "PlannedCompletion",
    "body_digest",
    "cache_use",
    "canonical_json",
    "json_answer",
    "plan_completion",
    "render_completion",
    "tool_input",
]

SYSTEM_FINGERPRINT = "fp_llmdsim01"
_MASK64 = (1 << 64) - 1

# Sorted keys: equal objects encode to equal bytes, whatever order a client wrote them in.
canonical_json = json.JSONEncoder(sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode


# Models that reason before they answer (OpenAI's o-series and GPT-5/6 families): their completion tokens include
# reasoning tokens, REASONING_PER_TOKEN for each token of visible answer, within the request's cap.
REASONING_MODELS = ("o1", "o3", "o4", "gpt-5", "gpt-6")
# The core's figure, so that the input check's warning (``core.THINKING_ROOM``) and the answers cut here agree.
REASONING_PER_TOKEN = THINKING_PER_ANSWER_TOKEN
# Models that report prompt-cache writes (cache_write_tokens, billed from the GPT-5.6 family on).
CACHE_WRITE_MODELS = ("gpt-5.6", "gpt-6")
REFUSAL_TEXT = "I'm sorry, but I can't help with that request."


class _Usage(TypedDict):
    """The usage a chat.completion body reports (``completion_body``'s and ``unusable_body``'s keywords)."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    cache_write_tokens: int | None
    reasoning_tokens: int


@dataclass(frozen=True, slots=True)
class PlannedCompletion:
    """The answer a body gets if nothing refuses it; ``choices`` are (text digest, tokens, finish_reason), each
    choice's tokens including its ``reasoning`` tokens. ``kind`` is an answer marker's (``ANSWER_KINDS``);
    ``tool`` the (name, parameters schema) each choice calls, for a body with tools."""

    model: str
    messages: list[dict[str, Any]]
    counts: list[int]  # tokens of each message
    prompt_tokens: int
    cap: int | None  # max_completion_tokens, else max_tokens
    n: int
    choices: list[tuple[int, int, str]]
    reasoning: tuple[int, ...] = ()
    kind: str | None = None
    tool: tuple[str, dict[str, Any]] | None = None
    # What the answer says served it: the tier asked for, as OpenAI reports it ("fast" is reported "priority").
    service_tier: str = "default"
    # The answer's text when the body asked for JSON of a schema (valid, or broken as ``kind`` says).
    text: str | None = None
    # What the prompt cache keys on besides the messages: ``prompt_cache_key``, and what precedes the messages on
    # the wire (tools, the answer's format).
    cache_key: str | None = None
    preamble: Any = None

    @property
    def completion_tokens(self) -> int:
        return sum(tokens for _, tokens, _ in self.choices)

    @property
    def reasoning_tokens(self) -> int:
        return sum(self.reasoning)


def body_digest(raw: bytes, *, state: SimState) -> bytes:
    """The digest that fixes a body's answer (and counts its ``[[sim:FAULTxN]]`` hits); the seed varies it."""
    return hashlib.blake2b(raw, digest_size=8, key=state.seed_key).digest()


# The tiers a request can ask for and what the answer reports (auto and default: the standard tier).
_SERVED_TIERS = {"flex": "flex", "priority": "priority", "fast": "priority", "scale": "scale"}


def plan_completion(
    body: dict[str, Any], *, digest: bytes, kind: str | None = None, invalid_json_rate: float = 0.0,
    schema: dict[str, Any] | None = None,
) -> PlannedCompletion:
    """The answer to a body that ``validate_chat_body`` accepted (``kind``: what an answer marker asks). A body with
    a JSON schema (``schema``, else its response_format's) is answered JSON of it, broken at ``invalid_json_rate``."""
    messages: list[dict[str, Any]] = body["messages"]
    counts = message_token_counts(messages)
    cap = body.get("max_completion_tokens") or body.get("max_tokens")
    n = body.get("n") or 1
    model: str = body["model"]
    # A reasoning model asked not to reason (reasoning_effort "none", GPT-5.1 and later) answers straight away.
    reasons = model.startswith(REASONING_MODELS) and body.get("reasoning_effort") != "none"
    tool = _called_tool(body) if kind != "refuse" else None
    tier = _SERVED_TIERS.get(str(body.get("service_tier") or "").lower(), "default")
    value = int.from_bytes(digest, "little")
    text: str | None = None
    answer_tokens: int | None
    if kind == "refuse":
        choices, reasoning = [(value, count_tokens(REFUSAL_TEXT), "stop")] * n, (0,) * n
    elif kind == "slow":
        # A long generation: its whole cap (16,000 tokens with none), mostly reasoning on a reasoning model.
        tokens = cap or 16_000
        thought = tokens - min(tokens, natural_length(value)) if reasons else 0
        choices, reasoning = [(value, tokens, "stop")] * n, (thought,) * n
    else:
        schema = schema if schema is not None else _response_schema(body)
        if schema is not None and tool is None:
            if kind in STRUCTURED_FAULTS and any(m.get("role") == "assistant" for m in messages if isinstance(m, dict)):
                kind = None  # a marker breaks the first answer only: asked again with it, the model gets it right
            kind = kind or _drawn_fault(value, rate=invalid_json_rate)
            text, truncated = json_answer(schema, value=value, kind=kind)
            answer_tokens = count_tokens(text)
        else:
            answer_tokens = _arguments_tokens(tool) if tool else None
        choices, reasoning = _plan_choices(value, cap=cap, n=n, reasons=reasons, answer_tokens=answer_tokens)
        if text is not None:
            if truncated or choices[0][2] == "length":
                text = text[: max(1, len(text) // 2)]
                choices = [(digest_, tokens, "length") for digest_, tokens, _ in choices]
            else:
                choices = [(digest_, tokens, "stop") for digest_, tokens, _ in choices]
    return PlannedCompletion(
        model=model, messages=messages, counts=counts, prompt_tokens=sum(counts) + REPLY_PRIMING_TOKENS,
        cap=cap, n=n, choices=choices, reasoning=reasoning, kind=kind, tool=tool, service_tier=tier,
        text=text, cache_key=_cache_key(body), preamble=[body.get("tools"), body.get("response_format")],
    )


def _cache_key(body: dict[str, Any]) -> str | None:
    key = body.get("prompt_cache_key")
    return key if isinstance(key, str) else None


def _response_schema(body: dict[str, Any]) -> dict[str, Any] | None:
    response_format = body.get("response_format")
    if not isinstance(response_format, dict) or response_format.get("type") != "json_schema":
        return None
    spec = response_format.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, dict) else None
    return schema if isinstance(schema, dict) else None


def _drawn_fault(value: int, *, rate: float) -> str | None:
    """A structured fault for ``rate`` of the digests (the low bits draw, the next ones pick which)."""
    if rate <= 0 or (value & 0xFFFF) >= rate * 0x10000:
        return None
    return STRUCTURED_FAULTS[(value >> 16) % len(STRUCTURED_FAULTS)]


def json_answer(schema: dict[str, Any], *, value: int, kind: str | None) -> tuple[str, bool]:
    """(JSON text for ``schema``, whether it is to be cut off): valid, or broken as the structured fault ``kind``."""
    answer = schema_value(schema, pick=value & 0xFF)
    if isinstance(answer, dict) and answer and kind in ("missing_field", "wrong_type"):
        first = next(iter(answer))
        if kind == "missing_field":
            del answer[first]
        else:
            answer[first] = 12345 if isinstance(answer[first], str) else "not a number"
    text = canonical_json(answer)
    if kind == "not_json":
        text = f"Sure! Here is the JSON you asked for: {text}"
    return text, kind == "truncated_json"


def schema_value(schema: Any, *, pick: int = 0, depth: int = 0) -> Any:
    """A value that fits ``schema`` (objects with every property, one item per array), the same for the same pick."""
    if not isinstance(schema, dict) or depth > 8:
        return None
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][pick % len(schema["enum"])]
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            return schema_value(schema[key][0], pick=pick, depth=depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    listed = schema.get("properties")
    if kind == "object" or isinstance(listed, dict):
        properties = listed if isinstance(listed, dict) else {}
        return {name: schema_value(spec, pick=pick + index, depth=depth + 1)
                for index, (name, spec) in enumerate(properties.items())}
    if kind == "array":
        items = schema.get("items")
        return [schema_value(items, pick=pick, depth=depth + 1)] if isinstance(items, dict) else []
    if kind == "integer":
        return max(pick, int(schema.get("minimum", 0)))
    if kind == "number":
        return max(pick / 2, float(schema.get("minimum", 0)))
    if kind == "boolean":
        return bool(pick & 1)
    if kind == "null":
        return None
    return ("alpha", "beta", "gamma", "delta")[pick % 4]


def render_completion(plan: PlannedCompletion, *, state: SimState) -> tuple[bytes, int]:
    """(chat.completion body, cached tokens) of a planned answer; its prompt prefixes join the cache. An
    ``empty_choices`` or ``error200`` answer reports the same usage around no answer at all."""
    cached, cache_written = cache_use(plan, state=state)
    written = cache_written if plan.model.startswith(CACHE_WRITE_MODELS) else None
    usage: _Usage = {"prompt_tokens": plan.prompt_tokens, "completion_tokens": plan.completion_tokens,
                     "cached_tokens": cached, "cache_write_tokens": written, "reasoning_tokens": plan.reasoning_tokens}
    if plan.kind in ("empty_choices", "error200"):
        return unusable_body(kind=plan.kind, response_id=state.next_response_id(), model=plan.model,
                             **usage), cached
    body = completion_body(
        response_id=state.next_response_id(),
        created=int(time.time()),
        model=plan.model,
        choices=[(_message(plan, index, choice_digest, tokens - thought, reason), reason)
                 for index, ((choice_digest, tokens, reason), thought)
                 in enumerate(zip(plan.choices, plan.reasoning or (0,) * plan.n))],
        system_fingerprint=SYSTEM_FINGERPRINT,
        service_tier=plan.service_tier,
        **usage,
    )
    return body, cached


def _message(plan: PlannedCompletion, index: int, digest: int, visible: int, reason: str) -> str:
    """The fields of one choice's message (after its role), as ``message_fields`` writes them."""
    if plan.kind == "refuse":
        return message_fields(None, refusal=REFUSAL_TEXT)
    if plan.text is not None:
        return message_fields(plan.text)
    if plan.tool is not None:
        name, schema = plan.tool
        arguments = canonical_json(tool_input(schema))
        call = {"id": f"call_sim{digest & 0xFFFFFFFFFFFF:012x}{index}", "type": "function",
                "function": {"name": name, "arguments": arguments}}
        return message_fields(None, tool_calls=[call])
    return message_fields(completion_text(digest=digest, tokens=visible, stop=reason == "stop"))


def _called_tool(body: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """The function tool a body's answer calls: the one ``tool_choice`` names, else the first; none when it has
    no function tools or ``tool_choice`` is "none". (A model given tools may answer in text; this one calls.)"""
    functions = [tool.get("function") for tool in body.get("tools") or () if isinstance(tool, dict)
                 and tool.get("type") == "function"]
    tools = [function for function in functions
             if isinstance(function, dict) and isinstance(function.get("name"), str)]
    choice = body.get("tool_choice")
    if not tools or choice == "none":
        return None
    chosen = tools[0]
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        named = choice["function"].get("name")
        chosen = next((tool for tool in tools if tool["name"] == named), chosen)
    schema = chosen.get("parameters")
    return chosen["name"], schema if isinstance(schema, dict) else {}


def tool_input(schema: dict[str, Any]) -> dict[str, Any]:
    """Arguments for a tool call that fit ``schema``'s required properties (by type), the same every time."""
    listed = schema.get("properties")
    properties = listed if isinstance(listed, dict) else {}
    named = schema.get("required")
    required = named if isinstance(named, list) else list(properties)
    words = ("alpha", "beta", "gamma", "delta")
    values: dict[str, Any] = {}
    for position, name in enumerate(required):
        given = properties.get(name)
        spec = given if isinstance(given, dict) else {}
        kind = spec.get("type")
        pick = position
        if isinstance(spec.get("enum"), list) and spec["enum"]:
            values[name] = spec["enum"][pick % len(spec["enum"])]
        elif kind == "integer":
            values[name] = pick
        elif kind == "number":
            values[name] = pick / 2
        elif kind == "boolean":
            values[name] = bool(pick & 1)
        elif kind == "array":
            values[name] = []
        elif kind == "object":
            values[name] = {}
        else:
            values[name] = words[pick % len(words)]
    return values


def _arguments_tokens(tool: tuple[str, dict[str, Any]]) -> int:
    """A tool call's completion tokens: its arguments' text, and its name and framing."""
    return count_tokens(canonical_json(tool_input(tool[1]))) + count_tokens(tool[0]) + 3


def _choice_digest(digest: int, index: int) -> int:
    # splitmix64-style scramble so each extra choice gets its own length and text.
    x = (digest + index * 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    return ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64


def _plan_choices(
    digest: int, *, cap: int | None, n: int, reasons: bool = False, answer_tokens: int | None = None
) -> tuple[list[tuple[int, int, str]], tuple[int, ...]]:
    """(text digest, completion tokens, finish_reason) of each choice, all fixed by the body's digest, and the
    reasoning tokens among each one's. A reasoning model thinks first: a cap too small for thought and answer
    is spent on the thought, and the answer is cut (finish_reason "length"). ``answer_tokens``: a tool call's."""
    planned = []
    reasoning = []
    for index in range(n):
        choice_digest = digest if index == 0 else _choice_digest(digest, index)
        visible = natural_length(choice_digest) if answer_tokens is None else answer_tokens
        thought = visible * REASONING_PER_TOKEN if reasons else 0
        finish = "stop" if answer_tokens is None else "tool_calls"
        if cap is not None and thought + visible > cap:
            thought = min(thought, cap)
            planned.append((choice_digest, cap, "length"))
        else:
            planned.append((choice_digest, thought + visible, finish))
        reasoning.append(thought)
    return planned, tuple(reasoning)


def cache_use(plan: PlannedCompletion, *, state: SimState, provider: str = "openai") -> tuple[int, int]:
    """(cached tokens read, tokens written to the cache) of a planned answer's prompt, by ``provider``'s automatic
    (OpenAI) or implicit (Gemini) cache (``core.cache_rules``; ``_prompt_cache`` says when an entry is warm)."""
    rules = cache_rules(provider, plan.model)
    if sum(plan.counts) < rules.minimum_tokens:
        return 0, 0
    now, answered_at = state.cache_times()
    cache = state.prompt_cache
    # Prefixes are whole messages (close enough to OpenAI's 128-token blocks for a simulator), after what comes
    # before the messages on the wire (tools, the answer's schema); a prompt_cache_key routes to its own machine.
    key = plan.cache_key if rules.key_requests_per_minute is not None else None
    chain = hashlib.blake2b(canonical_json([provider, plan.model, key, plan.preamble]).encode(), digest_size=16)
    prefixes: list[tuple[bytes, int]] = []
    total = 0
    for message, tokens in zip(plan.messages, plan.counts):
        chain.update(canonical_json(message).encode())
        total += tokens
        if total >= rules.minimum_tokens:
            prefixes.append((chain.copy().digest(), total))
    longest = rules.cached_part(prefixes[-1][1])
    # The route: the prompt's start (its first cacheable prefix stands for OpenAI's first ~256 tokens) and key.
    if rules.key_requests_per_minute is not None and cache.overflows(
            prefixes[0][0], now=now, per_minute=state.config.cache_overflow_rpm):
        state.stats.cache_overflows += 1
        return 0, longest  # a cold machine writes it and keeps it to itself
    cached = 0
    for prefix, tokens in reversed(prefixes):
        if cache.warm(prefix, now=now):
            cached = rules.cached_part(tokens)
            break
    if cached and provider == "gemini" and state.rng.random() >= state.config.gemini_implicit_hit_rate:
        cached = 0  # implicit caching missed, as Google allows
    for prefix, _ in prefixes:
        cache.write(prefix, answered_at=answered_at, ttl_s=rules.ttl_s)
    # What the cache did not hold of the longest prefix is written now.
    return cached, max(0, longest - cached)
