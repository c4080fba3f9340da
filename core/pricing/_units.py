"""The units every cost is kept in (whole picodollars per token) and the service-tier word an answer bills at."""

from __future__ import annotations

from decimal import Decimal
from typing import Any, Final

__all__ = ["PER_TOKENS", "PICO_PER_USD", "billing_tier", "from_pico"]

PER_TOKENS = Decimal(1_000_000)
# Stored costs are integers in this unit: a price per 1M tokens with up to six decimals, after any discount, is a
# whole number of picodollars per token (gpt-5-nano's cached input on the Batch API is 2.5 nanodollars a token, so
# nanodollars would not do).
PICO_PER_USD: Final = 10**12
_PICO_PER_TOKEN: Final = Decimal(PICO_PER_USD) / PER_TOKENS
# The words an answer (or a request) uses for the standard tier: OpenAI's "default"/"auto", Anthropic's
# "standard"/"standard_only", and "batch" (Anthropic's word on a batch result, priced by its route).
_STANDARD_TIERS: Final = frozenset({"", "default", "auto", "standard", "standard_only", "batch"})


def from_pico(picodollars: int) -> Decimal:
    """Dollars, exactly, from a cost in picodollars."""
    return Decimal(picodollars).scaleb(-12)


def billing_tier(service_tier: Any) -> str | None:
    """The tier a ``service_tier`` word (an answer's or a request's) bills at, as a model's ``tiers`` name it (or
    an alias: ``fast`` is OpenAI's new name of ``priority``); None for the standard tier."""
    if not isinstance(service_tier, str) or service_tier.strip().lower() in _STANDARD_TIERS:
        return None
    return service_tier.strip().lower()
