"""What differs between providers on the wire, in one value the client's one send path reads.

A ``Wire`` says where a chat goes, how the key is sent, how a ``ChatRequest`` becomes a body and an answer a
``Chat``, where the rate-limit headers are, and what to tell the user for each error status. Retries are the
same for every provider (408, 409, 429 and 5xx, Anthropic's 529 included; ``retry-after`` honoured, or a Gemini
error's ``RetryInfo.retryDelay``; ``x-should-retry`` obeyed), as the providers' own SDKs do. A path may name the
request's model as ``{model}`` (Gemini's ``/v1beta/models/{model}:generateContent``, and
``:batchEmbedContents`` for its embeddings).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from urllib.parse import quote

import httpx

from ._anthropic import anthropic_params
from ._anthropic_answers import parse_message
from ._embeddings import embeddings_body, parse_embedding
from ._gemini import GEMINI_CHAT_PATH, gemini_body
from ._gemini_answers import parse_generate_content
from ._gemini_embeddings import GEMINI_EMBED_PATH, gemini_embeddings_body, parse_batch_embed
from ._packing import EMBEDDING_PACK_LIMITS, GEMINI_EMBEDDING_PACK_LIMITS, PackLimits
from ._openai_responses import parse_response, responses_body
from .._exceptions import ConfigError
from ..rules._model_rules import openai_body
from ._ratelimit_headers import OPENAI_RATE_LIMIT_HEADERS, RateLimitHeaders
from ._responses import Chat, parse_chat
from .._settings import DEFAULT_ANTHROPIC_VERSION, DEFAULT_MAX_TOKENS, AuthHeader, Settings
from .._providers import PROVIDERS
from .._types import ChatRequest

__all__ = ["ANTHROPIC_RATE_LIMIT_HEADERS", "GEMINI_WIRE", "NO_RATE_LIMIT_HEADERS", "OPENAI_WIRE", "STATUS_HINTS",
           "UNUSABLE_HINT", "Route", "Wire", "anthropic_wire", "check_provider_key", "display_url", "provider_settings",
           "reply_cap",
           "wire_for"]

# What to do about an error status from an OpenAI-compatible endpoint; each provider's wire may word its own.
STATUS_HINTS: dict[int | str, str] = {
    400: "Fix the request: check the model name and the parameters sent.",
    401: "Check the API key (LLM_DISPATCH_API_KEY or OPENAI_API_KEY), and LLM_DISPATCH_AUTH_HEADER=api-key for Azure.",
    403: "The key may not use this model or endpoint; check the account's access.",
    404: "Check the model name and LLM_DISPATCH_BASE_URL (usually ending in /v1).",
    408: "The provider timed the request out; try again later.",
    409: "The provider reported a conflict; try again later.",
    422: "Fix the request parameters.",
    429: "Rate limited: lower LLM_DISPATCH_CONCURRENCY, set LLM_DISPATCH_RPM / LLM_DISPATCH_TPM, or check the quota.",
}
UNUSABLE_HINT = "Check that LLM_DISPATCH_BASE_URL points at an OpenAI-compatible API (usually ending in /v1)."
ANTHROPIC_RATE_LIMIT_HEADERS = RateLimitHeaders(
    limit="anthropic-ratelimit-{kind}-limit",
    remaining="anthropic-ratelimit-{kind}-remaining",
    reset="anthropic-ratelimit-{kind}-reset",
)
ANTHROPIC_HINTS: Mapping[int | str, str] = {
    **STATUS_HINTS,
    401: "Check the Anthropic API key (ANTHROPIC_API_KEY or LLM_DISPATCH_ANTHROPIC_API_KEY).",
    403: "The Anthropic key may not use this model or endpoint; check the workspace's access.",
    404: "Check the model name and LLM_DISPATCH_ANTHROPIC_BASE_URL (the host alone, without /v1).",
    413: "The request is larger than Anthropic accepts; shorten the prompt or its images.",
    429: "Rate limited: lower LLM_DISPATCH_CONCURRENCY, set LLM_DISPATCH_RPM / LLM_DISPATCH_TPM, "
         "or check the Anthropic tier's limits.",
    529: "Anthropic is overloaded; try again later.",
    # By reason (an error type, or a 429's details.error_code): the account's, so waiting does not help.
    "billing_error": "Anthropic refused for billing (billing_error): check the organization's credit balance and "
                     "payment details in the Anthropic Console (Settings > Billing).",
    "enforced_spend_limit_reached": "The organization reached its monthly spend limit: raise it in the Anthropic "
                                    "Console (Settings > Limits), or wait for the next month.",
    "contract_spend_limit_reached": "The organization reached its contract's spend limit: see the Anthropic "
                                    "Console (Settings > Limits) or your account team.",
}
# Gemini sends no rate-limit headers (its pace is learnt from what its 429s say): templates no header matches.
NO_RATE_LIMIT_HEADERS = RateLimitHeaders(limit="", remaining="", reset="")
# By status, then by Google's error status word (``error.status``, which ``error_reason`` reads), as the Gemini API's
# troubleshooting page lists them (ai.google.dev/gemini-api/docs/troubleshooting).
GEMINI_HINTS: Mapping[int | str, str] = {
    **STATUS_HINTS,
    400: "Fix the request (INVALID_ARGUMENT: a malformed body, or a parameter the model does not take).",
    401: "Check the Gemini API key (GEMINI_API_KEY, GOOGLE_API_KEY or LLM_DISPATCH_GEMINI_API_KEY).",
    403: "The Gemini API key may not use this model (PERMISSION_DENIED); check the key's project and restrictions.",
    404: "Check the model name and LLM_DISPATCH_GEMINI_BASE_URL (the host alone: llm-dispatch adds /v1beta).",
    429: "Rate limited (RESOURCE_EXHAUSTED): lower LLM_DISPATCH_CONCURRENCY, set LLM_DISPATCH_RPM / "
         "LLM_DISPATCH_TPM, or raise the project's quota (ai.google.dev/gemini-api/docs/rate-limits).",
    503: "Gemini is overloaded (UNAVAILABLE); try again later.",
    504: "Gemini could not finish in time (DEADLINE_EXCEEDED): try again, or shorten the prompt.",
    "API_KEY_INVALID": "Gemini refused the API key (API_KEY_INVALID): check GEMINI_API_KEY, GOOGLE_API_KEY or "
                       "LLM_DISPATCH_GEMINI_API_KEY.",
    "FAILED_PRECONDITION": "Gemini's free tier is not available in this country: enable billing on the key's "
                           "project in Google AI Studio (FAILED_PRECONDITION).",
    "PERMISSION_DENIED": "The Gemini API key may not use this model or was refused (PERMISSION_DENIED): check the "
                         "key, its project and its restrictions in Google AI Studio.",
}
_LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})


class Route(NamedTuple):
    """Where one endpoint's request goes, how its body is made, and how its answer is read."""

    path: str
    body: Callable[[ChatRequest], dict[str, Any]]
    parse: Callable[[httpx.Response], Chat]

    def path_for(self, request: ChatRequest) -> str:
        """The path of ``request``'s call: the route's own, with the model put in where it names one (Gemini's)."""
        return self.path.format(model=quote(request.model, safe="")) if "{model}" in self.path else self.path


