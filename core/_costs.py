"""Exact cost arithmetic over the model table: what a request is expected to cost, what a stored row
cost (in whole picodollars, so SQL sums it exactly on every database), and running totals per route."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Final, NamedTuple, Required, TypedDict, Unpack

from ._pricing import PER_TOKENS, ROUTES, ModelPrice, PriceTable
from ._providers import provider_lookup
from ._routing import Route
from ._tokens import estimate_input_tokens, reply_cap
from ._types import ChatRequest

__all__ = [
    "PICO_PER_USD",
    "CostEstimate",
    "CostTotals",
    "RouteTotals",
    "RowCost",
    "RowPricer",
    "Usage",
    "estimate_request_cost",
    "expected_reply_tokens",
    "from_pico",
]

# Stored costs are integers in this unit: a price per 1M tokens with up to six decimals, after the batch
# discount, is a whole number of picodollars per token (the bundled gpt-5-nano's cached input on the
# Batch API is 2.5 nanodollars a token, so nanodollars would not do).
PICO_PER_USD: Final = 10**12
_PICO_PER_TOKEN: Final = Decimal(PICO_PER_USD) / PER_TOKENS


class RowCost(NamedTuple):
    """What one answered request cost, in picodollars, as the writers store it."""

    cost: int
    # The same usage at the real-time price: on the Batch API, what the discount saved is the difference.
    list_cost: int
    # The fraction taken off the list price as decimal text (stored as such): the model's batch
    # discount on the Batch API ("0.5"), else "0".
    discount: str


class _Rates(NamedTuple):
    """Picodollars per token (an int when whole, the usual case; else a Decimal rounded per row)."""

    input: int | Decimal
    cached: int | Decimal
    output: int | Decimal
    write: int | Decimal  # a token written to the prompt cache (Anthropic's cache_creation_input_tokens)


class RowPricer:
    """A ``PriceTable`` priced per stored row: each model's per-token rates are worked out once, so a row
    costs three integer products (the writers store thousands a second).

    Exact whenever a price per 1M tokens, after the batch discount, has at most six decimals (every
    bundled one); a finer price is rounded half-even to the picodollar per row.
    """

    def __init__(self, table: PriceTable) -> None:
        self.table = table
        self._rates: dict[tuple[str, str], _ModelRates | None] = {}

    def price(self, *, model: str, route: Route, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0,
              cache_creation_tokens: int = 0) -> RowCost | None:
        """The row's cost, or None when ``model`` has no price (an unknown cost, never 0). Cache reads
        (``cached_tokens``) and cache writes (``cache_creation_tokens``) are parts of ``prompt_tokens``."""
        key = (model, route)
        try:
            found = self._rates[key]
        except KeyError:
            found = self._rates[key] = self._rates_of(model, route)
        if found is None:
            return None
        paid, listed, discount, long_above, long_rates = found
        if long_above is not None and prompt_tokens > long_above:
            paid, listed = long_rates  # type: ignore[misc]
        cached = cached_tokens if cached_tokens <= prompt_tokens else prompt_tokens  # part of the prompt
        uncached = prompt_tokens - cached
        cost = uncached * paid.input + cached * paid.cached + completion_tokens * paid.output
        written = cache_creation_tokens if cache_creation_tokens <= uncached else uncached
        if written:
            cost += written * (paid.write - paid.input)
        if type(cost) is not int:
            cost = _whole(cost)
        if listed is paid:
            return RowCost(cost, cost, discount)
        listed_cost = uncached * listed.input + cached * listed.cached + completion_tokens * listed.output
        if written:
            listed_cost += written * (listed.write - listed.input)
        return RowCost(cost, listed_cost if type(listed_cost) is int else _whole(listed_cost), discount)

    def _rates_of(self, model: str, route: str) -> _ModelRates | None:
        if route not in ROUTES:
            raise ValueError(f"route {route!r} is unknown; use 'realtime' or 'batch'")
        price = self.table.price_for(model)
        if price is None:
            return None
        discount = "0" if route == "realtime" else str(price.batch_discount)
        long = price.long_prompt
        return _ModelRates(*_paid_and_listed(price, route=route), discount, None if long is None else long.above,
                           None if long is None else _paid_and_listed(long.price, route=route))


class _ModelRates(NamedTuple):
    paid: _Rates
    listed: _Rates  # the same object as ``paid`` when nothing is taken off
    discount: str
    # Above this many prompt tokens a request pays ``long_rates`` (paid, listed) instead; None: no such price.
    long_above: int | None
    long_rates: tuple[_Rates, _Rates] | None


def _paid_and_listed(price: ModelPrice, *, route: str) -> tuple[_Rates, _Rates]:
    fields = (price.input, price.cached_input, price.output, price.cache_write)
    listed = _Rates(*(_per_token(value) for value in fields))  # type: ignore[arg-type]
    if route == "realtime" or price.batch_discount == 0:
        return listed, listed
    keep = 1 - price.batch_discount
    return _Rates(*(_per_token(value * keep) for value in fields)), listed  # type: ignore[operator]


def _per_token(price_per_million: Decimal) -> int | Decimal:
    rate = price_per_million * _PICO_PER_TOKEN
    return int(rate) if rate == rate.to_integral_value() else rate


def _whole(picodollars: Decimal) -> int:
    return int(picodollars.to_integral_value())  # half-even, the context's rounding


def from_pico(picodollars: int) -> Decimal:
    """Dollars, exactly, from a stored cost in picodollars."""
    return Decimal(picodollars).scaleb(-12)


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
    """Estimate a request's cost: heuristic prompt tokens, and the expected reply under the request's cap
    (see ``expected_reply_tokens``); ``max_cost`` prices the longest reply allowed (see ``CostEstimate``)."""
    params = request.params
    # Tools and response_format included (they are billed as input), counted as the rate limiter counts them.
    prompt_tokens = estimate_input_tokens(request)
    choices = max(int(params.get("n") or 1), 1)
    cap = reply_cap(params)
    limits = table.limits_for(request.model)
    most = limits.max_output_tokens if limits is not None else None
    longest = min(cap, most) if cap is not None and most is not None else cap if cap is not None else most
    expected = round(expected_reply_tokens(typical=typical_completion_tokens, cap=cap) * choices)
    cost = table.cost(model=request.model, route=route, prompt_tokens=prompt_tokens, completion_tokens=expected)
    if longest is None:
        return CostEstimate(prompt_tokens=prompt_tokens, completion_tokens=expected, cost=cost)
    ceiling = longest * choices
    max_cost = table.cost(model=request.model, route=route, prompt_tokens=prompt_tokens, completion_tokens=ceiling)
    return CostEstimate(prompt_tokens=prompt_tokens, completion_tokens=expected, cost=cost,
                        max_completion_tokens=ceiling, max_cost=max_cost)


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

    prompts: int = 0
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
    prompt_tokens: Required[int]
    completion_tokens: Required[int]
    cached_tokens: int
    cache_creation_tokens: int
    requests: int
    # Summed usage of several requests: whether they paid their model's long-prompt price (see ``PriceTable.cost``).
    long_prompt: bool


@dataclass(kw_only=True)
class CostTotals:
    """Running totals over many requests, per route, with what the Batch API saved.

    ``add`` prices requests with ``table``; ``add_priced`` counts requests already priced (stored costs,
    where ``table`` may be None). Costs of models without a price are counted, not guessed.
    """

    table: PriceTable | None
    # Which provider a model's requests went to: the totals are also kept per provider and route.
    provider_of: Callable[[str], str] = field(default_factory=provider_lookup)
    realtime: RouteTotals = field(default_factory=RouteTotals)
    batch: RouteTotals = field(default_factory=RouteTotals)
    # Provider -> route -> its share of the totals above.
    providers: dict[str, dict[str, RouteTotals]] = field(default_factory=dict)
    # Model name -> prompts sent to it without a known price.
    unpriced_models: dict[str, int] = field(default_factory=dict)
    # What the priced batch-routed requests would have cost real-time.
    batch_at_realtime: Decimal = Decimal(0)

    def add(self, **usage: Unpack[Usage]) -> Decimal | None:
        """Count ``requests`` requests with these summed tokens; returns their cost (None when the model has no price)."""
        if self.table is None:
            raise TypeError("these totals have no price table: count priced requests with add_priced()")
        tokens = {"model": usage["model"], "prompt_tokens": usage["prompt_tokens"],
                  "completion_tokens": usage["completion_tokens"], "cached_tokens": usage.get("cached_tokens", 0),
                  "cache_creation_tokens": usage.get("cache_creation_tokens", 0)}
        route = usage["route"]
        if usage.get("requests", 1) > 1 and "long_prompt" not in usage:
            raise TypeError("summed usage of several requests needs long_prompt: the price may depend on each's length")
        tokens["long_prompt"] = usage.get("long_prompt")
        cost = self.table.cost(route=route, **tokens)
        at_realtime = cost if cost is None or route == "realtime" else self.table.cost(route="realtime", **tokens)
        self.add_priced(**usage, cost=cost or Decimal(0), at_realtime=at_realtime or Decimal(0),
                        unpriced=usage.get("requests", 1) if cost is None else 0)
        return cost

    def add_priced(self, *, cost: Decimal, at_realtime: Decimal, unpriced: int = 0, **usage: Unpack[Usage]) -> None:
        """Count ``requests`` requests whose known cost is ``cost`` (``at_realtime`` at the real-time price);
        ``unpriced`` of them have no price and are in neither figure."""
        route, model = usage["route"], usage["model"]
        by_route = self.providers.setdefault(self.provider_of(model), {})
        for totals in (self.realtime if route == "realtime" else self.batch,
                       by_route.get(route) or by_route.setdefault(route, RouteTotals())):
            totals.prompts += usage.get("requests", 1)
            totals.prompt_tokens += usage["prompt_tokens"]
            totals.completion_tokens += usage["completion_tokens"]
            totals.cached_tokens += usage.get("cached_tokens", 0)
            totals.cost += cost
            totals.unpriced += unpriced
        if unpriced:
            self.unpriced_models[model] = self.unpriced_models.get(model, 0) + unpriced
        if route == "batch":
            self.batch_at_realtime += at_realtime

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
        """What the batch-routed requests would have cost real-time, minus what they cost."""
        return self.batch_at_realtime - self.batch.cost
