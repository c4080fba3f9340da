"""Model prices, context windows and exact cost arithmetic: a bundled model table, the user's overrides, totals,
and the per-row pricing the result writers store.

Prices are Decimals per 1M tokens, so sums over millions of prompts stay exact. A model missing
from the table has no price (``None``), never a price of zero, and no known limits. A stored cost is
a whole number of picodollars (``PICO_PER_USD``), so SQL sums it exactly on every database.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import date
from decimal import Decimal
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final, NamedTuple, Required, TypedDict, Unpack

from ._exceptions import ConfigError
from ._routing import Route
from ._tokens import estimate_input_tokens, reply_cap
from ._types import ChatRequest

__all__ = [
    "CostEstimate",
    "CostTotals",
    "ModelLimits",
    "PICO_PER_USD",
    "ModelPrice",
    "PriceTable",
    "RouteTotals",
    "RowCost",
    "RowPricer",
    "estimate_request_cost",
    "expected_reply_tokens",
    "from_pico",
]

PER_TOKENS = Decimal(1_000_000)
# Stored costs are integers in this unit: a price per 1M tokens with up to six decimals, after the batch
# discount, is a whole number of picodollars per token (the bundled gpt-5-nano's cached input on the
# Batch API is 2.5 nanodollars a token, so nanodollars would not do).
PICO_PER_USD: Final = 10**12
_PICO_PER_TOKEN: Final = Decimal(PICO_PER_USD) / PER_TOKENS
_ROUTES = ("realtime", "batch")
_TOP_FIELDS = frozenset({"prices_as_of", "source", "currency", "unit", "batch_discount", "models",
                         "limits_as_of", "limits_source"})
_LIMIT_FIELDS = ("context_window", "max_output_tokens")
_MODEL_FIELDS = frozenset({"input", "cached_input", "output", "batch_discount", *_LIMIT_FIELDS})
# Snapshot names: "gpt-4o-mini-2024-07-18" and the older "gpt-3.5-turbo-0125".
_SNAPSHOT = re.compile(r"-(?:\d{4}-\d{2}-\d{2}|\d{4})$")


@dataclass(frozen=True, slots=True)
class ModelPrice:
    """One model's standard-tier prices in the table's currency per 1M tokens."""

    input: Decimal
    cached_input: Decimal
    output: Decimal
    # Fraction taken off on the Batch API: 0.5 means half price.
    batch_discount: Decimal


@dataclass(frozen=True, slots=True)
class ModelLimits:
    """How many tokens a model takes and gives per request; None where the table does not say."""

    # Prompt and reply together.
    context_window: int | None = None
    # The largest reply (``max_completion_tokens``), reasoning tokens included.
    max_output_tokens: int | None = None


@dataclass(frozen=True, kw_only=True)
class PriceTable:
    """Prices and limits by model name; build it with ``PriceTable.load()``."""

    prices_as_of: str
    source: str
    currency: str
    models: Mapping[str, ModelPrice]
    limits: Mapping[str, ModelLimits] = field(default_factory=lambda: MappingProxyType({}))
    limits_as_of: str | None = None
    limits_source: str | None = None
    # The user's file merged over the bundled table (``load(path=...)``), as given; None for the bundled one.
    prices_file: str | None = None

    @classmethod
    def load(cls, *, path: Path | None = None) -> PriceTable:
        """The bundled table, with the user's file at ``path`` (same format, any subset) on top.

        The user's models replace bundled models of the same name, keeping the bundled
        ``context_window`` and ``max_output_tokens`` unless they give their own; its ``batch_discount``,
        ``prices_as_of``, ``source`` and ``limits_*`` replace the bundled ones. Raises ``ConfigError``.
        """
        bundled_text = resources.files("llm_dispatch").joinpath("prices.json").read_text(encoding="utf-8")
        merged = _parse(bundled_text, where="bundled prices.json", complete=True)
        if path is not None:
            where = str(path)
            try:
                text = Path(path).read_text(encoding="utf-8")
            except FileNotFoundError as exc:
                raise ConfigError(f"price file {where}: no such file; give the path of a JSON price table") from exc
            except (OSError, UnicodeDecodeError) as exc:
                raise ConfigError(f"price file {where}: cannot be read ({exc})") from exc
            user = _parse(text, where=where, complete=False)
            for name in ("currency", "unit"):
                if name in user and user[name] != merged[name]:
                    raise ConfigError(
                        f"price file {where}: field '{name}' is {user[name]!r} but prices must be "
                        f"{merged[name]!r}; convert them or remove the field"
                    )
            user_models = user.pop("models", {})
            for name, entry in user_models.items():
                # A repriced model still has its window.
                for key in _LIMIT_FIELDS:
                    if key not in entry and key in merged["models"].get(name, {}):
                        entry[key] = merged["models"][name][key]
            models = {**merged["models"], **user_models}
            merged.update(user)
            merged["models"] = models
        default_discount = merged["batch_discount"]
        prices = {
            name: ModelPrice(
                input=entry["input"],
                cached_input=entry.get("cached_input", entry["input"]),
                output=entry["output"],
                batch_discount=entry.get("batch_discount", default_discount),
            )
            for name, entry in merged["models"].items()
        }
        limits = {
            name: ModelLimits(**{key: entry[key] for key in _LIMIT_FIELDS if key in entry})
            for name, entry in merged["models"].items()
            if any(key in entry for key in _LIMIT_FIELDS)
        }
        return cls(
            prices_as_of=merged["prices_as_of"],
            source=merged["source"],
            currency=merged["currency"],
            models=MappingProxyType(prices),
            limits=MappingProxyType(limits),
            limits_as_of=merged.get("limits_as_of"),
            limits_source=merged.get("limits_source"),
            prices_file=None if path is None else str(path),
        )

    def price_for(self, model: str) -> ModelPrice | None:
        """The price of ``model``, or of the model a dated snapshot name belongs to; else None."""
        return _by_model(self.models, model)

    def limits_for(self, model: str) -> ModelLimits | None:
        """The context window and maximum reply of ``model`` (or of its dated snapshot's model); else None."""
        return _by_model(self.limits, model)

    def cost(
        self,
        *,
        model: str,
        route: Route,
        prompt_tokens: int,
        completion_tokens: int,
        cached_tokens: int = 0,
    ) -> Decimal | None:
        """What a request cost, in ``currency``; None when the model has no price."""
        if route not in _ROUTES:
            raise ValueError(f"route {route!r} is unknown; use 'realtime' or 'batch'")
        for name, count in (("prompt_tokens", prompt_tokens), ("completion_tokens", completion_tokens),
                            ("cached_tokens", cached_tokens)):
            if count < 0:
                raise ValueError(f"{name} must be >= 0, got {count}")
        if cached_tokens > prompt_tokens:
            raise ValueError(
                f"cached_tokens ({cached_tokens}) cannot exceed prompt_tokens ({prompt_tokens}); "
                "cached tokens are part of the prompt"
            )
        price = self.price_for(model)
        if price is None:
            return None
        total = (
            (prompt_tokens - cached_tokens) * price.input
            + cached_tokens * price.cached_input
            + completion_tokens * price.output
        ) / PER_TOKENS
        if route == "batch":
            total *= 1 - price.batch_discount
        return total


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


class RowPricer:
    """A ``PriceTable`` priced per stored row: each model's per-token rates are worked out once, so a row
    costs three integer products (the writers store thousands a second).

    Exact whenever a price per 1M tokens, after the batch discount, has at most six decimals (every
    bundled one); a finer price is rounded half-even to the picodollar per row.
    """

    def __init__(self, table: PriceTable) -> None:
        self.table = table
        self._rates: dict[tuple[str, str], tuple[_Rates, _Rates, str] | None] = {}

    def price(
        self, *, model: str, route: Route, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0
    ) -> RowCost | None:
        """The row's cost, or None when ``model`` has no price (an unknown cost, never 0)."""
        key = (model, route)
        try:
            found = self._rates[key]
        except KeyError:
            found = self._rates[key] = self._rates_of(model, route)
        if found is None:
            return None
        paid, listed, discount = found
        cached = cached_tokens if cached_tokens <= prompt_tokens else prompt_tokens  # part of the prompt
        uncached = prompt_tokens - cached
        cost = uncached * paid.input + cached * paid.cached + completion_tokens * paid.output
        if type(cost) is not int:
            cost = _whole(cost)
        if listed is paid:
            return RowCost(cost, cost, discount)
        listed_cost = uncached * listed.input + cached * listed.cached + completion_tokens * listed.output
        return RowCost(cost, listed_cost if type(listed_cost) is int else _whole(listed_cost), discount)

    def _rates_of(self, model: str, route: str) -> tuple[_Rates, _Rates, str] | None:
        if route not in _ROUTES:
            raise ValueError(f"route {route!r} is unknown; use 'realtime' or 'batch'")
        price = self.table.price_for(model)
        if price is None:
            return None
        listed = _Rates(*(_per_token(value) for value in (price.input, price.cached_input, price.output)))
        if route == "realtime" or price.batch_discount == 0:
            return listed, listed, "0" if route == "realtime" else str(price.batch_discount)
        keep = 1 - price.batch_discount
        paid = _Rates(*(_per_token(value * keep) for value in (price.input, price.cached_input, price.output)))
        return paid, listed, str(price.batch_discount)


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
    requests: int


@dataclass(kw_only=True)
class CostTotals:
    """Running totals over many requests, per route, with what the Batch API saved.

    ``add`` prices requests with ``table``; ``add_priced`` counts requests already priced (stored costs,
    where ``table`` may be None). Costs of models without a price are counted, not guessed.
    """

    table: PriceTable | None
    realtime: RouteTotals = field(default_factory=RouteTotals)
    batch: RouteTotals = field(default_factory=RouteTotals)
    # Model name -> prompts sent to it without a known price.
    unpriced_models: dict[str, int] = field(default_factory=dict)
    # What the priced batch-routed requests would have cost real-time.
    batch_at_realtime: Decimal = Decimal(0)

    def add(self, **usage: Unpack[Usage]) -> Decimal | None:
        """Count ``requests`` requests with these summed tokens; returns their cost (None when the model has no price)."""
        if self.table is None:
            raise TypeError("these totals have no price table: count priced requests with add_priced()")
        tokens = {"model": usage["model"], "prompt_tokens": usage["prompt_tokens"],
                  "completion_tokens": usage["completion_tokens"], "cached_tokens": usage.get("cached_tokens", 0)}
        route = usage["route"]
        cost = self.table.cost(route=route, **tokens)
        at_realtime = cost if cost is None or route == "realtime" else self.table.cost(route="realtime", **tokens)
        self.add_priced(**usage, cost=cost or Decimal(0), at_realtime=at_realtime or Decimal(0),
                        unpriced=usage.get("requests", 1) if cost is None else 0)
        return cost

    def add_priced(self, *, cost: Decimal, at_realtime: Decimal, unpriced: int = 0, **usage: Unpack[Usage]) -> None:
        """Count ``requests`` requests whose known cost is ``cost`` (``at_realtime`` at the real-time price);
        ``unpriced`` of them have no price and are in neither figure."""
        route, model = usage["route"], usage["model"]
        totals = self.realtime if route == "realtime" else self.batch
        totals.prompts += usage.get("requests", 1)
        totals.prompt_tokens += usage["prompt_tokens"]
        totals.completion_tokens += usage["completion_tokens"]
        totals.cached_tokens += usage.get("cached_tokens", 0)
        totals.cost += cost
        if unpriced:
            totals.unpriced += unpriced
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


def _by_model(table: Mapping[str, Any], model: str) -> Any:
    """The entry of ``model``, or of the model a dated snapshot name belongs to; else None."""
    entry = table.get(model)
    if entry is None:
        base = _SNAPSHOT.sub("", model)
        if base != model:
            entry = table.get(base)
    return entry


def _parse(text: str, *, where: str, complete: bool) -> dict[str, Any]:
    """Validate a price file into plain values; ``complete`` requires every top-level field."""

    def bad(field_name: str, problem: str) -> ConfigError:
        return ConfigError(f"price file {where}: field '{field_name}' {problem}; fix or remove it")

    try:
        # Decimal straight from the text: 0.075 stays 0.075, not 0.07499999...
        data = json.loads(text, parse_float=Decimal)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"price file {where}: invalid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})"
        ) from exc
    if not isinstance(data, dict):
        raise ConfigError(f"price file {where}: expected a JSON object with a 'models' object, got {type(data).__name__}")
    unknown = sorted(set(data) - _TOP_FIELDS)
    if unknown:
        raise bad(unknown[0], f"is unknown (allowed: {', '.join(sorted(_TOP_FIELDS))})")
    if complete:
        missing = sorted(_TOP_FIELDS - set(data))
        if missing:
            raise bad(missing[0], "is missing")

    parsed: dict[str, Any] = {}
    for name in ("source", "currency", "unit", "limits_source"):
        if name in data:
            if not isinstance(data[name], str) or not data[name].strip():
                raise bad(name, "must be a non-empty string")
            parsed[name] = data[name]
    for name in ("prices_as_of", "limits_as_of"):
        if name in data:
            value = data[name]
            try:
                date.fromisoformat(value if isinstance(value, str) else "")
            except ValueError:
                raise bad(name, f"must be a date like 2025-08-07, got {_shown(value)}") from None
            parsed[name] = value
    if "batch_discount" in data:
        parsed["batch_discount"] = _discount(data["batch_discount"], field_name="batch_discount", bad=bad)
    if "models" in data:
        models = data["models"]
        if not isinstance(models, dict):
            raise bad("models", "must be an object of model name -> {input, cached_input, output}")
        parsed["models"] = {name: _model(name, entry, bad=bad) for name, entry in models.items()}
    return parsed


