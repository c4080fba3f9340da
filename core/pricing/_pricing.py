"""The model table and the one price formula: what a request costs, for estimates, stored costs and ``reprice``.

``PriceTable.load()`` reads the bundled catalog (with the user's file over it, see ``_catalog``) as in effect
on one day. ``PriceTable.price()`` is the formula every cost goes through: it prices a request's usage at the
rates its route, service tier and prompt length bill it at, in whole picodollars. A model missing from the
table has no price (``None``), never a price of zero, and no known limits.
"""

from __future__ import annotations

import json

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from decimal import Decimal
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final, NamedTuple

from ._catalog import LIMIT_FIELDS, merge_catalogs, parse_catalog, prices_on
from .._exceptions import ConfigError
from .._providers import ProviderTable, provider_lookup
from ._lanes import Lane, LaneOffer, lane_offers
from ._units import PER_TOKENS, _PICO_PER_TOKEN, PICO_PER_USD, billing_tier, from_pico
from .._status import ROUTES, Route

__all__ = [
    "PER_TOKENS",
    "PICO_PER_USD",
    "Charge",
    "LongPrompt",
    "ModelInfo",
    "ModelLimits",
    "ModelPrice",
    "PriceTable",
    "Tier",
    "billing_tier",
    "from_pico",
]

# Snapshot names: "gpt-4o-mini-2024-07-18", the older "gpt-3.5-turbo-0125", and Anthropic's "claude-sonnet-4-5-20250929".
_SNAPSHOT = re.compile(r"-(?:\d{4}-\d{2}-\d{2}|\d{8}|\d{4})$")
# OpenAI renamed priority processing "Fast mode" on 2026-07-30 and takes either word (and reports "priority");
# Anthropic's fast mode (``speed: "fast"``) is a tier of its own name.
_TIER_ALIASES: Final = MappingProxyType({"fast": "priority"})
_PROVIDER_NAMES: Final = MappingProxyType({"openai": "OpenAI", "anthropic": "Anthropic", "gemini": "Google"})
# Distinct (model, route, tier) billings worked out per table before the memo starts again.
_RATES_MEMO = 4096


@dataclass(frozen=True, slots=True)
class Tier:
    """A service tier's prices: a fraction off the standard ones (``discount``; flex is billed at the batch rate),
    a multiple of them (``multiplier``; priority at 2x), or its own prices per 1M tokens. A cache price it does not
    list scales with its input price."""

    discount: Decimal = Decimal(0)
    multiplier: Decimal = Decimal(1)
    input: Decimal | None = None
    cached_input: Decimal | None = None
    cache_write: Decimal | None = None
    cache_write_extended: Decimal | None = None
    output: Decimal | None = None
    cache_storage: Decimal | None = None


@dataclass(frozen=True, slots=True)
class ModelPrice:
    """One model's standard-tier prices in the table's currency per 1M tokens, and the rules that change them."""

    input: Decimal
    cached_input: Decimal
    output: Decimal
    # Fraction taken off on the Batch API: 0.5 means half price.
    batch_discount: Decimal
    # An input token written to the prompt cache at the provider's default duration (Anthropic 5 minutes, OpenAI
    # 30 minutes); the input price where none is listed.
    cache_write: Decimal | None = None
    # A write at the longer duration (Anthropic 1 hour, OpenAI 12 hours); the default write's price where none is listed.
    cache_write_extended: Decimal | None = None
    # An explicit cache's storage (Gemini's cached contents) per 1M tokens per hour; None: no explicit cache priced.
    cache_storage: Decimal | None = None
    # Every token of a request whose prompt (cache reads and writes included) is longer than ``long_prompt.above``
    # tokens is priced at ``long_prompt.price`` (scaled alike on other tiers); None: one price at any length.
    long_prompt: LongPrompt | None = None
    # Service tiers other than standard, by name ("flex", "priority"...); a tier not listed has no price.
    tiers: Mapping[str, Tier] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        if self.cache_write is None:
            object.__setattr__(self, "cache_write", self.input)
        if self.cache_write_extended is None:
            object.__setattr__(self, "cache_write_extended", self.cache_write)

    @property
    def rates(self) -> _Prices:
        return _Prices(self.input, self.cached_input, self.cache_write, self.cache_write_extended, self.output)

    def for_prompt(self, prompt_tokens: int) -> ModelPrice:
        """The standard prices a request with this many prompt tokens pays."""
        long = self.long_prompt
        return long.price if long is not None and prompt_tokens > long.above else self


