"""A cache plan per prefix group, chosen by cost, and how it changes each request at send time (never the stored
request: its key and reuse stay the same).

Per provider (rules and sources in ``_cache_rules``):
- OpenAI: ``prompt_cache_key`` per group, one key to start with, spread over as many as keep each under the ~15
  requests a minute the guide names once the answers show the provider overflowing (``_keys``); each key warmed
  once.
- Anthropic: a ``cache_control`` breakpoint on the last block of the shared prefix, with the TTL that outlives the
  gap between the group's requests (5 minutes, refreshed on each hit, else 1 hour), the write premium counted; none
  where the file set its own, where the prefix is shorter than the model's minimum, or where it costs more than it
  saves.
- Gemini: implicit caching, so a warm-up and the group's prompts kept together in order; or an explicit cached
  content (``_explicit``) made before the group's first request, where its create and storage for the group's
  expected duration cost less than implicit caching is expected to (its hits are not guaranteed:
  ``GEMINI_IMPLICIT_HIT_ASSUMED``).
Every kind of plan warms its key first: one request answered before the rest of the group (or key) leaves.

On the Batch API lane (``lane="batch"``) nothing can be warmed first (no provider documents cache hits between a
batch's requests as a thing a client can order) and a batch may take up to 24 hours (Anthropic's Message Batches
page): Anthropic's groups get a breakpoint with the 1-hour TTL, refreshed by each hit; OpenAI's and Gemini's caches
are automatic, so their lines are sent as written.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from .._providers import PROVIDERS
from .._status import Route

from .._types import ChatRequest, ChatResult
from ..pricing._pricing import PriceTable
from ..pricing._costs import storage_cost
from ..pricing._units import from_pico
from ..wire._gemini_caches import can_reference, referencing_cache
from ._cache_rules import (
    ANTHROPIC_BATCH_WRITERS,
    ANTHROPIC_TTLS,
    GEMINI_IMPLICIT_HIT_ASSUMED,
    CacheRules,
    cache_rules,
)
from ._explicit import ExplicitCaches
from ._keys import KeyDealer, KeyTicket, keys_for
from ._prefixes import PrefixGroup, prefix_key
from ._warmup import Warmth

__all__ = ["DEFAULT_PLAN_LATENCY_S", "CachePlan", "CacheTally", "GroupPlan", "plan_caches"]

# The latency a plan assumes for a request when none is measured: the rate a group is sent at is its share of the
# run's concurrency over it.
DEFAULT_PLAN_LATENCY_S = 5.0

Action = Literal["keys", "breakpoint", "implicit", "explicit", "as-given", "none"]
Lane = Literal["realtime", "batch"]


@dataclass(frozen=True, slots=True)
class GroupPlan:
    """What the plan does for one group: ``action`` (``keys``: OpenAI's prompt_cache_key, one key spread over up to
    about ``keys`` where the provider overflows;
    ``breakpoint``: an Anthropic breakpoint with ``ttl``; ``implicit``: Gemini's order; ``as-given``: the file's own
    breakpoints; ``none``: nothing, ``reason`` says why), the prefix's money with the plan and uncached (picodollars;
    None for a model without a price; ``worst_cost``: a keys plan's if the provider overflows, spread over ``keys``),
    and whether its first request warms the cache before the rest leave."""

    group: PrefixGroup
    action: Action
    reason: str
    keys: int = 0
    ttl: str | None = None
    warm_up: bool = False
    planned_cost: int | None = None
    uncached_cost: int | None = None
    worst_cost: int | None = None
    # A keys plan's share of the run's concurrency: the requests it has in flight at once.
    in_flight: float = 1.0
    # ``explicit``: the cache's TTL in seconds (the group's expected duration and a margin).
    ttl_s: float | None = None

    @property
    def saved(self) -> int | None:
        if self.planned_cost is None or self.uncached_cost is None:
            return None
        return self.uncached_cost - self.planned_cost


@dataclass(slots=True)
class CacheTally:
    """What a group's answers reported: how many, their cached (read) and written tokens, and their cost as
    reported beside the same usage with nothing cached (picodollars; 0 for a model without a price)."""

    answers: int = 0
    cached_tokens: int = 0
    written_tokens: int = 0
    cost: int = 0
    uncached_cost: int = 0
    # The longest prefix one answer reported (read plus written): the provider's count of it.
    prefix_seen: int = 0

    def hit_rate(self, prefix_tokens: int) -> float:
        """Cached tokens over the prefix tokens the answers held: the estimate's ``prefix_tokens``, or the provider's
        own count of it where an answer reported more."""
        held = max(prefix_tokens, self.prefix_seen) * self.answers
        return self.cached_tokens / held if held else 0.0

    def add(
        self, *, prices: PriceTable | None, model: str, route: Route, prompt_tokens: int, completion_tokens: int,
        cached_tokens: int, cache_creation_tokens: int, cache_creation_extended_tokens: int,
        service_tier: str | None, paid: int | None = None,
    ) -> None:
        """Count one answer's usage, its cost at ``prices`` as reported and with nothing cached. ``paid``: the cost
        stored with it (None: priced here), its uncached cost then ``paid`` plus the difference ``prices`` make."""
        self.answers += 1
        self.cached_tokens += cached_tokens
        self.written_tokens += cache_creation_tokens
        self.prefix_seen = max(self.prefix_seen, cached_tokens + cache_creation_tokens)
        if prices is None:
            return
        reported, plain = (prices.price(
            model=model, route=route, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
            service_tier=service_tier, cached_tokens=cached_tokens * as_reported,
            cache_creation_tokens=cache_creation_tokens * as_reported,
            cache_creation_extended_tokens=cache_creation_extended_tokens * as_reported)
            for as_reported in (1, 0))
        if reported is not None and plain is not None:
            cost = reported.cost if paid is None else paid
            self.cost += cost
            self.uncached_cost += cost + plain.cost - reported.cost


@dataclass(slots=True)
class CachePlan:
    """A run's plan, a ``GroupPlan`` per prefix group; ``prepare`` applies it to each request as it is sent, and
    names the warm-up key the request belongs to; ``warmth`` is the run's warm-up keys (every chunk's)."""

    groups: list[GroupPlan]
    warmth: Warmth = field(default_factory=Warmth)
    prices: PriceTable | None = None
    # Each group's answers so far (``answered``), by group key.
    tallies: dict[str, CacheTally] = field(default_factory=dict)
    # The run's explicit caches (``explicit`` groups); None: those groups go as implicit ones do.
    explicit: ExplicitCaches | None = None
    _by_key: dict[str, GroupPlan] = field(default_factory=dict)
    _dealers: dict[str, KeyDealer] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._by_key = {plan.group.key: plan for plan in self.groups}
        self._dealers = {plan.group.key: KeyDealer(
            group_key=plan.group.key, prompts=plan.group.prompts, in_flight=plan.in_flight,
            minimum_tokens=cache_rules(plan.group.provider, plan.group.model).minimum_tokens)
            for plan in self.groups if plan.action == "keys"}

    def keys_used(self, group_key: str) -> int | None:
        """How many prompt_cache_keys a keys plan's group is spread over so far (None: not a keys plan)."""
        dealer = self._dealers.get(group_key)
        return None if dealer is None else dealer.active

    @property
    def planned_cost(self) -> int:
        return sum(plan.planned_cost or 0 for plan in self.groups)

    @property
    def uncached_cost(self) -> int:
        return sum(plan.uncached_cost or 0 for plan in self.groups)

    def group_key(self, request: ChatRequest) -> str | None:
        """The key of the group ``request`` (as stored, before ``prepare``) belongs to; None for none planned."""
        key = prefix_key(request)
        return key if key is not None and key in self._by_key else None

    async def deal(self, request: ChatRequest, group_key: str | None) -> tuple[ChatRequest, KeyTicket | None]:
        """(``request`` as it leaves, its ticket): a keys plan's request (of the group ``group_key``, as
        ``group_key`` found it) gets its group's next prompt_cache_key as it is sent, so the keys follow what the
        answers so far showed (it may wait while new keys warm, ``_keys``); any other request is returned as given.
        Every ticket is given back once its request ends (``answered``, ``unanswered``)."""
        dealer = None if group_key is None else self._dealers.get(group_key)
        if dealer is None:
            return request, None
        ticket = await dealer.deal()
        return replace(request, params={**request.params, "prompt_cache_key": ticket.name}), ticket

    def unanswered(self, ticket: KeyTicket | None) -> None:
        """A dealt request ended with no answer: a writer's key is warmed again by a later request."""
        if ticket is not None:
            self._dealers[ticket.group_key].settled(ticket, cached_tokens=None)

    def answered(self, group_key: str, result: ChatResult, *, model: str, ticket: KeyTicket | None = None) -> None:
        """Count an answer of the group ``group_key`` in its tally, priced as reported and with nothing cached;
        ``ticket``: the key it was dealt (``deal``), told what the answer read."""
        if ticket is not None:
            self._dealers[ticket.group_key].settled(ticket, cached_tokens=result.cached_tokens,
                                                    latency_s=result.latency_s)
        self.tallies.setdefault(group_key, CacheTally()).add(
            prices=self.prices, model=model, route="realtime", prompt_tokens=result.prompt_tokens,
            completion_tokens=result.completion_tokens, cached_tokens=result.cached_tokens,
            cache_creation_tokens=result.cache_creation_tokens,
            cache_creation_extended_tokens=result.cache_creation_extended_tokens, service_tier=result.service_tier)

    async def referencing(self, request: ChatRequest, group_key: str | None) -> ChatRequest | None:
        """``request`` (as stored) naming its group's explicit cache, the cache made first where none is live; None
        for a request of no ``explicit`` group, or when no cache could be had (it then goes as ``prepare`` made it)."""
        plan = None if group_key is None else self._by_key.get(group_key)
        if plan is None or plan.action != "explicit" or self.explicit is None or plan.ttl_s is None:
            return None
        return await self.explicit.reference(request, group=plan.group, ttl_s=plan.ttl_s)

    def prepare(self, request: ChatRequest) -> tuple[ChatRequest, str | None]:
        """(``request`` as the plan sends it, the warm-up key it waits on or None). OpenAI's prompt_cache_key is
        not set here but as each request leaves (``deal``); its group waits on its first key's warm-up."""
        key = prefix_key(request)
        plan = None if key is None else self._by_key.get(key)
        if plan is None:
            return request, None
        if plan.action == "breakpoint":
            marked = _with_breakpoint(request, at=plan.group.prefix_messages - 1, ttl=plan.ttl)
            return marked, plan.group.key if plan.warm_up else None
        if plan.action == "explicit" and not plan.warm_up:
            return self._named(request, plan), None
        if not plan.warm_up:
            return request, None
        return request, plan.group.key


    def _named(self, request: ChatRequest, plan: GroupPlan) -> ChatRequest:
        """A Batch API line of an ``explicit`` group naming the cache made for it before the lines were written
        (``jobs.make_batch_caches``); as written where none was made."""
        name = None if self.explicit is None else self.explicit.known(plan.group.key)
        if name is None or not can_reference(request, prefix_messages=plan.group.prefix_messages):
            return request
        return referencing_cache(request, name=name, prefix_messages=plan.group.prefix_messages)


