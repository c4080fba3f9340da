"""Cost arithmetic over the model table, every figure through its one formula (``PriceTable.price``): what a
request is expected to cost, the most it can cost, and running totals per route."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Final, Required, TypedDict, Unpack

from .._json import json_field
from ._pricing import Charge, PriceTable, billing_tier
from ._units import _PICO_PER_TOKEN
from .._providers import provider_lookup
from .._status import Route
from ._tokens import estimate_input_tokens, reply_cap
from .._types import ChatRequest

__all__ = [
    "storage_cost",
    "CostEstimate",
    "CostTotals",
    "EstimateSums",
    "RouteTotals",
    "Usage",
    "estimate_request_cost",
    "expected_reply_tokens",
    "worst_case_cost",
]


@dataclass(frozen=True, slots=True)
class CostEstimate:
    """A request's expected tokens and cost before it is sent, and the most it can cost.

    The expected reply is ``typical_completion_tokens``, or the request's cap when that is lower;
    the upper bound prices the longest reply the request allows: its cap, else its model's maximum
    output. With neither there is no bound: ``max_completion_tokens`` and ``max_cost`` are None.
    """

    prompt_tokens: int
    completion_tokens: int
    cost: Decimal | None
    max_completion_tokens: int | None = None
    # None when the reply has no known bound, or the model no price.
    max_cost: Decimal | None = None


def estimate_request_cost(
    *, request: ChatRequest, route: Route, table: PriceTable, typical_completion_tokens: int
) -> CostEstimate:
    """Estimate a request's cost at the tier it will be billed at: heuristic prompt tokens, and the expected reply
    under the request's cap (see ``expected_reply_tokens``); ``max_cost`` is its ``worst_case_cost``."""
    params = request.params
    # Tools and response_format included (they are billed as input), counted as the rate limiter counts them.
    prompt_tokens = estimate_input_tokens(request)
    # An embedding has no reply: its input is all it is billed for.
    expected = 0 if request.endpoint == "embeddings" else round(
        expected_reply_tokens(typical=typical_completion_tokens, cap=reply_cap(params)) * _choices(params))
    charge = table.price(model=request.model, route=route, prompt_tokens=prompt_tokens, completion_tokens=expected,
                         service_tier=_requested_tier(params))
    cost = None if charge is None else charge.dollars
    worst = worst_case_cost(request=request, route=route, table=table, prompt_tokens=prompt_tokens)
    if worst is None:
        return CostEstimate(prompt_tokens=prompt_tokens, completion_tokens=expected, cost=cost)
    ceiling, most = worst
    return CostEstimate(prompt_tokens=prompt_tokens, completion_tokens=expected, cost=cost,
                        max_completion_tokens=ceiling, max_cost=None if most is None else most.dollars)


def worst_case_cost(
    *, request: ChatRequest, route: Route, table: PriceTable, prompt_tokens: int | None = None
) -> tuple[int, Charge | None] | None:
    """The most a request can cost, at the tier it will be billed at: its estimated prompt tokens (or
    ``prompt_tokens``) and the longest reply it allows (its cap, else its model's maximum output, per choice).

    Returns (those reply tokens, the charge; None when the model has no price), or None when the reply has no
    bound (no cap and a model of unknown maximum output). Every prompt token is counted at the dearer of input
    and a cache write where the request can write the cache: always with OpenAI's automatic caching, on
    Anthropic when the request marks a ``cache_control`` block (at the 1-hour price when one asks for it).
    """
    params = request.params
    longest = _longest_reply(table, model=request.model, endpoint=request.endpoint, cap=reply_cap(params))
    if longest is None:
        return None
    ceiling = longest * _choices(params)
    prompt = estimate_input_tokens(request) if prompt_tokens is None else prompt_tokens
    usage: dict[str, Any] = {"model": request.model, "route": route, "prompt_tokens": prompt,
                             "completion_tokens": ceiling, "service_tier": _requested_tier(params)}
    return ceiling, _dearest(table, usage=usage, marks=_cache_marks(request))


