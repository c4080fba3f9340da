"""Each provider's prompt-cache rules, as its own pages state them: the one place both the cache plan and the
simulator read them, so the plan and the server it is measured against cannot drift apart.

Sources:
- OpenAI, https://developers.openai.com/api/docs/guides/prompt-caching: caching is automatic for prompts of 1,024
  tokens or more, hits are counted in 128-token increments; a request is routed by a hash of the prompt's first
  ~256 tokens combined with ``prompt_cache_key``; past about 15 requests a minute for one prefix and key, requests
  overflow to other machines and cache effectiveness drops; prefixes stay for 5 to 10 minutes of inactivity (up to
  an hour off-peak). Reported in ``usage.prompt_tokens_details.cached_tokens``.
- Anthropic, https://platform.claude.com/docs/en/build-with-claude/prompt-caching: only at ``cache_control``
  breakpoints, at most 4 a request, the prefix in the order tools, system, messages; a minimum cacheable length per
  model (below it the request is served uncached, no error); a 5-minute TTL refreshed on each hit, or 1 hour with
  ``"ttl": "1h"``; writes cost 1.25x input (5 minutes) or 2x (1 hour), reads 0.1x; an entry is available only once
  the first response begins. Reported in ``cache_creation_input_tokens`` and ``cache_read_input_tokens``. The
  per-model minimums below are the table of that page as secondary sources copy it (docs.orq.ai's prompt caching
  page, LiteLLM's prompt caching page), which the stored copy of the page itself did not hold.
- Gemini, https://ai.google.dev/gemini-api/docs/caching: implicit caching on by default for Gemini 2.5 and newer,
  a minimum per model (2,048 tokens for 2.5 Flash and Pro, 4,096 for Gemini 3 and later, page of 2026-10-13),
  hits more likely for requests with the same prefix sent close together, "no cost saving guarantee". Reported in
  ``usageMetadata.cachedContentTokenCount``. Explicit caching, same page: a ``cachedContents`` resource made once
  (model, contents, systemInstruction, tools, toolConfig, ttl or expireTime, displayName) and named by each request's
  ``cachedContent``; "If not set, the TTL defaults to 1 hour", no minimum or maximum TTL; the minimum length is the
  page's one table (as implicit caching's); billed for the cached tokens at the reduced rate when a request reads them,
  and for storage by the TTL. The storage price per 1M tokens per hour is each model's ``cache_storage`` in the catalog,
  from https://ai.google.dev/gemini-api/docs/pricing (the "Context caching price" row: "$4.50 / 1,000,000 tokens per
  hour (storage price)" for 2.5 Pro and 3.1 Pro, "$1.00" for 2.5 Flash and Flash-Lite, "$0.50 ... through December
  31, 2026" for 3.8 Flash; read from transcriptions of the page, the stored copy of it did not hold the table). The
  create is priced as the prefix's input once (Vertex AI documents it so; Google's Gemini API page names no creation
  price, so the plan takes the dearer reading).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

__all__ = [
    "ANTHROPIC_BATCH_WRITERS",
    "ANTHROPIC_MAX_BREAKPOINTS",
    "ANTHROPIC_TTLS",
    "GEMINI_EXPLICIT_DEFAULT_TTL_S",
    "GEMINI_IMPLICIT_HIT_ASSUMED",
    "OPENAI_KEY_REQUESTS_PER_MINUTE",
    "CacheRules",
    "cache_rules",
]

# Anthropic: "You can define up to 4 cache breakpoints".
ANTHROPIC_MAX_BREAKPOINTS: Final = 4
# Anthropic processes a Message Batch's requests concurrently, and its batch processing page only recommends the
# 1-hour duration "for better cache hit rates" with shared context: how many of a group's requests start before the
# first is answered is not documented. The plan counts a group's first 100 batch requests as writes, and the
# simulator answers a batch 100 at a time (``batch_cache_wave``): an assumption, no provider's figure.
ANTHROPIC_BATCH_WRITERS: Final = 100
# Anthropic's two durations, in seconds: 5 minutes (the default, refreshed on each hit) and 1 hour.
ANTHROPIC_TTLS: Final[dict[str, float]] = {"5m": 300.0, "1h": 3600.0}
# OpenAI: "approximately 15 requests per minute" for one prefix and prompt_cache_key before overflow.
OPENAI_KEY_REQUESTS_PER_MINUTE: Final = 15

# Gemini: "If not set, the TTL defaults to 1 hour" (explicit caching).
GEMINI_EXPLICIT_DEFAULT_TTL_S: Final = 3600.0
# The share of a group's later requests the plan expects implicit caching to serve from the cache. Google documents
# no rate and promises none ("no cost saving guarantee"); an assumption, a little below the 97% the issue measured for
# OpenAI's automatic caching without overflow. The explicit plan, whose hits are guaranteed, is weighed against it.
GEMINI_IMPLICIT_HIT_ASSUMED: Final = 0.9

CacheStyle = Literal["automatic", "breakpoints", "implicit"]

# (model name prefix, minimum cacheable tokens), the first prefix that matches wins.
_ANTHROPIC_MINIMUMS: Final[tuple[tuple[str, int], ...]] = (
    ("claude-opus-4-5", 4096), ("claude-opus-4-6", 4096), ("claude-opus-4-7", 4096), ("claude-haiku-4-5", 4096),
    ("claude-sonnet-4-6", 2048), ("claude-3-5-haiku", 2048), ("claude-3-haiku", 2048),
    ("claude-opus-5", 512), ("claude-fable-5", 512),
)
_ANTHROPIC_DEFAULT_MINIMUM: Final = 1024  # Sonnet 4.x and 5, Opus 4, 4.1 and 4.8, per the same table
_GEMINI_MINIMUMS: Final[tuple[tuple[str, int], ...]] = (("gemini-2.5-", 2048),)
_GEMINI_DEFAULT_MINIMUM: Final = 4096  # Gemini 3 and later
_OPENAI_MINIMUM: Final = 1024
_OPENAI_INCREMENT: Final = 128
# OpenAI: "Cached prefixes generally remain active for 5 to 10 minutes of inactivity"; the lower bound.
_OPENAI_TTL_S: Final = 300.0
# Gemini names no duration for implicit caches; taken as OpenAI's lower bound.
_GEMINI_TTL_S: Final = 300.0


@dataclass(frozen=True, slots=True)
class CacheRules:
    """How one model's provider caches a prompt's prefix.

    ``style``: ``automatic`` (OpenAI: every prompt, routed by prefix and key), ``breakpoints`` (Anthropic: only
    where a request marks one), ``implicit`` (Gemini: every prompt, no key). ``minimum_tokens``: a shorter prefix
    is never cached; ``increment``: hits are whole multiples of it (1: any length); ``ttl_s``: how long an unused
    entry stays (Anthropic's default; ``ANTHROPIC_TTLS`` has both); ``key_requests_per_minute``: the rate one
    prefix and key takes before requests overflow to cold machines (None: no such limit documented)."""

    provider: str
    style: CacheStyle
    minimum_tokens: int
    increment: int = 1
    ttl_s: float = 300.0
    key_requests_per_minute: int | None = None

    def cached_part(self, tokens: int) -> int:
        """The part of a ``tokens``-long warm prefix a hit reports: nothing below the minimum, else whole
        increments."""
        if tokens < self.minimum_tokens:
            return 0
        return tokens // self.increment * self.increment


def _by_prefix(model: str, table: tuple[tuple[str, int], ...], default: int) -> int:
    return next((value for prefix, value in table if model.startswith(prefix)), default)


def cache_rules(provider: str, model: str) -> CacheRules:
    """The cache rules of ``model`` at ``provider`` (one of ``core.PROVIDERS``, a wire: a declared provider's model
    ``NAME/model`` is read by its name on the wire)."""
    model = model.rpartition("/")[2]
    if provider == "anthropic":
        return CacheRules(provider=provider, style="breakpoints", ttl_s=ANTHROPIC_TTLS["5m"],
                          minimum_tokens=_by_prefix(model, _ANTHROPIC_MINIMUMS, _ANTHROPIC_DEFAULT_MINIMUM))
    if provider == "gemini":
        return CacheRules(provider=provider, style="implicit", ttl_s=_GEMINI_TTL_S,
                          minimum_tokens=_by_prefix(model, _GEMINI_MINIMUMS, _GEMINI_DEFAULT_MINIMUM))
    return CacheRules(provider=provider, style="automatic", minimum_tokens=_OPENAI_MINIMUM,
                      increment=_OPENAI_INCREMENT, ttl_s=_OPENAI_TTL_S,
                      key_requests_per_minute=OPENAI_KEY_REQUESTS_PER_MINUTE)