@dataclass(frozen=True, slots=True)
class LongPrompt:
    """A model's prices above a prompt length."""

    above: int
    price: ModelPrice


@dataclass(frozen=True, slots=True)
class ModelLimits:
    """How many tokens a model takes and gives per request; None where the table does not say."""

    # Prompt and reply together.
    context_window: int | None = None
    # The longest prompt, where the provider gives one below the window (922,000 of gpt-6.2-sol's 1,050,000).
    max_input_tokens: int | None = None
    # The largest reply (``max_completion_tokens``), reasoning tokens included.
    max_output_tokens: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelInfo:
    """What the catalog says about a model besides its prices: what it is, until when it is served, and where and
    when its figures were read."""

    provider: str | None = None
    kind: str = "chat"
    # The day the provider stops serving it; None: no shutdown announced.
    shutdown: date | None = None
    replacement: str | None = None
    aliases: tuple[str, ...] = ()
    dimensions: int | None = None
    source: str | None = None
    prices_as_of: str | None = None
    # Figures only a secondary source gives: which, and where from.
    secondary_fields: tuple[str, ...] = ()
    secondary_source: str | None = None
    note: str | None = None
    # Price changes: (the day each takes effect, the prices it sets).
    changes: tuple[tuple[date, Mapping[str, Decimal]], ...] = ()
    # From the user's price file.
    user: bool = False


class Charge(NamedTuple):
    """What one request (or usage summed over requests billed alike) costs, in picodollars."""

    cost: int
    # The same usage at the standard real-time price: on the Batch API (or flex), what the discount saved is the
    # difference.
    list_cost: int
    # The fraction taken off the list price as decimal text (stored as such): the model's batch discount on the
    # Batch API ("0.5"), the flex discount on flex, else "0".
    discount: str

    @property
    def dollars(self) -> Decimal:
        return from_pico(self.cost)

    @property
    def list_dollars(self) -> Decimal:
        return from_pico(self.list_cost)


