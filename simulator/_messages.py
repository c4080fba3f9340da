"""What a valid Messages body is answered with: the chat side's text and token counts, in a Message.

The body's turns (``system`` first, as a system turn) are counted and answered exactly as ``_completions``
answers the same turns on the chat side; ``max_tokens`` cuts the text, with ``stop_reason`` ``max_tokens``.
The digest is taken over the body's canonical JSON (sorted keys), so a batch request's ``params`` get the very
answer ``POST /v1/messages`` gives them.

Prompt caching as Anthropic documents it (``core.cache_rules``): only at ``cache_control`` breakpoints (tools,
then system, then messages; a breakpoint's prefix is the turns up to and including the one holding it), each at
least the model's minimum length. The longest breakpoint prefix that is warm is read (``cache_read_input_tokens``);
what the last breakpoint adds beyond it is written (``cache_creation_input_tokens``, by duration in
``cache_creation``); ``input_tokens`` is the rest. An entry turns warm when its writer is answered
(``_prompt_cache``) and lives 5 minutes from its last hit, or an hour with ``"ttl": "1h"``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from typing import Any

from ._completions import (
    REASONING_PER_TOKEN,
    PlannedCompletion,
    body_digest,
    canonical_json,
    plan_completion,
    tool_input,
)
from llm_dispatch.core import ANTHROPIC_TTLS, cache_rules

from ._http import json_dumps
from ._state import SimState
from ._tokens import completion_text, count_tokens, message_token_counts

__all__ = ["MessageUsage", "PlannedMessage", "message_digest", "plan_message", "render_message"]

_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_use": "tool_use"}
REFUSAL_EXPLANATION = "This request was declined because it could enable cyber harm (simulator marker refuse)."
# Keeps Messages prefixes apart from chat prefixes in the one prompt cache.
_CACHE_DOMAIN = b"anthropic-messages\0"


@dataclass(frozen=True, slots=True)
class PlannedMessage:
    """The answer a body gets if nothing refuses it, and the prefixes its breakpoints mark for caching. ``thinking`` is the tokens it spends thinking (``thinking`` enabled or
    adaptive), part of its output; ``tool`` the tool it calls (name, input schema), for a body with tools."""

    completion: PlannedCompletion
    # (digest, tokens, ttl) of each breakpoint's prefix long enough to cache, in wire order.
    cache_prefixes: tuple[tuple[bytes, int, str], ...] = ()
    thinking: int = 0
    tool: tuple[str, dict[str, Any]] | None = None

    @property
    def prompt_tokens(self) -> int:
        return self.completion.prompt_tokens

    @property
    def output_tokens(self) -> int:
        if self.completion.kind == "refuse":
            return 0  # refused before any output: nothing billed
        return self.completion.completion_tokens + self.thinking


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


def plan_message(
    body: dict[str, Any], *, digest: bytes, kind: str | None = None, invalid_json_rate: float = 0.0
) -> PlannedMessage:
    """The answer to a body that ``messages_body_problem`` accepted (``kind``: what an answer marker asks); JSON of
    its ``output_config.format`` schema when it gives one, broken at ``invalid_json_rate``."""
    turns: list[dict[str, Any]] = list(body["messages"])
    system = body.get("system")
    if system is not None:
        turns.insert(0, {"role": "system", "content": system})
    tool = _called_tool(body) if kind not in ("refuse", "slow") else None
    # A tool call's output is its input's text; the chat side plans text for the rest.
    chat = {"model": body["model"], "messages": turns, "max_tokens": body["max_tokens"]}
    completion = plan_completion(chat, digest=digest, kind=kind, invalid_json_rate=invalid_json_rate,
                                 schema=_output_schema(body) if tool is None else None)
    if tool is not None:
        tokens = min(count_tokens(canonical_json(tool_input(tool[1]))) + 3, body["max_tokens"])
        completion = replace(completion, choices=[(completion.choices[0][0], tokens, "tool_use")])
    thinking = _thinking_tokens(body, completion)
    rules = cache_rules("anthropic", body["model"])
    tools_seed = canonical_json([body["model"], body.get("tools"), body.get("output_config")]).encode()
    prefixes: list[tuple[bytes, int, str]] = []
    for prefix_turns, ttl in _breakpoints(body, turns):
        whole = len(prefix_turns) - 1
        tokens = sum(completion.counts[:whole])
        if prefix_turns:
            # A mark on a turn's last block holds the whole turn, already counted; only a cut turn is counted anew.
            cut = len(prefix_turns[-1]["content"]) < len(turns[whole]["content"])
            tokens += message_token_counts(prefix_turns[whole:])[0] if cut else completion.counts[whole]
        if tokens < rules.minimum_tokens:
            continue  # "Any requests to cache fewer than this number of tokens will be processed without caching"
        prefix = hashlib.blake2b(_CACHE_DOMAIN + tools_seed + canonical_json(prefix_turns).encode(),
                                 digest_size=16).digest()
        prefixes.append((prefix, tokens, ttl))
    return PlannedMessage(completion=completion, cache_prefixes=tuple(prefixes), thinking=thinking, tool=tool)


def _breakpoints(body: dict[str, Any], turns: list[dict[str, Any]]) -> list[tuple[list[dict[str, Any]], str]]:
    """(the turns a breakpoint's prefix holds, the last cut after the marked block; its ttl) of each
    ``cache_control`` mark, in wire order: a tool's holds no turn (tools are not counted in the simulator's prompt
    tokens, only in the prefix's digest)."""
    marks: list[tuple[list[dict[str, Any]], str]] = []
    for tool in body.get("tools") or ():
        if isinstance(tool, dict) and isinstance(tool.get("cache_control"), dict):
            marks.append(([], tool["cache_control"].get("ttl") or "5m"))
    for index, turn in enumerate(turns):
        content = turn.get("content")
        if not isinstance(content, list):
            continue
        for at, block in enumerate(content):
            if isinstance(block, dict) and isinstance(block.get("cache_control"), dict):
                marks.append(([*turns[:index], {**turn, "content": content[:at + 1]}],
                              block["cache_control"].get("ttl") or "5m"))
    return marks


def _output_schema(body: dict[str, Any]) -> dict[str, Any] | None:
    output_config = body.get("output_config")
    spec = output_config.get("format") if isinstance(output_config, dict) else None
    if isinstance(spec, dict) and spec.get("type") == "json_schema":
        schema = spec.get("schema")
        return schema if isinstance(schema, dict) else None
    return None


def _thinking_tokens(body: dict[str, Any], completion: PlannedCompletion) -> int:
    """Tokens spent thinking before the answer (``thinking`` enabled or adaptive), within ``max_tokens`` with it:
    REASONING_PER_TOKEN per token of answer, as the chat side's reasoning models, or the budget if lower."""
    thinking = body.get("thinking")
    if not isinstance(thinking, dict) or thinking.get("type") not in ("enabled", "adaptive"):
        return 0
    wanted = completion.completion_tokens * REASONING_PER_TOKEN
    budget = thinking.get("budget_tokens")
    if isinstance(budget, int) and not isinstance(budget, bool):
        wanted = min(wanted, budget)
    max_tokens: int = body["max_tokens"]
    return max(0, min(wanted, max_tokens - completion.completion_tokens))


def _called_tool(body: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """The tool a body's answer calls: the one ``tool_choice`` names, else the first; none without tools or with
    ``tool_choice`` of type "none". (A model given tools may answer in text; this one calls.)"""
    tools = [tool for tool in body.get("tools") or () if isinstance(tool, dict) and isinstance(tool.get("name"), str)]
    choice = body.get("tool_choice")
    if not tools or (isinstance(choice, dict) and choice.get("type") == "none"):
        return None
    chosen = tools[0]
    if isinstance(choice, dict) and choice.get("type") == "tool":
        chosen = next((tool for tool in tools if tool["name"] == choice.get("name")), chosen)
    schema = chosen.get("input_schema")
    return chosen["name"], schema if isinstance(schema, dict) else {}


def render_message(plan: PlannedMessage, *, state: SimState, batch: bool = False) -> tuple[bytes, MessageUsage]:
    """(Message body, its usage); a marked prefix joins the prompt cache. ``batch``: answered in a Message Batch
    (its usage says so). An ``empty_choices`` answer is a Message with usage and no content; an ``error200`` one
    an error object with usage, both with status 200."""
    cache_read, cache_creation, cache_hour = _cache_use(plan, state=state)
    usage = MessageUsage(
        input_tokens=plan.prompt_tokens - cache_read - cache_creation, output_tokens=plan.output_tokens,
        cache_read_input_tokens=cache_read, cache_creation_input_tokens=cache_creation,
    )
    completion = plan.completion
    text_digest, tokens, finish_reason = completion.choices[0]
    usage_body: dict[str, Any] = {
        "input_tokens": usage.input_tokens,
        "cache_creation_input_tokens": usage.cache_creation_input_tokens,
        "cache_read_input_tokens": usage.cache_read_input_tokens,
        # The writes by duration, as Anthropic reports them (each priced apart).
        "cache_creation": {"ephemeral_5m_input_tokens": cache_creation - cache_hour,
                           "ephemeral_1h_input_tokens": cache_hour},
        "output_tokens": usage.output_tokens,
        "service_tier": "batch" if batch else "standard",
    }
    if plan.thinking:
        usage_body["output_tokens_details"] = {"thinking_tokens": plan.thinking}
    if completion.kind == "error200":
        error = {"type": "error", "error": {"type": "api_error", "message": "Internal server error (simulator "
                                            "marker error200)."}, "usage": usage_body}
        return json_dumps(error).encode(), usage
    message: dict[str, Any] = {
        "id": state.next_response_id(prefix="msg_"),
        "type": "message",
        "role": "assistant",
        "model": completion.model,
        "content": _content(plan, text_digest, tokens, finish_reason),
        "stop_reason": _STOP_REASONS[finish_reason],
        "stop_sequence": None,
        "usage": usage_body,
    }
    if completion.kind == "refuse":
        message["stop_reason"] = "refusal"
        message["stop_details"] = {"type": "refusal", "category": "cyber", "explanation": REFUSAL_EXPLANATION}
    elif completion.kind == "empty_choices":
        del message["content"]
    return json_dumps(message).encode(), usage


def _content(plan: PlannedMessage, digest: int, tokens: int, finish_reason: str) -> list[dict[str, Any]]:
    """A Message's content blocks: a thinking block first when it thought, then its text or its tool call (a refusal
    before any output has none)."""
    if plan.completion.kind == "refuse":
        return []
    blocks: list[dict[str, Any]] = []
    if plan.thinking:
        blocks.append({"type": "thinking", "thinking": "", "signature": f"sim{digest & 0xFFFFFFFF:08x}"})
    if plan.tool is not None:
        name, schema = plan.tool
        blocks.append({"type": "tool_use", "id": f"toolu_sim{digest & 0xFFFFFFFFFFFF:012x}", "name": name,
                       "input": tool_input(schema)})
    elif plan.completion.text is not None:
        blocks.append({"type": "text", "text": plan.completion.text})
    else:
        blocks.append({"type": "text", "text": completion_text(digest=digest, tokens=tokens,
                                                               stop=finish_reason == "stop")})
    return blocks


def _cache_use(plan: PlannedMessage, *, state: SimState) -> tuple[int, int, int]:
    """(tokens read, tokens written, of them at 1 hour): the longest warm breakpoint prefix is read, the rest up to
    the last breakpoint written, each part at the duration of the breakpoint that ends it; every breakpoint's
    prefix is kept (warm once this request is answered)."""
    if not plan.cache_prefixes:
        return 0, 0, 0
    now, answered_at = state.cache_times()
    cache = state.prompt_cache
    read = 0
    for prefix, tokens, _ in reversed(plan.cache_prefixes):
        if cache.warm(prefix, now=now):
            read = tokens
            break
    written = hour = 0
    covered = read
    wave = state.cache_wave
    for prefix, tokens, ttl in plan.cache_prefixes:
        ttl_s = ANTHROPIC_TTLS.get(ttl, ANTHROPIC_TTLS["5m"])
        if wave is None:
            cache.write(prefix, answered_at=answered_at, ttl_s=ttl_s)
        else:
            cache.pending(prefix, ttl_s=ttl_s)
            wave.append(prefix)
        if tokens > covered:
            written += tokens - covered
            hour += (tokens - covered) if ttl == "1h" else 0
            covered = tokens
    return read, written, hour