def _with_breakpoint(request: ChatRequest, *, at: int, ttl: str | None) -> ChatRequest:
    """``request`` with ``cache_control`` on the last block of message ``at`` (a text content made one block)."""
    mark: dict[str, Any] = {"type": "ephemeral"}
    if ttl == "1h":
        mark["ttl"] = "1h"
    message = request.messages[at]
    content = message.get("content")
    blocks: list[dict[str, Any]] = ([{"type": "text", "text": content}] if isinstance(content, str)
                                    else [dict(block) for block in content or ()])
    if not blocks:
        return request
    blocks[-1]["cache_control"] = mark
    messages = [*request.messages[:at], {**message, "content": blocks}, *request.messages[at + 1:]]
    return replace(request, messages=messages)


# A declared host of the OpenAI wire: OpenAI's prompt_cache_key may be refused there, and its caching is its own.
_UNDESCRIBED = "a declared OpenAI-compatible host: sent as written (no prompt_cache_key)"


def plan_caches(
    groups: Iterable[PrefixGroup], *, total_prompts: int, concurrency: int, prices: PriceTable | None = None,
    latency_s: float = DEFAULT_PLAN_LATENCY_S, lane: Lane = "realtime",
) -> CachePlan:
    """A plan for each group: the group is taken to be sent at its share of ``concurrency`` (its prompts over
    ``total_prompts``), each request taking ``latency_s``; costs are the prefix's tokens at ``prices`` on ``lane``
    (the Batch API's: see the module's docstring)."""
    if lane == "batch":
        return CachePlan([_batch_group(group, prices=prices) for group in groups], prices=prices)
    return CachePlan([_plan_group(group, total_prompts=max(total_prompts, group.prompts), concurrency=concurrency,
                                  prices=prices, latency_s=latency_s) for group in groups], prices=prices)