@dataclass(frozen=True, kw_only=True)
class PriceTable:
    """Prices, limits and facts by model name, as in effect on ``priced_on``; build it with ``PriceTable.load()``."""

    prices_as_of: str
    source: str
    currency: str
    models: Mapping[str, ModelPrice]
    limits: Mapping[str, ModelLimits] = field(default_factory=lambda: MappingProxyType({}))
    info: Mapping[str, ModelInfo] = field(default_factory=lambda: MappingProxyType({}))
    # Alias -> the model it names ("gpt-5.6" -> "gpt-5.6-sol").
    aliases: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    limits_as_of: str | None = None
    limits_source: str | None = None
    # The user's file merged over the bundled table (``load(path=...)``), as given; None for the bundled one.
    prices_file: str | None = None
    # The day whose prices these are: price changes that take effect later are not in ``models``.
    priced_on: date | None = None
    # The discounted lanes shorter than the Batch API's, by route name.
    lanes: Mapping[str, Lane] = field(default_factory=lambda: MappingProxyType({}))
    # The table-wide Batch API discount (a model's own ``batch_discount`` overrides it).
    batch_discount: Decimal = Decimal("0.5")
    # How each (model, route, tier) is billed, worked out when first priced; a copy (``replace``) starts afresh.
    _billings: dict[tuple[str, str, str | None], _Billing | None] = field(
        default_factory=dict, init=False, repr=False, compare=False)
    # Model names as asked -> the table's name (``model_name``), found once each.
    _names: dict[str, str | None] = field(default_factory=dict, init=False, repr=False, compare=False)

    @classmethod
    def load(cls, *, path: Path | None = None, on: date | None = None, providers: ProviderTable | None = None
             ) -> PriceTable:
        """The bundled catalog, with the user's file at ``path`` (same format, any subset) on top, priced as on
        day ``on`` (default: today, UTC).

        The user's models replace bundled models of the same name, keeping the bundled facts (``context_window``,
        ``max_output_tokens``, provider, shutdown...) unless they give their own; its ``batch_discount``,
        ``prices_as_of``, ``source`` and ``limits_*`` replace the bundled ones. A declared provider's priced models
        (``providers``) join as ``NAME/model``, the provider's own: never the bundled model of that name's price.
        Raises ``ConfigError``.
        """
        bundled_text = resources.files("llm_dispatch.core").joinpath("prices.json").read_text(encoding="utf-8")
        merged = parse_catalog(bundled_text, where="bundled prices.json", complete=True)
        user_models: frozenset[str] = frozenset()
        if path is not None:
            where = str(path)
            try:
                text = Path(path).read_text(encoding="utf-8")
            except FileNotFoundError as exc:
                raise ConfigError(f"price file {where}: no such file; give the path of a JSON price table") from exc
            except (OSError, UnicodeDecodeError) as exc:
                raise ConfigError(f"price file {where}: cannot be read ({exc})") from exc
            user = parse_catalog(text, where=where, complete=False)
            user_models = frozenset(user.get("models", {}))
            merged = merge_catalogs(merged, user, where=where)
        for provider in (providers.declared.values() if providers is not None else ()):
            if provider.prices:
                where = f"providers file {providers.source or ''} ({provider.name})" if providers else ""
                own = parse_catalog(json.dumps({"models": {f"{provider.name}/{model}": dict(entry)
                                                            for model, entry in provider.prices.items()}}, default=str),
                                    where=where, complete=False)
                for name, entry in own["models"].items():
                    entry["provider"] = provider.name
                    merged["models"][name] = entry
                user_models |= frozenset(own["models"])
        day = on or datetime.now(UTC).date()
        default_discount = merged["batch_discount"]
        prices, limits, info = {}, {}, {}
        aliases: dict[str, str] = {}
        # A model whose entry names no provider goes where the built-in rule sends it (claude-* to Anthropic).
        builtin = provider_lookup()
        for name, entry in merged["models"].items():
            prices[name] = _model_price(entry, day=day, default_discount=default_discount)
            if any(key in entry for key in LIMIT_FIELDS):
                limits[name] = ModelLimits(**{key: entry.get(key) for key in LIMIT_FIELDS})
            info[name] = _model_info(entry, user=name in user_models, provider=entry.get("provider") or builtin(name))
            for alias in entry.get("aliases", ()):
                aliases.setdefault(alias, name)
        return cls(
            prices_as_of=merged["prices_as_of"],
            source=merged["source"],
            currency=merged["currency"],
            models=MappingProxyType(prices),
            limits=MappingProxyType(limits),
            info=MappingProxyType(info),
            aliases=MappingProxyType(aliases),
            limits_as_of=merged.get("limits_as_of"),
            limits_source=merged.get("limits_source"),
            prices_file=None if path is None else str(path),
            priced_on=day,
            lanes=MappingProxyType({name: Lane(name=name, endpoints=tuple(lane.pop("endpoints")), **lane)
                                    for name, lane in ((name, dict(lane)) for name, lane in
                                                       merged.get("lanes", {}).items())}),
            batch_discount=default_discount,
        )

    def model_name(self, model: str) -> str | None:
        """The table's name for ``model``: itself, the model an alias names, or the model of a dated snapshot."""
        try:
            return self._names[model]
        except KeyError:
            pass
        found = None
        for name in (model, _SNAPSHOT.sub("", model)):
            if name in self.models or name in self.info:
                found = name
                break
            if name in self.aliases:
                found = self.aliases[name]
                break
        if len(self._names) >= _RATES_MEMO:
            self._names.clear()
        self._names[model] = found
        return found

    def price_for(self, model: str) -> ModelPrice | None:
        """The price of ``model`` (see ``model_name``); else None."""
        name = self.model_name(model)
        return None if name is None else self.models.get(name)

    def long_above(self, model: str) -> int | None:
        """The prompt tokens above which a request to ``model`` has its long-prompt price; None: one at any length."""
        long = None if (price := self.price_for(model)) is None else price.long_prompt
        return None if long is None else long.above

    def limits_for(self, model: str) -> ModelLimits | None:
        """The context window and maximum reply of ``model`` (see ``model_name``); else None."""
        name = self.model_name(model)
        return None if name is None else self.limits.get(name)

    def info_for(self, model: str) -> ModelInfo | None:
        """What the catalog says of ``model`` besides prices (see ``model_name``); else None."""
        name = self.model_name(model)
        return None if name is None else self.info.get(name)

    def lane_offers(self, *, model: str, endpoint: str) -> tuple[LaneOffer, ...]:
        """The lanes a request of ``model`` to ``endpoint`` can take (``_lanes.lane_offers``)."""
        info = self.info_for(model)
        return lane_offers(self.lanes.values(), price=self.price_for(model), endpoint=endpoint,
                           provider=None if info is None else info.provider, batch_discount=self.batch_discount)

    def shutdown_problem(self, model: str) -> str | None:
        """Why ``model`` cannot be used on ``priced_on`` (its provider has shut it down), as one line; else None."""
        info = self.info_for(model)
        if info is None or info.shutdown is None or self.priced_on is None or self.priced_on < info.shutdown:
            return None
        instead = f"use {info.replacement} instead" if info.replacement else "pick a current model"
        provider = _PROVIDER_NAMES.get(info.provider or "", "its provider")
        return (f"{model} was shut down on {info.shutdown.isoformat()} ({provider} no longer serves it); {instead} "
                "(`llm-dispatch models` lists the catalog)")

    def shutdown_ahead(self, model: str) -> date | None:
        """The day ``model`` is to be shut down when that is after ``priced_on``; else None."""
        info = self.info_for(model)
        if info is None or info.shutdown is None or self.priced_on is None or self.priced_on >= info.shutdown:
            return None
        return info.shutdown

    def price(
        self,
        *,
        model: str,
        route: Route,
        prompt_tokens: int,
        completion_tokens: int,
        cached_tokens: int = 0,
        cache_creation_tokens: int = 0,
        cache_creation_extended_tokens: int = 0,
        service_tier: str | None = None,
        long_prompt: bool | None = None,
    ) -> Charge | None:
        """What a request cost: the one price formula. None when the model (or the tier it was served at) has no
        price, an unknown cost, never 0.

        ``cached_tokens`` (cache reads) and ``cache_creation_tokens`` (cache writes, of which
        ``cache_creation_extended_tokens`` at the longer duration) are parts of ``prompt_tokens``; usage a
        provider reported beyond that is counted as far as the prompt goes, never refused. ``service_tier`` is the
        tier the answer reports (or the request asks for); the Batch API has its own rate whatever the tier. A
        model with a long-prompt price uses it when ``prompt_tokens`` is above its threshold; for usage summed
        over many requests, ``long_prompt`` says which price they paid instead.
        """
        if min(prompt_tokens, completion_tokens, cached_tokens, cache_creation_tokens,
               cache_creation_extended_tokens) < 0:
            for name, count in (("prompt_tokens", prompt_tokens), ("completion_tokens", completion_tokens),
                                ("cached_tokens", cached_tokens), ("cache_creation_tokens", cache_creation_tokens),
                                ("cache_creation_extended_tokens", cache_creation_extended_tokens)):
                if count < 0:
                    raise ValueError(f"{name} must be >= 0, got {count}")
        tier = None if service_tier is None or route == "batch" else billing_tier(service_tier)
        lane = self.lanes.get(route)
        if service_tier is None and lane is not None and lane.tier is not None:
            # Sent at the lane's tier: an answer that does not say which tier served it is billed at that one (one
            # that says "default" was served, and is billed, at the standard tier).
            tier = lane.tier
        key = (model, route, tier)
        try:
            billing = self._billings[key]
        except KeyError:
            if route not in ROUTES:
                raise ValueError(f"route {route!r} is unknown; use one of {', '.join(ROUTES)}") from None
            if len(self._billings) >= _RATES_MEMO:
                self._billings.clear()
            off = lane.discount if lane is not None and lane.discount is not None else Decimal(0)
            billing = self._billings[key] = _billing(self.price_for(model), route=route, tier=tier, lane_discount=off)
        if billing is None:
            return None
        long = prompt_tokens > billing.above if long_prompt is None else long_prompt
        paid, listed = (billing.long_paid, billing.long_listed) if long else (billing.paid, billing.listed)
        read = min(cached_tokens, prompt_tokens)
        written = min(cache_creation_tokens, prompt_tokens - read)
        extended = min(cache_creation_extended_tokens, written)
        usage = (prompt_tokens - read - written, read, written - extended, extended, completion_tokens)
        cost = _charge(paid, usage)
        return Charge(cost, cost if listed is paid else _charge(listed, usage), billing.discount)