def _longest_reply(table: PriceTable, *, model: str, endpoint: str, cap: int | None) -> int | None:
    """The longest reply per choice a request allows: its cap, else its model's maximum output (0 for an
    embedding); None when neither is known."""
    if endpoint == "embeddings":
        return 0
    limits = table.limits_for(model)
    most = limits.max_output_tokens if limits is not None else None
    return min(cap, most) if cap is not None and most is not None else cap if cap is not None else most


def _dearest(table: PriceTable, *, usage: dict[str, Any], marks: tuple[bool, bool]) -> Charge | None:
    """The charge of ``usage`` with every prompt token at the dearer of input and a cache write where the requests
    can write the cache (``worst_case_cost``); None when the model has no price."""
    plain = table.price(**usage)
    info = table.info_for(usage["model"])
    marked, extended = marks
    if plain is None or not (marked or info is None or info.provider != "anthropic"):
        return plain
    prompt = usage["prompt_tokens"]
    written = table.price(**usage, cache_creation_tokens=prompt, cache_creation_extended_tokens=prompt * extended)
    assert written is not None
    return max(plain, written, key=lambda charge: charge.cost)


def _choices(params: dict[str, Any]) -> int:
    return max(int(params.get("n") or 1), 1)


def _requested_tier(params: dict[str, Any]) -> str | None:
    """The service tier a request asks for (OpenAI's ``service_tier``; Anthropic's ``speed: "fast"``), as
    ``PriceTable.price`` names it (None: standard)."""
    return billing_tier("fast" if params.get("speed") == "fast" else params.get("service_tier"))


def _cache_marks(request: ChatRequest) -> tuple[bool, bool]:
    """(whether the request marks anything for Anthropic's prompt cache, whether a mark asks for 1 hour)."""
    marked = extended = False
    stack: list[Any] = [request.messages, request.params]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            mark = item.get("cache_control")
            if isinstance(mark, dict):
                marked = True
                extended = extended or mark.get("ttl") == "1h"
            stack.extend(value for value in item.values() if isinstance(value, (dict, list)))
        elif isinstance(item, list):
            stack.extend(value for value in item if isinstance(value, (dict, list)))
    return marked, extended


def expected_reply_tokens(*, typical: float, cap: int | None) -> float:
    """The mean reply length to expect when replies run ``typical`` tokens on average, cut at ``cap``.

    Reply lengths are taken as exponentially distributed (the least-assuming shape for a positive
    length with a known mean): a cap cuts off the long tail, so the expected reply under a cap is
    ``typical * (1 - exp(-cap / typical))``, less than ``min(typical, cap)``. With a cap equal to the
    typical length, 63% of it; with a cap 3x the typical length, 95%.
    """
    if typical <= 0:
        return 0.0
    if cap is None:
        return float(typical)
    return typical * -math.expm1(-cap / typical)


@dataclass(slots=True)
class RouteTotals:
    """Usage and known cost of the prompts sent one way."""

    prompts: int = json_field(name="requests", default=0)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    cost: Decimal = Decimal(0)
    # Prompts whose model has no price; their cost is in neither ``cost`` nor any saving.
    unpriced: int = 0


class Usage(TypedDict, total=False):
    """What ``CostTotals`` counts of some requests: summed tokens of ``requests`` requests to ``model`` by ``route``."""

    model: Required[str]
    route: Required[Route]
    # The endpoint the requests went to (chat when not given).
    endpoint: str
    prompt_tokens: Required[int]
    completion_tokens: Required[int]
    cached_tokens: int
    cache_creation_tokens: int
    cache_creation_extended_tokens: int
    # The tier the requests were served at (see ``PriceTable.price``).
    service_tier: str | None
    requests: int
    # Summed usage of several requests: whether they paid their model's long-prompt price (see ``PriceTable.price``).
    long_prompt: bool


# Usage fields that are not token counts, or counted per request.
_NOT_PRICED: Final = frozenset({"requests", "endpoint"})