def _batch_group(group: PrefixGroup, *, prices: PriceTable | None) -> GroupPlan:
    uncached = _cost(prices, group, reads=0, writes=0, cached=0, route="batch")
    if group.provider not in PROVIDERS:
        return GroupPlan(group, "none", _UNDESCRIBED, uncached_cost=uncached, planned_cost=uncached)
    rules = cache_rules(group.provider, group.model)
    if group.own_breakpoints:
        return GroupPlan(group, "as-given", "the file sets its own cache_control breakpoints", uncached_cost=uncached,
                         planned_cost=uncached)
    if rules.style == "implicit" and group.prefix_tokens >= rules.minimum_tokens:
        return _gemini_batch_plan(group, prices=prices, uncached=uncached)
    if rules.style != "breakpoints" or group.prefix_tokens < rules.minimum_tokens:
        why = ("automatic caching on the Batch API: lines sent as written" if rules.style != "breakpoints"
               else f"prefix below {group.model}'s minimum of {rules.minimum_tokens:,}")
        return GroupPlan(group, "none", why, uncached_cost=uncached, planned_cost=uncached)
    # The batch's first requests run together, before any is answered: each writes the prefix.
    writes = min(group.prompts, ANTHROPIC_BATCH_WRITERS)
    cost = _cost(prices, group, reads=group.prompts - writes, writes=writes, cached=group.prefix_tokens,
                 extended=True, route="batch")
    if cost is not None and uncached is not None and cost >= uncached:
        return GroupPlan(group, "none", f"the write premium of the batch's first {writes:,} requests costs more "
                         "than the reads save", uncached_cost=uncached, planned_cost=uncached)
    return GroupPlan(group, "breakpoint", f"breakpoint after message {group.prefix_messages}, ttl 1h (Batch API)",
                     ttl="1h", planned_cost=cost, uncached_cost=uncached)