class _Prices(NamedTuple):
    """Prices (per 1M tokens) or rates (picodollars per token) of each kind of token, in usage order."""

    input: Any
    cached_input: Any
    cache_write: Any
    cache_write_extended: Any
    output: Any


class _Billing(NamedTuple):
    """How one model's requests on one route and tier are billed, in picodollars per token."""

    paid: _Prices
    listed: _Prices  # the same object as ``paid`` when nothing is taken off or added
    discount: str
    # Above this many prompt tokens the ``long_*`` rates apply; a number no prompt exceeds when there are none.
    above: Any
    long_paid: _Prices
    long_listed: _Prices


def _charge(rates: _Prices, usage: tuple[int, int, int, int, int]) -> int:
    """The formula: each kind of token (uncached input, cache reads, default and extended cache writes, output)
    times its rate; a rate finer than a picodollar rounds half-even once per charge."""
    total = (usage[0] * rates[0] + usage[1] * rates[1] + usage[2] * rates[2] + usage[3] * rates[3]
             + usage[4] * rates[4])
    return total if type(total) is int else int(total.to_integral_value())


def _billing(price: ModelPrice | None, *, route: Route, tier: str | None, lane_discount: Decimal) -> _Billing | None:
    """A lane's own discount (a background completion window) applies at the standard tier; a tier the answer
    reports is billed as that tier."""
    if price is None:
        return None
    standard = price.rates
    long = price.long_prompt
    long_standard = long.price.rates if long is not None else standard
    if route == "batch":
        keep, discount, base, long_base = 1 - price.batch_discount, price.batch_discount, standard, long_standard
    elif tier is None:
        keep, discount, base, long_base = 1 - lane_discount, lane_discount, standard, long_standard
    else:
        found = price.tiers.get(tier)
        if found is None:
            found = price.tiers.get(_TIER_ALIASES.get(tier, tier))
        if found is None:
            return None
        keep, discount = found.multiplier * (1 - found.discount), found.discount
        base = standard if found.input is None else _tier_prices(found, standard)
        long_base = long_standard if found.input is None else _Prices(*(
            at * (longer / plain) if plain else longer for at, longer, plain in zip(base, long_standard, standard)))
    paid, listed = _rates(base, keep), _rates(standard, Decimal(1))
    long_paid, long_listed = _rates(long_base, keep), _rates(long_standard, Decimal(1))
    if paid == listed:
        paid = listed
    if long_paid == long_listed:
        long_paid = long_listed
    return _Billing(paid, listed, "0" if not discount else str(discount),
                    long.above if long is not None else float("inf"), long_paid, long_listed)