@dataclass(kw_only=True)
class CostTotals:
    """Running totals over many requests, per route, with what the Batch API saved.

    ``add`` prices requests with ``table``; ``add_priced`` counts requests already priced (stored costs,
    where ``table`` may be None). Costs of models without a price are counted, not guessed.
    """

    # Never in a repr: the whole catalog (tens of KB) would drown what the totals say.
    table: PriceTable | None = field(repr=False)
    # Which provider a model's requests went to: the totals are also kept per provider and route.
    provider_of: Callable[[str], str] = field(default_factory=provider_lookup)
    # The real-time half (every lane sent as a request) and the Batch API.
    realtime: RouteTotals = field(default_factory=RouteTotals)
    batch: RouteTotals = field(default_factory=RouteTotals)
    # Route (lane) -> its share of the totals above.
    lanes: dict[str, RouteTotals] = field(default_factory=dict)
    # Provider -> route -> its share of the totals above.
    providers: dict[str, dict[str, RouteTotals]] = field(default_factory=dict)
    # Endpoint -> route -> its share of the totals above.
    endpoints: dict[str, dict[str, RouteTotals]] = field(default_factory=dict)
    # Model name -> prompts sent to it without a known price.
    unpriced_models: dict[str, int] = field(default_factory=dict)
    # What the priced requests of discounted lanes (every route but ``realtime``) would have cost at the standard
    # real-time price, and what they cost.
    discounted_at_realtime: Decimal = Decimal(0)
    discounted_cost: Decimal = Decimal(0)

    def add(self, **usage: Unpack[Usage]) -> Decimal | None:
        """Count ``requests`` requests with these summed tokens; returns their cost (None when the model has no price)."""
        if self.table is None:
            raise TypeError("these totals have no price table: count priced requests with add_priced()")
        if usage.get("requests", 1) > 1 and "long_prompt" not in usage:
            raise TypeError("summed usage of several requests needs long_prompt: the price may depend on each's length")
        priced: dict[str, Any] = {key: value for key, value in usage.items() if key not in _NOT_PRICED}
        charge = self.table.price(**priced)
        cost = None if charge is None else charge.dollars
        self.add_priced(**usage, cost=cost or Decimal(0), at_realtime=Decimal(0) if charge is None else charge.list_dollars,
                        unpriced=usage.get("requests", 1) if charge is None else 0)
        return cost

    def add_priced(self, *, cost: Decimal, at_realtime: Decimal, unpriced: int = 0, provider: str | None = None,
                   **usage: Unpack[Usage]) -> None:
        """Count ``requests`` requests whose known cost is ``cost`` (``at_realtime`` at the real-time price);
        ``unpriced`` of them have no price and are in neither figure. ``provider``: who served them, as stored (None:
        ``provider_of`` their model)."""
        route, model = usage["route"], usage["model"]
        by_route = self.providers.setdefault(provider or self.provider_of(model), {})
        by_endpoint = self.endpoints.setdefault(usage.get("endpoint", "chat"), {})
        for totals in (self.batch if route == "batch" else self.realtime,
                       self.lanes.get(route) or self.lanes.setdefault(route, RouteTotals()),
                       by_route.get(route) or by_route.setdefault(route, RouteTotals()),
                       by_endpoint.get(route) or by_endpoint.setdefault(route, RouteTotals())):
            totals.prompts += usage.get("requests", 1)
            totals.prompt_tokens += usage["prompt_tokens"]
            totals.completion_tokens += usage["completion_tokens"]
            totals.cached_tokens += usage.get("cached_tokens", 0)
            totals.cost += cost
            totals.unpriced += unpriced
        if unpriced:
            self.unpriced_models[model] = self.unpriced_models.get(model, 0) + unpriced
        if route != "realtime":
            self.discounted_at_realtime += at_realtime
            self.discounted_cost += cost

    @property
    def cost(self) -> Decimal:
        """Known cost over both routes."""
        return self.realtime.cost + self.batch.cost

    @property
    def unpriced(self) -> int:
        """Prompts whose model has no price, over both routes."""
        return self.realtime.unpriced + self.batch.unpriced

    @property
    def savings(self) -> Decimal:
        """What the requests of discounted lanes (the Batch API, flex, background windows) would have cost at the
        standard real-time price, minus what they cost."""
        return self.discounted_at_realtime - self.discounted_cost


