"""The provider endpoints a prompt can go to, and which of them each lane can send and read back.

A prompt names one (``endpoint``: ``chat`` by default); a batch file holds one, and a batch is only created for an
endpoint whose output lines this package can read, so no answer is read as another endpoint's and paid again.
"""

from __future__ import annotations

from typing import Literal

from ._exceptions import ConfigError

__all__ = [
    "BATCH_URLS",
    "DEFAULT_ENDPOINT",
    "ENDPOINTS",
    "Endpoint",
    "SUPPORTED_ENDPOINTS",
    "batch_url",
    "check_batch_url",
    "endpoint_problem",
]

Endpoint = Literal["chat", "responses", "embeddings"]
ENDPOINTS: tuple[Endpoint, ...] = ("chat", "responses", "embeddings")
DEFAULT_ENDPOINT: Endpoint = "chat"
# The endpoints this version sends and reads back, in both lanes; the others are refused at the input check.
SUPPORTED_ENDPOINTS: frozenset[str] = frozenset({"chat", "responses", "embeddings"})
# The ``url`` of a Batch API line (and the batch's ``endpoint``) for each.
BATCH_URLS: dict[str, str] = {
    "chat": "/v1/chat/completions",
    "responses": "/v1/responses",
    "embeddings": "/v1/embeddings",
}
# Providers with no such endpoint at all (Anthropic's API has no embeddings: its docs point to Voyage AI).
_NOT_OFFERED = {("anthropic", "embeddings"): "Anthropic has no embeddings endpoint; send embeddings to an OpenAI "
                                              "model (text-embedding-3-small, say)",
                ("anthropic", "responses"): "Anthropic has no Responses API; send claude models to chat (its "
                                             "Messages API)",
                ("gemini", "responses"): "Gemini has no Responses API; send gemini models to chat (its "
                                          "generateContent)"}


def endpoint_problem(endpoint: object, *, provider: str) -> str | None:
    """Why a prompt cannot go to ``endpoint`` at ``provider`` (one line), or None when it can."""
    if endpoint not in ENDPOINTS:
        return f"{endpoint!r} is not an endpoint; use {', '.join(ENDPOINTS)}"
    refused = _NOT_OFFERED.get((provider, str(endpoint)))
    if refused is not None:
        return refused
    if endpoint not in SUPPORTED_ENDPOINTS:
        return f"the {endpoint} endpoint is not supported by this version of llm-dispatch; use chat"
    return None


def batch_url(endpoint: str) -> str:
    """The Batch API ``url``/``endpoint`` of a supported endpoint; ``ConfigError`` for any other."""
    if endpoint not in SUPPORTED_ENDPOINTS:
        raise ConfigError(f"no Batch API lines for the {endpoint!r} endpoint: use one of "
                          f"{', '.join(sorted(SUPPORTED_ENDPOINTS))}")
    return BATCH_URLS[endpoint]


def check_batch_url(url: str) -> None:
    """Refuse, before anything is sent, a batch whose output lines would be read as another endpoint's answers
    (and so sent and paid again)."""
    readable = sorted(BATCH_URLS[name] for name in SUPPORTED_ENDPOINTS)
    if url not in readable:
        raise ConfigError(f"a batch to {url} cannot be read back by llm-dispatch (its lines would be taken for "
                          f"another endpoint's answers and paid again); batches go to {', '.join(readable)}")