def _tier_prices(tier: Tier, standard: _Prices) -> _Prices:
    """A tier's own prices; a cache price it does not list is the standard one scaled by the tier's input price."""
    assert tier.input is not None and tier.output is not None
    scale = tier.input / standard.input if standard.input else Decimal(1)
    cached = tier.cached_input if tier.cached_input is not None else standard.cached_input * scale
    write = tier.cache_write if tier.cache_write is not None else standard.cache_write * scale
    extended = (tier.cache_write_extended if tier.cache_write_extended is not None
                else standard.cache_write_extended * scale)
    return _Prices(tier.input, cached, write, extended, tier.output)


def _rates(prices: _Prices, keep: Decimal) -> _Prices:
    return _Prices(*(_per_token(value * keep) for value in prices))


def _per_token(price_per_million: Decimal) -> int | Decimal:
    rate = price_per_million * _PICO_PER_TOKEN
    return int(rate) if rate == rate.to_integral_value() else rate


def _model_price(entry: Mapping[str, Any], *, day: date, default_discount: Decimal) -> ModelPrice:
    discount = entry.get("batch_discount", default_discount)
    now = prices_on(entry, day)
    long = entry.get("long_prompt")
    tiers = {name: Tier(**tier) for name, tier in now["tiers"].items()}
    return ModelPrice(
        **_price_fields(now), batch_discount=discount,
        long_prompt=None if long is None else LongPrompt(
            above=long["above"], price=ModelPrice(**_price_fields(long), batch_discount=discount)),
        tiers=MappingProxyType(tiers),
    )


def _price_fields(entry: Mapping[str, Any]) -> dict[str, Any]:
    return {"input": entry["input"], "cached_input": entry.get("cached_input", entry["input"]),
            "cache_write": entry.get("cache_write"), "cache_write_extended": entry.get("cache_write_extended"),
            "output": entry["output"], "cache_storage": entry.get("cache_storage")}


def _model_info(entry: Mapping[str, Any], *, user: bool, provider: str) -> ModelInfo:
    secondary = entry.get("secondary") or {}
    return ModelInfo(
        provider=provider, kind=entry.get("kind", "chat"), shutdown=entry.get("shutdown"),
        replacement=entry.get("replacement"), aliases=tuple(entry.get("aliases", ())),
        dimensions=entry.get("dimensions"), source=entry.get("source"), prices_as_of=entry.get("prices_as_of"),
        secondary_fields=tuple(secondary.get("fields", ())), secondary_source=secondary.get("source"),
        note=entry.get("note"), user=user,
        changes=tuple((change["effective"], MappingProxyType({key: value for key, value in change.items()
                                                              if key != "effective"}))
                      for change in entry.get("changes", ())),
    )

