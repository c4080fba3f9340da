"""Plain value types shared by the client, the dispatcher and storage: a request and its outcome."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from ._json import canonical_json
from ._status import Route

__all__ = ["TRUNCATED_FINISH_REASONS", "ChatRequest", "ChatResult", "dedupe_key"]

# Answers cut short: at the request's cap (OpenAI's "length", a response's incomplete "max_output_tokens",
# Anthropic's "max_tokens") or at the model's context
# window (Anthropic's "model_context_window_exceeded"). Reports flag them; the text is stored as it came.
TRUNCATED_FINISH_REASONS = frozenset({"length", "max_tokens", "model_context_window_exceeded", "max_output_tokens",
                                      "MAX_TOKENS"})


def dedupe_key(*, model: str, messages: list[dict[str, Any]], params: dict[str, Any], endpoint: str = "chat") -> str:
    """A stable hash of everything that decides what a provider answers (not ids or metadata); a chat's is what
    it was before there were other endpoints, so stored answers are still found."""
    request: dict[str, Any] = {"model": model, "messages": messages, "params": params}
    if endpoint != "chat":
        request["endpoint"] = endpoint
    return hashlib.sha256(canonical_json(request).encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """One request: a chat completion's body is ``{"model", "messages", **params}``; ``endpoint`` says which API
    it goes to (``_endpoints.ENDPOINTS``), and that API's body is made from the same three."""

    model: str
    messages: list[dict[str, Any]]
    params: dict[str, Any] = field(default_factory=dict)
    endpoint: str = "chat"
    # A background response already created for it (``responses`` only): polled to its end, never created again.
    # Not part of what it asks, so not of its key.
    background_id: str | None = None
    # The lane it goes by (``REQUEST_ROUTES``; None: a plain request): ``flex`` is sent at that service tier, a
    # background lane in background mode with its completion window. Not part of what it asks, so not of its key.
    lane: Route | None = None
    # Background creates sent for it before whose ids were never stored (a run killed between a create's answer and
    # storing its id): each may be running and billed, so its answer counts them as possibly billed.
    lost_creates: int = 0

    def body(self) -> dict[str, Any]:
        return {**self.params, "model": self.model, "messages": self.messages}

    @property
    def key(self) -> str:
        return dedupe_key(model=self.model, messages=self.messages, params=self.params, endpoint=self.endpoint)


@dataclass(slots=True)
class ChatResult:
    """A successful chat completion, as stored: text, usage and how long it took. A value: nothing changes one
    once made (not frozen, since a frozen dataclass costs three times as much to make, once per answer)."""

    text: str | None
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    model: str | None
    response_id: str | None
    latency_s: float  # from the first attempt's send to the answer: retries and their waits included, queueing for a slot not
    attempts: int = 1
    # Input tokens written to the provider's prompt cache (Anthropic's cache_creation_input_tokens, OpenAI's
    # cache_write_tokens); already in prompt_tokens, as cached_tokens (cache reads) are.
    cache_creation_tokens: int = 0
    # Those of them written for the longer duration (Anthropic's 1-hour writes), priced apart.
    cache_creation_extended_tokens: int = 0
    # Output tokens spent thinking (OpenAI's reasoning_tokens, Anthropic's thinking_tokens); already in
    # completion_tokens.
    reasoning_tokens: int = 0
    # The service tier the answer says served it (OpenAI's service_tier; Anthropic's usage.service_tier, or
    # "fast" for its fast mode), which its price follows; None where the answer does not say.
    service_tier: str | None = None
    # The tool calls the answer makes, in OpenAI's assistant-message shape (``{"id", "type": "function",
    # "function": {"name", "arguments": <JSON text>}}``; Anthropic's tool_use blocks translated to it), so an
    # answer can go back into a prompt file as an assistant turn. None when it makes none.
    tool_calls: list[dict[str, Any]] | None = None
    # Set when the model refused: OpenAI's message.refusal, or Anthropic's stop_details (a refusal stop). A
    # refusal is stored as such (status ``refused``), never as an answer to reuse.
    refusal: str | None = None
    # The call's attempts the provider may have billed: this answer's (0 when the provider says it bills none:
    # Anthropic's refusal before any output), and a generation lost before it (timed out or cut off).
    maybe_billed: int = 1
    # For a request with a JSON schema (``_structured.answer_schema``), once checked: the answer's value when it
    # follows the schema, else ``violation``, the first thing wrong in words.
    parsed: Any = None
    violation: str | None = None
    # An embeddings answer's vector as float32 little-endian bytes (4 per dimension); None for any other answer.
    embedding: bytes | None = None
    # A packed embeddings request's answer (several texts, ``_packing``): their vectors in input order, and no
    # ``embedding``. Never stored as it is: ``unpack_embeddings`` makes a result per text.
    embeddings: tuple[bytes, ...] | None = None