@dataclass(slots=True)
class _Group:
    """Requests of one price group (see ``EstimateSums``): how many, and their estimated prompt tokens summed."""

    requests: int = 0
    prompt_tokens: int = 0


class EstimateSums:
    """The estimate of many requests (``estimate_request_cost`` of each, summed), kept as sums per price group.

    ``add`` estimates a request's input tokens, the one per-request cost; every other input of the price is
    shared by a group: model, route, endpoint, requested tier, reply cap, choices, Anthropic cache marks and
    whether the prompt is above its model's long-prompt threshold. The price formula is linear in tokens within a
    group, so ``totals`` prices each group once, with the typical reply length of each model known by then
    (the only input that needs the database). Identical requests are added once by the caller.
    """

    def __init__(self, *, table: PriceTable) -> None:
        self.table = table
        self._groups: dict[tuple[Any, ...], _Group] = {}
        # Model -> the prompt tokens above which its long-prompt price applies (None: one price).
        self._long_above: dict[str, int | None] = {}

    @property
    def models(self) -> set[str]:
        return {key[0] for key in self._groups}

    def add(self, request: ChatRequest, *, route: Route) -> None:
        params = request.params
        prompt_tokens = estimate_input_tokens(request)
        model = request.model
        try:
            above = self._long_above[model]
        except KeyError:
            above = self._long_above[model] = self.table.long_above(model)
        key = (model, route, request.endpoint, _requested_tier(params), reply_cap(params), _choices(params),
               _cache_marks(request),
               above is not None and prompt_tokens > above)
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = _Group()
        group.requests += 1
        group.prompt_tokens += prompt_tokens

    def totals(
        self, *, reply_tokens: Mapping[str, int], provider_of: Callable[[str], str] | None = None
    ) -> tuple[CostTotals, Decimal, dict[str, int]]:
        """(the expected totals, the worst case of the priced requests, model -> priced requests with no bound on
        their reply). ``reply_tokens``: each model's typical reply length."""
        totals = CostTotals(table=self.table, provider_of=provider_of or provider_lookup())
        bound = Decimal(0)
        unbounded: dict[str, int] = {}
        for (model, route, endpoint, tier, cap, choices, (marked, extended), long), group in self._groups.items():
            count, prompt_tokens = group.requests, group.prompt_tokens
            # An embedding has no reply: its input is all it is billed for.
            expected = 0 if endpoint == "embeddings" else round(
                expected_reply_tokens(typical=reply_tokens[model], cap=cap) * choices)
            cost = totals.add(model=model, route=route, endpoint=endpoint, prompt_tokens=prompt_tokens,
                              completion_tokens=expected * count, service_tier=tier, requests=count, long_prompt=long)
            if cost is None:
                continue  # unpriced: counted in totals.unpriced_models, out of both figures
            longest = _longest_reply(self.table, model=model, endpoint=endpoint, cap=cap)
            if longest is None:
                unbounded[model] = unbounded.get(model, 0) + count
                continue
            worst = _dearest(self.table, marks=(marked, extended), usage={
                "model": model, "route": route, "prompt_tokens": prompt_tokens,
                "completion_tokens": longest * choices * count, "service_tier": tier, "long_prompt": long})
            assert worst is not None
            bound += worst.dollars
        return totals, bound, unbounded



def storage_cost(prices: PriceTable, *, model: str, tokens: int, seconds: float) -> int | None:
    """What an explicit cache (Gemini's cached content) of ``tokens`` tokens of ``model`` costs to keep for
    ``seconds``, in picodollars, rounded up; None where the model has no storage price (``cache_storage``). A prompt
    longer than the model's long-prompt threshold pays that tier's storage price where it lists one."""
    price = prices.price_for(model)
    if price is None or price.cache_storage is None:
        return None
    rate = price.for_prompt(tokens).cache_storage or price.cache_storage
    return math.ceil(rate * _PICO_PER_TOKEN * tokens * Decimal(repr(max(seconds, 0.0))) / 3600)
