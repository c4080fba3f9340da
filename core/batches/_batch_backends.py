"""Each provider's batch backend, side by side: a provider's Batch API is its module and its line here."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Final

from ._batch_api import BatchApi
from ._gemini_batches import GeminiBatchApi
from ._message_batches import MessageBatchApi
from ._openai_batches import OpenAIBatchApi

if TYPE_CHECKING:
    from ..http._client import LLMClient

__all__ = ["BACKENDS", "batch_api"]

BACKENDS: Final[Mapping[str, type[BatchApi]]] = MappingProxyType({
    "openai": OpenAIBatchApi,
    "anthropic": MessageBatchApi,
    "gemini": GeminiBatchApi,
})


def batch_api(client: LLMClient) -> BatchApi:
    """The Batch API of ``client``'s provider (by the wire it speaks), its calls sent by ``client``."""
    return BACKENDS[client.wire](client)
