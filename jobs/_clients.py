"""A run's clients, one per provider: a prompt's model decides which one sends it."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

import httpx

from llm_dispatch.core import BatchApi, ChatRequest, ChatResult, LLMClient, PackLimits, ProviderTable, Settings, \
    batch_api

__all__ = ["Clients"]


class Clients:
    """The clients of one run, each made the first time its provider is needed and closed with the run.

    Each provider's client has its own adaptive limit, its own pace from its own rate-limit headers, and
    its own batches; the run's real-time requests to all providers together stay within
    ``settings.concurrency`` (the senders' worker pool), so a provider that pauses holds workers that
    the other could use until its pause ends. ``chat`` sends a request with the client of
    its model's provider (``providers``: the built-in three and those the providers file declares; see
    ``core.ProviderTable``), so a run's real-time half sends a mixed job through one object; a declared provider's
    request goes out under the model name its API knows (``groq/llama-3.3-70b`` as ``llama-3.3-70b``). A provider
    whose key is missing raises ``ConfigError`` when it is first needed, before any of its requests is sent.
    """

    def __init__(
        self,
        *,
        settings: Settings,
        transport: httpx.AsyncBaseTransport | None = None,
        clients: Iterable[LLMClient] = (),
        providers: ProviderTable | None = None,
    ) -> None:
        self._settings = settings
        self._transport = transport
        self._clients: dict[str, LLMClient] = {client.provider: client for client in clients}
        self._batch_apis: dict[str, BatchApi] = {}
        # Each model's client and the name it is sent under, once its provider's client is made.
        self._by_model: dict[str, tuple[LLMClient, str | None]] = {}
        self.providers = providers if providers is not None else ProviderTable.from_settings(settings)
        self.provider_of: Callable[[str], str] = self.providers.provider_of

    @classmethod
    def of(cls, *clients: LLMClient, settings: Settings | None = None) -> Clients:
        """Clients that are already open (each for its own provider), closed with this object."""
        return cls(settings=settings or Settings(), clients=clients)

    def for_provider(self, provider: str) -> LLMClient:
        client = self._clients.get(provider)
        if client is None:
            declared = self.providers.get(provider)  # a ValueError for a name no table holds
            declared.check_key(source=self.providers.source)
            client = LLMClient.from_settings(self._settings, provider=provider, transport=self._transport,
                                             declared=declared)
            self._clients[provider] = client
        return client

    def batch_api(self, provider: str) -> BatchApi:
        """The provider's Batch API (``core.batch_api``, by its wire), one per run: its creates take turns where the
        provider needs them to."""
        api = self._batch_apis.get(provider)
        if api is None:
            api = self._batch_apis[provider] = batch_api(self.for_provider(provider))
        return api

    def require(self, providers: Iterable[str]) -> None:
        """Make the client of each provider now: a missing key raises ``ConfigError`` before anything is sent."""
        for provider in sorted(providers):
            self.for_provider(provider)

    def for_model(self, model: str) -> LLMClient:
        return self._route(model)[0]

    def _route(self, model: str) -> tuple[LLMClient, str | None]:
        found = self._by_model.get(model)
        if found is None:
            route = self.providers.resolve(model)
            found = self._by_model[model] = (self.for_provider(route.provider),
                                             route.upstream if route.upstream != model else None)
        return found

    def upstream(self, model: str) -> str:
        """The name ``model`` (as recorded) is sent under: a declared provider's without its ``NAME/``."""
        return self.providers.resolve(model).upstream

    def sent_as(self, request: ChatRequest) -> ChatRequest:
        """``request`` as its provider's API takes it: under the model name that API knows (a batch line's too)."""
        upstream = self.upstream(request.model)
        return request if upstream == request.model else replace(request, model=upstream)

    def pack_limits(self, request: ChatRequest) -> PackLimits:
        """How many embeddings texts one request to the model's provider may carry (``send_all`` packs within them)."""
        return self.for_model(request.model).pack_limits(request)

    async def chat(self, request: ChatRequest, **options: Any) -> ChatResult:
        """One request, by the client of its model's provider (``options``: ``LLMClient.chat``'s)."""
        client, upstream = self._by_model.get(request.model) or self._route(request.model)
        if upstream is not None:
            request = replace(request, model=upstream)
        return await client.chat(request, **options)

    @property
    def opened(self) -> dict[str, LLMClient]:
        """The clients made so far, by provider."""
        return dict(self._clients)

    async def aclose(self) -> None:
        clients, self._clients, self._by_model = list(self._clients.values()), {}, {}
        for client in clients:
            await client.aclose()