def _plan_group(group: PrefixGroup, *, total_prompts: int, concurrency: int, prices: PriceTable | None,
                latency_s: float) -> GroupPlan:
    n, tokens = group.prompts, group.prefix_tokens
    uncached = _cost(prices, group, reads=0, writes=0, cached=0)
    if group.provider not in PROVIDERS:
        # A declared OpenAI-compatible host (vLLM caches prefixes too): its requests go as written, the first
        # answered first, and no saving is claimed.
        return GroupPlan(group, "implicit", f"{_UNDESCRIBED}; warmed first", warm_up=True, uncached_cost=uncached,
                         planned_cost=uncached)
    rules = cache_rules(group.provider, group.model)
    if group.own_breakpoints:
        # Its requests go as written; a warm-up still lets the file's own breakpoints be read. Their durations are
        # the file's, so the plan claims no saving.
        return GroupPlan(group, "as-given", "the file sets its own cache_control breakpoints; warmed first",
                         warm_up=True, uncached_cost=uncached, planned_cost=uncached)
    if tokens < rules.minimum_tokens:
        return GroupPlan(group, "none", f"prefix of ~{tokens:,} tokens, below {group.model}'s minimum of "
                         f"{rules.minimum_tokens:,}", uncached_cost=uncached, planned_cost=uncached)
    # Requests a minute the group is sent at: its share of the run's requests in flight, each taking latency_s.
    share = max(1.0, concurrency * n / total_prompts)
    rate = min(share, n) * 60.0 / max(latency_s, 1e-3)
    if rules.style == "automatic":
        keys = keys_for(n, rate=rate)
        # A key's first request writes the prefix (billed as a write where the model prices writes): one key
        # where the provider keeps up, ``keys`` where it overflows.
        cached = rules.cached_part(tokens)
        cost = _cost(prices, group, reads=n - 1, writes=1, cached=cached)
        worst = _cost(prices, group, reads=n - keys, writes=keys, cached=cached)
        spread = (f", spread to ~{keys:,} at ~{rate / keys:,.0f} requests/min each if the answers show overflow"
                  if keys > 1 else "")
        return GroupPlan(group, "keys", f"1 prompt_cache_key at ~{rate:,.0f} requests/min{spread}", keys=keys,
                         warm_up=True, planned_cost=cost, uncached_cost=uncached, worst_cost=worst,
                         in_flight=min(share, n))
    if rules.style == "breakpoints":
        gap_s = 60.0 / rate
        ttl = "5m" if gap_s < ANTHROPIC_TTLS["5m"] else "1h" if gap_s < ANTHROPIC_TTLS["1h"] else None
        if ttl is None:
            return GroupPlan(group, "none", "requests further apart than the longest TTL (1 hour)",
                             uncached_cost=uncached, planned_cost=uncached)
        cost = _cost(prices, group, reads=n - 1, writes=1, cached=tokens, extended=ttl == "1h")
        if cost is not None and uncached is not None and cost >= uncached:
            return GroupPlan(group, "none", "the write premium costs more than the reads save",
                             uncached_cost=uncached, planned_cost=uncached)
        return GroupPlan(group, "breakpoint", f"breakpoint after message {group.prefix_messages}, ttl {ttl}",
                         ttl=ttl, warm_up=True, planned_cost=cost, uncached_cost=uncached)
    return _gemini_plan(group, rules=rules, rate=rate, prices=prices, uncached=uncached)