def display_url(base_url: str) -> str:
    """``base_url`` as messages and logs show it: no user, password or query (a key given as ``?key=``)."""
    return str(httpx.URL(base_url.rstrip("/")).copy_with(userinfo=b"", query=None))


def reply_cap(body: Mapping[str, Any]) -> int | None:
    """The cap on the reply a request body sets, as each provider names it."""
    cap = (body.get("max_completion_tokens") or body.get("max_tokens") or body.get("max_output_tokens")
           or (body.get("generationConfig") or {}).get("maxOutputTokens"))
    return cap if isinstance(cap, int) else None


def provider_settings(provider: str, settings: Settings) -> dict[str, Any]:
    """What a client of ``provider`` takes from ``settings`` beyond what every client takes: its endpoint and key,
    and what else its wire needs."""
    if provider == "anthropic":
        return {"base_url": settings.anthropic_base_url, "api_key": settings.anthropic_api_key,
                "anthropic_version": settings.anthropic_version, "default_max_tokens": settings.default_max_tokens}
    if provider == "gemini":
        return {"base_url": settings.gemini_base_url, "api_key": settings.gemini_api_key}
    return {"organization": settings.openai_org_id, "project": settings.openai_project_id}



@dataclass(frozen=True, slots=True)
class Wire:
    """One provider's side of every call. ``chat_body`` and ``parse_chat`` run once per request: keep them lean."""

    provider: str
    chat_path: str
    chat_body: Callable[[ChatRequest], dict[str, Any]]
    parse_chat: Callable[[httpx.Response], Chat]
    rate_limit_headers: RateLimitHeaders
    hints: Mapping[int | str, str] = field(default_factory=lambda: STATUS_HINTS)
    unusable_hint: str = UNUSABLE_HINT
    # The setting that names the endpoint, for a message about a connection that failed.
    url_setting: str = "LLM_DISPATCH_BASE_URL"
    version: str | None = None
    # The endpoints besides chat this provider speaks (``_endpoints.ENDPOINTS``).
    others: Mapping[str, Route] = field(default_factory=dict)
    # How many embeddings texts one request may carry (``_packing``).
    pack_limits: PackLimits = EMBEDDING_PACK_LIMITS

    def route(self, endpoint: str) -> Route:
        """How a request to ``endpoint`` is sent and read; ``ValueError`` for one this provider does not have."""
        if endpoint == "chat":
            return Route(self.chat_path, self.chat_body, self.parse_chat)
        route = self.others.get(endpoint)
        if route is None:
            raise ValueError(f"{self.provider} has no {endpoint} endpoint")
        return route

    def headers(
        self, key: str | None, *, auth_header: AuthHeader, organization: str | None = None, project: str | None = None
    ) -> dict[str, str]:
        """The fixed headers of every request: the key (when there is one); for Anthropic, the API version; for
        OpenAI, the organization and project a key of several should bill (as openai-python sends them)."""
        if self.provider == "anthropic":
            headers = {"anthropic-version": self.version or DEFAULT_ANTHROPIC_VERSION}
            if key is not None:
                headers["x-api-key"] = key
            return headers
        if self.provider == "gemini":
            # As google-genai's client sends a Developer API key (``_api_client.py``).
            return {"x-goog-api-key": key} if key is not None else {}
        headers = {}
        if key is not None:
            headers = {"api-key": key} if auth_header == "api-key" else {"Authorization": f"Bearer {key}"}
        if organization:
            headers["OpenAI-Organization"] = organization
        if project:
            headers["OpenAI-Project"] = project
        return headers

    def check_key(self, *, key_set: bool, base_url: str) -> None:
        """Anthropic and Gemini always want a key; only a local server (the simulator) goes without."""
        url = httpx.URL(base_url)
        if key_set or self.provider == "openai" or url.host in _LOCAL_HOSTS:
            return
        # Shown as the client shows it (``display_url``): a base URL's credentials and query never reach a message.
        shown = display_url(base_url)
        if self.provider == "anthropic":
            raise ConfigError(
                f"No Anthropic API key for {shown}: set ANTHROPIC_API_KEY (or LLM_DISPATCH_ANTHROPIC_API_KEY), "
                "or map the claude models elsewhere with LLM_DISPATCH_MODEL_PROVIDERS"
            )
        raise ConfigError(
            f"No Gemini API key for {shown}: set GEMINI_API_KEY (or GOOGLE_API_KEY, or "
            "LLM_DISPATCH_GEMINI_API_KEY), or map the gemini models elsewhere with LLM_DISPATCH_MODEL_PROVIDERS"
        )


