"""A run's clients, one per provider: a prompt's model decides which one sends it."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import httpx

from llm_dispatch.core import PROVIDERS, BatchApi, ChatRequest, ChatResult, LLMClient, PackLimits, Settings, \
    batch_api, provider_lookup

__all__ = ["Clients"]


class Clients:
    """The clients of one run, each made the first time its provider is needed and closed with the run.

    Each provider's client has its own adaptive limit, its own pace from its own rate-limit headers, and
    its own batches; the run's real-time requests to all providers together stay within
    ``settings.concurrency`` (the senders' worker pool), so a provider that pauses holds workers that
    the other could use until its pause ends. ``chat`` sends a request with the client of
    its model's provider (``settings.model_providers``, then ``claude-*`` -> Anthropic), so a run's
    real-time half sends a mixed job through one object. A provider whose key is missing raises
    ``ConfigError`` when it is first needed, before any of its requests is sent.
    """

    def __init__(
        self,
        *,
        settings: Settings,
        transport: httpx.AsyncBaseTransport | None = None,
        clients: Iterable[LLMClient] = (),
    ) -> None:
        self._settings = settings
        self._transport = transport
        self._clients: dict[str, LLMClient] = {client.provider: client for client in clients}
        self._batch_apis: dict[str, BatchApi] = {}
        # Each model's client, once its provider's is made: ``chat`` looks a request's up once per model.
        self._by_model: dict[str, LLMClient] = {}
        self.provider_of: Callable[[str], str] = provider_lookup(settings.model_providers)

    @classmethod
    def of(cls, *clients: LLMClient, settings: Settings | None = None) -> Clients:
        """Clients that are already open (each for its own provider), closed with this object."""
        return cls(settings=settings or Settings(), clients=clients)

    def for_provider(self, provider: str) -> LLMClient:
        client = self._clients.get(provider)
        if client is None:
            if provider not in PROVIDERS:
                raise ValueError(f"provider must be one of {', '.join(PROVIDERS)}, got {provider!r}")
            client = LLMClient.from_settings(self._settings, provider=provider, transport=self._transport)
            self._clients[provider] = client
        return client

    def batch_api(self, provider: str) -> BatchApi:
        """The provider's Batch API (``core.batch_api``), one per run: its creates take turns where the provider
        needs them to."""
        api = self._batch_apis.get(provider)
        if api is None:
            api = self._batch_apis[provider] = batch_api(self.for_provider(provider))
        return api

    def require(self, providers: Iterable[str]) -> None:
        """Make the client of each provider now: a missing key raises ``ConfigError`` before anything is sent."""
        for provider in sorted(providers):
            self.for_provider(provider)

    def for_model(self, model: str) -> LLMClient:
        client = self._by_model.get(model)
        if client is None:
            client = self._by_model[model] = self.for_provider(self.provider_of(model))
        return client

    def pack_limits(self, request: ChatRequest) -> PackLimits:
        """How many embeddings texts one request to the model's provider may carry (``send_all`` packs within them)."""
        return self.for_model(request.model).pack_limits(request)

    async def chat(self, request: ChatRequest, **options: Any) -> ChatResult:
        """One request, by the client of its model's provider (``options``: ``LLMClient.chat``'s)."""
        client = self._by_model.get(request.model) or self.for_model(request.model)
        return await client.chat(request, **options)

    @property
    def opened(self) -> dict[str, LLMClient]:
        """The clients made so far, by provider."""
        return dict(self._clients)

    async def aclose(self) -> None:
        clients, self._clients, self._by_model = list(self._clients.values()), {}, {}
        for client in clients:
            await client.aclose()