def _cost(prices: PriceTable | None, group: PrefixGroup, *, reads: int, writes: int, cached: int,
          extended: bool = False, route: Route = "realtime") -> int | None:
    """The group's prefix at ``prices``: ``reads`` requests read ``cached`` of its tokens, ``writes`` write them (at
    the longer duration when ``extended``), the rest pay plain input; each priced as one request, so a long-prompt
    tier applies as it would to each."""
    if prices is None:
        return None
    tokens = group.prefix_tokens

    def one(*, read: int = 0, written: int = 0, longer: int = 0) -> int | None:
        charge = prices.price(model=group.model, route=route, prompt_tokens=tokens, completion_tokens=0,
                              cached_tokens=read, cache_creation_tokens=written,
                              cache_creation_extended_tokens=longer)
        return None if charge is None else charge.cost

    plain, read = one(), one(read=cached)
    written = one(written=cached, longer=cached if extended else 0)
    if plain is None or read is None or written is None:
        return None
    return plain * (group.prompts - reads - writes) + read * reads + written * writes


# An explicit cache outlives its group's expected duration by this share of it and this many seconds, for the
# requests a retry or a slow answer keeps out longer.
_EXPLICIT_MARGIN = 0.25
_EXPLICIT_MARGIN_S = 300.0
# The Batch API lane: Gemini's Batch Mode targets 24 hours and expires a batch after 48
# (https://ai.google.dev/gemini-api/docs/batch-mode), so a cache its lines name must live that long.
_BATCH_LIFE_S = 48 * 3600.0


