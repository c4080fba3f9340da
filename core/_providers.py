"""Which provider a model's prompts go to: the user's own mapping first, then the built-in rule."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from fnmatch import fnmatchcase

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._settings import Settings

__all__ = ["BUILTIN_MODEL_PROVIDERS", "PROVIDERS", "provider_for", "provider_lookup"]

# Every provider a prompt can go to; a model's provider is decided by ``provider_for``.
PROVIDERS: tuple[str, ...] = ("openai", "anthropic", "gemini")
# Checked after the user's ``model_providers``; a model no pattern matches goes to the OpenAI-compatible endpoint.
BUILTIN_MODEL_PROVIDERS: tuple[tuple[str, str], ...] = (("claude-*", "anthropic"), ("gemini-*", "gemini"))


def provider_for(model: str, *, settings: Settings) -> str:
    """The provider (one of ``PROVIDERS``) for ``model``: an exact name in ``settings.model_providers``, then its
    globs in the order given, then ``claude-*`` -> anthropic, ``gemini-*`` -> gemini; anything else is ``openai``."""
    return _provider(model, settings.model_providers)


def provider_lookup(model_providers: Mapping[str, str] | None = None) -> Callable[[str], str]:
    """``provider_for`` over one mapping, each model matched once: for a pass over millions of prompts."""
    mapping = model_providers or {}
    known: dict[str, str] = {}

    def lookup(model: str) -> str:
        provider = known.get(model)
        if provider is None:
            provider = known[model] = _provider(model, mapping)
        return provider

    return lookup


def _provider(model: str, mapping: Mapping[str, str]) -> str:
    exact = mapping.get(model)
    if exact is not None:
        return exact
    for pattern, provider in mapping.items():
        if fnmatchcase(model, pattern):
            return provider
    for pattern, provider in BUILTIN_MODEL_PROVIDERS:
        if fnmatchcase(model, pattern):
            return provider
    return "openai"