OPENAI_WIRE = Wire(
    provider="openai",
    chat_path="/chat/completions",
    chat_body=openai_body,
    parse_chat=parse_chat,
    rate_limit_headers=OPENAI_RATE_LIMIT_HEADERS,
    others={"embeddings": Route("/embeddings", embeddings_body, parse_embedding),
            "responses": Route("/responses", responses_body, parse_response)},
)


def anthropic_wire(*, version: str = DEFAULT_ANTHROPIC_VERSION, default_max_tokens: int = DEFAULT_MAX_TOKENS) -> Wire:
    """Anthropic's Messages API; its base URL is the host (``https://api.anthropic.com``), the paths carry /v1."""
    return Wire(
        provider="anthropic",
        chat_path="/v1/messages",
        chat_body=functools.partial(anthropic_params, default_max_tokens=default_max_tokens),
        parse_chat=parse_message,
        rate_limit_headers=ANTHROPIC_RATE_LIMIT_HEADERS,
        hints=ANTHROPIC_HINTS,
        unusable_hint="Check that LLM_DISPATCH_ANTHROPIC_BASE_URL points at Anthropic's API (the host, without /v1).",
        url_setting="LLM_DISPATCH_ANTHROPIC_BASE_URL",
        version=version,
    )


# The Gemini Developer API; its base URL is the host (``https://generativelanguage.googleapis.com``, as the SDK's
# ``GOOGLE_GEMINI_BASE_URL``), the path carries the API version.
GEMINI_WIRE = Wire(
    provider="gemini",
    chat_path=GEMINI_CHAT_PATH,
    chat_body=gemini_body,
    parse_chat=parse_generate_content,
    rate_limit_headers=NO_RATE_LIMIT_HEADERS,
    hints=GEMINI_HINTS,
    unusable_hint="Check that LLM_DISPATCH_GEMINI_BASE_URL points at the Gemini API (the host, without /v1beta).",
    url_setting="LLM_DISPATCH_GEMINI_BASE_URL",
    others={"embeddings": Route(GEMINI_EMBED_PATH, gemini_embeddings_body, parse_batch_embed)},
    pack_limits=GEMINI_EMBEDDING_PACK_LIMITS,
)


def wire_for(provider: str, *, version: str = DEFAULT_ANTHROPIC_VERSION, default_max_tokens: int = DEFAULT_MAX_TOKENS) -> Wire:
    if provider == "openai":
        return OPENAI_WIRE
    if provider == "anthropic":
        return anthropic_wire(version=version, default_max_tokens=default_max_tokens)
    if provider == "gemini":
        return GEMINI_WIRE
    raise ValueError(f"provider must be one of {', '.join(PROVIDERS)}, got {provider!r}")


def check_provider_key(settings: Settings, *, provider: str) -> None:
    """Raise ``ConfigError`` when ``provider``'s client could not be made for want of a key, as ``LLMClient`` would."""
    if provider == "anthropic":
        key = settings.anthropic_api_key
        # A named Secret block stands for the key: the flow reads it, and says so if it is missing.
        key_set = (key is not None and bool(key.get_secret_value())) or settings.anthropic_api_key_block is not None
        wire_for(provider).check_key(key_set=key_set, base_url=settings.anthropic_base_url)
    elif provider == "gemini":
        key = settings.gemini_api_key
        key_set = (key is not None and bool(key.get_secret_value())) or settings.gemini_api_key_block is not None
        wire_for(provider).check_key(key_set=key_set, base_url=settings.gemini_base_url)