def _gemini_plan(group: PrefixGroup, *, rules: CacheRules, rate: float, prices: PriceTable | None,
                 uncached: int | None) -> GroupPlan:
    """Implicit caching (a warm-up, the group kept together), or an explicit cache where it is expected to cost
    less: its create (the prefix once at the input price), every request's prefix at the cached price, and storage
    for the group's expected duration and a margin, against implicit caching's first request at the input price
    and the rest at the cached price as often as ``GEMINI_IMPLICIT_HIT_ASSUMED`` expects."""
    n = group.prompts
    ttl_s = n / max(rate, 1e-9) * 60.0 * (1 + _EXPLICIT_MARGIN) + _EXPLICIT_MARGIN_S
    implicit, explicit = _gemini_costs(group, prices=prices, hits=GEMINI_IMPLICIT_HIT_ASSUMED * (n - 1),
                                       ttl_s=ttl_s)
    assumed = f"{GEMINI_IMPLICIT_HIT_ASSUMED:.0%} of implicit hits assumed"
    why = "implicit caching: first request answered, the rest kept together"
    if implicit is not None and explicit is not None:
        compared = (f"${from_pico(explicit):.4f} with an explicit cache (create, reads, storage for {ttl_s:,.0f}s) "
                    f"vs ${from_pico(implicit):.4f} implicit ({assumed})")
        if explicit < implicit:
            return GroupPlan(group, "explicit", f"explicit cache made first, ttl {ttl_s:,.0f}s: {compared}",
                             ttl_s=ttl_s, warm_up=True, planned_cost=explicit, uncached_cost=uncached)
        why += f"; {compared}"
    elif implicit is not None:
        why += f" ({assumed}); no explicit cache: no storage price for {group.model}"
    return GroupPlan(group, "implicit", why, warm_up=True, planned_cost=implicit, uncached_cost=uncached)


def _gemini_batch_plan(group: PrefixGroup, *, prices: PriceTable | None, uncached: int | None) -> GroupPlan:
    """On the Batch API lane no implicit hit is claimed; an explicit cache kept for a batch's whole life
    (``_BATCH_LIFE_S``), made before the lines are written and named by each, where the group's reads at the cached
    price save more than its create and storage."""
    ttl_s = _BATCH_LIFE_S + _EXPLICIT_MARGIN_S
    _, explicit = _gemini_costs(group, prices=prices, hits=0, ttl_s=ttl_s, route="batch")
    if explicit is None or uncached is None:
        return GroupPlan(group, "none", "automatic caching on the Batch API: lines sent as written",
                         uncached_cost=uncached, planned_cost=uncached)
    compared = (f"${from_pico(explicit):.4f} with an explicit cache kept {ttl_s / 3600:.0f}h (a batch's life) vs "
                f"${from_pico(uncached):.4f} as written")
    if explicit < uncached:
        return GroupPlan(group, "explicit", f"explicit cache made before the lines: {compared}", ttl_s=ttl_s,
                         planned_cost=explicit, uncached_cost=uncached)
    return GroupPlan(group, "none", f"lines sent as written: {compared}", uncached_cost=uncached,
                     planned_cost=uncached)


def _gemini_costs(group: PrefixGroup, *, prices: PriceTable | None, hits: float, ttl_s: float,
                  route: Route = "realtime") -> tuple[int | None, int | None]:
    """(the group's prefix with implicit caching hitting ``hits`` times, with an explicit cache kept ``ttl_s``
    seconds), in picodollars; None where a price is missing."""
    n = group.prompts
    plain = _cost(prices, group, reads=0, writes=0, cached=0, route=route)
    read = _cost(prices, group, reads=n, writes=0, cached=group.prefix_tokens, route=route)
    if prices is None or plain is None or read is None:
        return None, None
    implicit = round(plain + hits * (read - plain) / n)
    kept = storage_cost(prices, model=group.model, tokens=group.prefix_tokens, seconds=ttl_s)
    return implicit, None if kept is None else read + plain // n + kept