def _model(name: str, entry: Any, *, bad: Any) -> dict[str, Decimal | int]:
    prefix = f"models.{name}"
    if not name.strip():
        raise bad(prefix, "needs a non-empty model name")
    if not isinstance(entry, dict):
        raise bad(prefix, "must be an object with 'input' and 'output' prices (and optionally 'cached_input')")
    unknown = sorted(set(entry) - _MODEL_FIELDS)
    if unknown:
        raise bad(f"{prefix}.{unknown[0]}", f"is unknown (allowed: {', '.join(sorted(_MODEL_FIELDS))})")
    parsed: dict[str, Decimal | int] = {}
    for key in ("input", "cached_input", "output"):
        if key not in entry:
            if key == "cached_input":
                continue  # no cache discount: cached tokens cost what input does
            raise bad(f"{prefix}.{key}", "is missing (a price per 1M tokens)")
        value = entry[key]
        if not _is_number(value) or value < 0:
            raise bad(f"{prefix}.{key}", f"must be a number >= 0 (price per 1M tokens), got {_shown(value)}")
        parsed[key] = Decimal(value)
    if "batch_discount" in entry:
        parsed["batch_discount"] = _discount(entry["batch_discount"], field_name=f"{prefix}.batch_discount", bad=bad)
    for key in _LIMIT_FIELDS:
        if key in entry:
            value = entry[key]
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise bad(f"{prefix}.{key}", f"must be a whole number of tokens >= 1, got {_shown(value)}")
            parsed[key] = value
    return parsed


def _discount(value: Any, *, field_name: str, bad: Any) -> Decimal:
    if not _is_number(value) or not 0 <= value <= 1:
        raise bad(field_name, f"must be a fraction from 0 to 1 (0.5 = half price), got {_shown(value)}")
    return Decimal(value)


def _is_number(value: Any) -> bool:
    # JSON floats arrive as Decimal (parse_float); NaN and Infinity arrive as float and are refused.
    return isinstance(value, (int, Decimal)) and not isinstance(value, bool)


def _shown(value: Any) -> str:
    return str(value) if _is_number(value) else json.dumps(value, default=str)
