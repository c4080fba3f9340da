"""The model catalog file (``prices.json`` and a user's ``--prices-file``): its format, checked field by field,
and the user's file merged over the bundled one. ``_pricing.PriceTable`` is built from what this returns.

A model entry holds its standard prices per 1M tokens (``input``, ``cached_input`` = cache reads,
``cache_write`` = a write at the provider's default duration, ``cache_write_extended`` = at its longer one,
``output``; ``cache_storage`` = an explicit cache's storage per 1M tokens per hour, Gemini's), the rules that change them (``long_prompt``, ``tiers``, dated ``changes``, ``batch_discount``) and
facts about the model (window, maximum output, provider, shutdown date, where and when its figures were read).
Every new field is optional, so a file in the first format (input, cached_input, output...) still loads.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

from .._exceptions import ConfigError
from .._providers import PROVIDERS
from ._routing import parse_deadline
from .._status import REQUEST_ROUTES

__all__ = ["FACT_FIELDS", "LIMIT_FIELDS", "PRICE_FIELDS", "merge_catalogs", "parse_catalog", "prices_on"]

_TOP_FIELDS = frozenset({"prices_as_of", "source", "currency", "unit", "batch_discount", "models",
                         "limits_as_of", "limits_source", "lanes"})
# Fields the bundled catalog must have; a user's file may give any subset.
_REQUIRED_TOP = frozenset({"prices_as_of", "source", "currency", "unit", "batch_discount", "models"})
# Per 1M tokens (``cache_storage``: per 1M tokens per hour). A missing cache price is left out: cache reads and writes
# then cost what input does, an extended write what a default write does; a model without ``cache_storage`` is never
# planned an explicit cache.
PRICE_FIELDS = ("input", "cached_input", "cache_write", "cache_write_extended", "output", "cache_storage")
LIMIT_FIELDS = ("context_window", "max_input_tokens", "max_output_tokens")
# What a model is rather than what it costs: kept from the bundled entry when a user's file reprices the model.
FACT_FIELDS = (*LIMIT_FIELDS, "provider", "kind", "shutdown", "replacement", "aliases", "dimensions")
_RULE_FIELDS = ("batch_discount", "long_prompt", "tiers", "changes")
_SOURCE_FIELDS = ("prices_as_of", "source", "secondary", "note")
_MODEL_FIELDS = frozenset({*PRICE_FIELDS, *FACT_FIELDS, *_RULE_FIELDS, *_SOURCE_FIELDS})
# A model's prices for requests whose prompt is longer than ``above`` tokens.
_LONG_PROMPT_FIELDS = frozenset({"above", *PRICE_FIELDS})
# A service tier: its own prices, a multiple of the standard ones (priority: 2x), or a fraction off them (flex: the
# batch rate).
_TIER_FIELDS = frozenset({"discount", "multiplier", *PRICE_FIELDS})
# A price change: the prices (and tiers) it sets from the day it takes effect.
_CHANGE_FIELDS = frozenset({"effective", "tiers", *PRICE_FIELDS})
KINDS = ("chat", "embedding")
# A discounted lane shorter than the Batch API's (``lanes``, by route name): which provider and endpoints take it,
# its window, and its discount: a fraction off (``discount``), or a model's service tier of that name (``tier``).
_LANE_FIELDS = frozenset({"provider", "endpoints", "window", "discount", "tier", "source", "note"})


_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)


def parse_catalog(text: str, *, where: str, complete: bool) -> dict[str, Any]:
    """A catalog file checked into plain values (Decimals for prices); ``complete`` requires every top-level
    field the bundled catalog has. Raises ``ConfigError`` naming the file and the field."""

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
        missing = sorted(_REQUIRED_TOP - set(data))
        if missing:
            raise bad(missing[0], "is missing")

    parsed: dict[str, Any] = {}
    for name in ("source", "currency", "unit", "limits_source"):
        if name in data:
            parsed[name] = _text(data[name], field_name=name, bad=bad)
    for name in ("prices_as_of", "limits_as_of"):
        if name in data:
            parsed[name] = _date(data[name], field_name=name, bad=bad).isoformat()
    if "batch_discount" in data:
        parsed["batch_discount"] = _fraction(data["batch_discount"], field_name="batch_discount", bad=bad)
    if "lanes" in data:
        parsed["lanes"] = _lanes(data["lanes"], bad=bad)
    if "models" in data:
        models = data["models"]
        if not isinstance(models, dict):
            raise bad("models", "must be an object of model name -> {input, cached_input, output}")
        parsed["models"] = {name: _model(name, entry, bad=bad) for name, entry in models.items()}
    return parsed


def merge_catalogs(bundled: dict[str, Any], user: dict[str, Any], *, where: str) -> dict[str, Any]:
    """``user`` over ``bundled``: a user's model replaces the bundled one of its name, prices and price rules
    alike, keeping the bundled facts (window, maximum output, provider, shutdown...) it does not give; its
    top-level fields replace the bundled ones."""
    for name in ("currency", "unit"):
        if name in user and user[name] != bundled[name]:
            raise ConfigError(
                f"price file {where}: field '{name}' is {user[name]!r} but prices must be "
                f"{bundled[name]!r}; convert them or remove the field"
            )
    merged = {**bundled, **{key: value for key, value in user.items() if key != "models"}}
    models = dict(bundled["models"])
    for name, entry in user.get("models", {}).items():
        known = bundled["models"].get(name, {})
        models[name] = {**{key: known[key] for key in FACT_FIELDS if key in known}, **entry}
    merged["models"] = models
    return merged


def prices_on(entry: Mapping[str, Any], day: date) -> dict[str, Any]:
    """The entry's price fields and ``tiers`` as in effect on ``day``: each change that took effect by then, in
    date order, over the entry's own (a change's tiers replace the tiers of the same name)."""
    prices = {key: entry[key] for key in PRICE_FIELDS if key in entry}
    tiers = dict(entry.get("tiers", {}))
    for change in entry.get("changes", ()):
        if change["effective"] <= day:
            prices.update({key: change[key] for key in PRICE_FIELDS if key in change})
            tiers.update(change.get("tiers", {}))
    return {**prices, "tiers": tiers}


def _model(name: str, entry: Any, *, bad: Any) -> dict[str, Any]:
    prefix = f"models.{name}"
    if not name.strip():
        raise bad(prefix, "needs a non-empty model name")
    if not isinstance(entry, dict):
        raise bad(prefix, "must be an object with 'input' and 'output' prices (and optionally 'cached_input')")
    unknown = sorted(set(entry) - _MODEL_FIELDS)
    if unknown:
        raise bad(f"{prefix}.{unknown[0]}", f"is unknown (allowed: {', '.join(sorted(_MODEL_FIELDS))})")
    kind = entry.get("kind", "chat")
    if kind not in KINDS:
        raise bad(f"{prefix}.kind", f"must be one of {', '.join(KINDS)}, got {_shown(kind)}")
    # An embedding model bills its input alone.
    parsed: dict[str, Any] = _prices(entry, prefix=prefix, bad=bad, required=("input",) if kind == "embedding"
                                     else ("input", "output"))
    parsed.setdefault("output", Decimal(0))
    if "kind" in entry:
        parsed["kind"] = kind
    if "batch_discount" in entry:
        parsed["batch_discount"] = _fraction(entry["batch_discount"], field_name=f"{prefix}.batch_discount", bad=bad)
    # Where and when the entry's figures were read: free text in the first format, kept as given.
    for key in ("source", "note", "replacement", "prices_as_of"):
        if key in entry:
            parsed[key] = _text(entry[key], field_name=f"{prefix}.{key}", bad=bad)
    if "shutdown" in entry:
        parsed["shutdown"] = _date(entry["shutdown"], field_name=f"{prefix}.shutdown", bad=bad)
    if "provider" in entry:
        if entry["provider"] not in PROVIDERS:
            raise bad(f"{prefix}.provider", f"must be one of {', '.join(PROVIDERS)}, got {_shown(entry['provider'])}")
        parsed["provider"] = entry["provider"]
    for key in (*LIMIT_FIELDS, "dimensions"):
        if key in entry:
            parsed[key] = _tokens(entry[key], field_name=f"{prefix}.{key}", bad=bad)
    if "aliases" in entry:
        parsed["aliases"] = _names(entry["aliases"], field_name=f"{prefix}.aliases", bad=bad)
    if "secondary" in entry:
        parsed["secondary"] = _secondary(entry["secondary"], prefix=f"{prefix}.secondary", bad=bad)
    if "long_prompt" in entry:
        parsed["long_prompt"] = _long_prompt(entry["long_prompt"], prefix=f"{prefix}.long_prompt", bad=bad)
    if "tiers" in entry:
        parsed["tiers"] = _tiers(entry["tiers"], prefix=f"{prefix}.tiers", bad=bad)
    if "changes" in entry:
        parsed["changes"] = _changes(entry["changes"], prefix=f"{prefix}.changes", bad=bad)
    return parsed


def _lanes(entry: Any, *, bad: Any) -> dict[str, dict[str, Any]]:
    if not isinstance(entry, dict):
        raise bad("lanes", "must be an object of lane name -> {provider, endpoints, window, discount or tier, source}")
    lanes = {}
    for name, lane in entry.items():
        where = f"lanes.{name}"
        if name not in REQUEST_ROUTES or name == "realtime":
            raise bad(where, f"is no lane llm-dispatch sends (one of {', '.join(REQUEST_ROUTES[1:])})")
        if not isinstance(lane, dict):
            raise bad(where, "must be an object: {provider, endpoints, window, discount or tier, source}")
        _known(lane, _LANE_FIELDS, prefix=where, bad=bad)
        missing = sorted({"provider", "endpoints", "window", "source"} - set(lane))
        if missing:
            raise bad(f"{where}.{missing[0]}", "is missing")
        if ("discount" in lane) == ("tier" in lane):
            raise bad(where, "needs one of 'discount' (a fraction off) and 'tier' (the model's service tier it bills at)")
        if lane["provider"] not in PROVIDERS:
            raise bad(f"{where}.provider", f"must be one of {', '.join(PROVIDERS)}, got {_shown(lane['provider'])}")
        try:
            # A duration such as "15m" or "2h", measured from a fixed moment: only its length is kept.
            window = parse_deadline(_text(lane["window"], field_name=f"{where}.window", bad=bad), now=_EPOCH) - _EPOCH
        except ValueError:
            raise bad(f"{where}.window", f"must be a duration like 15m or 2h, got {_shown(lane['window'])}") from None
        parsed: dict[str, Any] = {"provider": lane["provider"], "window": window,
                                  "endpoints": _names(lane["endpoints"], field_name=f"{where}.endpoints", bad=bad),
                                  "source": _text(lane["source"], field_name=f"{where}.source", bad=bad)}
        if "discount" in lane:
            parsed["discount"] = _fraction(lane["discount"], field_name=f"{where}.discount", bad=bad)
        else:
            parsed["tier"] = _text(lane["tier"], field_name=f"{where}.tier", bad=bad)
        if "note" in lane:
            parsed["note"] = _text(lane["note"], field_name=f"{where}.note", bad=bad)
        lanes[name] = parsed
    return lanes


def _long_prompt(entry: Any, *, prefix: str, bad: Any) -> dict[str, Any]:
    if not isinstance(entry, dict):
        raise bad(prefix, "must be an object: {\"above\": tokens, \"input\": ..., \"output\": ...}")
    _known(entry, _LONG_PROMPT_FIELDS, prefix=prefix, bad=bad)
    if "above" not in entry:
        raise bad(f"{prefix}.above", "is missing (the prompt length in tokens above which these prices apply)")
    return {"above": _tokens(entry["above"], field_name=f"{prefix}.above", bad=bad),
            **_prices(entry, prefix=prefix, bad=bad, required=("input", "output"))}


def _tiers(entry: Any, *, prefix: str, bad: Any) -> dict[str, dict[str, Any]]:
    if not isinstance(entry, dict):
        raise bad(prefix, "must be an object of tier name -> {\"discount\": 0.5} or its prices {\"input\": ..., ...}")
    tiers = {}
    for name, tier in entry.items():
        where = f"{prefix}.{name}"
        if not isinstance(tier, dict):
            raise bad(where, "must be an object: {\"discount\": 0.5} or {\"input\": ..., \"output\": ...}")
        _known(tier, _TIER_FIELDS, prefix=where, bad=bad)
        ways = [way for way in ("discount", "multiplier") if way in tier]
        if len(ways) > 1 or (ways and len(tier) > 1):
            raise bad(where, "gives more than one of a discount, a multiplier and prices; give one")
        if "discount" in tier:
            tiers[name] = {"discount": _fraction(tier["discount"], field_name=f"{where}.discount", bad=bad)}
        elif "multiplier" in tier:
            value = tier["multiplier"]
            if not _is_number(value) or value <= 0:
                raise bad(f"{where}.multiplier", f"must be a number > 0 (2 = twice the standard prices), got "
                                                 f"{_shown(value)}")
            tiers[name] = {"multiplier": Decimal(value)}
        else:
            tiers[name] = _prices(tier, prefix=where, bad=bad, required=("input", "output"))
    return tiers


def _changes(entry: Any, *, prefix: str, bad: Any) -> list[dict[str, Any]]:
    if not isinstance(entry, list):
        raise bad(prefix, "must be a list of {\"effective\": \"YYYY-MM-DD\", <prices that change>}")
    changes = []
    for index, change in enumerate(entry):
        where = f"{prefix}[{index}]"
        if not isinstance(change, dict):
            raise bad(where, "must be an object: {\"effective\": \"YYYY-MM-DD\", \"input\": ...}")
        _known(change, _CHANGE_FIELDS, prefix=where, bad=bad)
        if "effective" not in change:
            raise bad(f"{where}.effective", "is missing (the date the new prices take effect)")
        prices: dict[str, Any] = _prices(change, prefix=where, bad=bad, required=())
        if "tiers" in change:
            prices["tiers"] = _tiers(change["tiers"], prefix=f"{where}.tiers", bad=bad)
        if not prices:
            raise bad(where, f"changes no price (give one of {', '.join(PRICE_FIELDS)}, or tiers)")
        changes.append({"effective": _date(change["effective"], field_name=f"{where}.effective", bad=bad), **prices})
    return sorted(changes, key=lambda change: change["effective"])


def _secondary(entry: Any, *, prefix: str, bad: Any) -> dict[str, Any]:
    if not isinstance(entry, dict) or set(entry) != {"source", "fields"}:
        raise bad(prefix, "must be {\"source\": where the figures come from, \"fields\": [the figures only it gives]}")
    return {"source": _text(entry["source"], field_name=f"{prefix}.source", bad=bad),
            "fields": _names(entry["fields"], field_name=f"{prefix}.fields", bad=bad)}


def _prices(entry: Mapping[str, Any], *, prefix: str, bad: Any, required: tuple[str, ...]) -> dict[str, Decimal]:
    parsed: dict[str, Decimal] = {}
    for key in PRICE_FIELDS:
        if key not in entry:
            if key in required:
                raise bad(f"{prefix}.{key}", "is missing (a price per 1M tokens)")
            continue
        value = entry[key]
        if not _is_number(value) or value < 0:
            raise bad(f"{prefix}.{key}", f"must be a number >= 0 (price per 1M tokens), got {_shown(value)}")
        parsed[key] = Decimal(value)
    return parsed


def _known(entry: Mapping[str, Any], allowed: frozenset[str], *, prefix: str, bad: Any) -> None:
    unknown = sorted(set(entry) - allowed)
    if unknown:
        raise bad(f"{prefix}.{unknown[0]}", f"is unknown (allowed: {', '.join(sorted(allowed))})")


def _text(value: Any, *, field_name: str, bad: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise bad(field_name, "must be a non-empty string")
    return value


def _names(value: Any, *, field_name: str, bad: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(item, str) and item.strip() for item in value):
        raise bad(field_name, "must be a list of non-empty strings")
    return list(value)


def _date(value: Any, *, field_name: str, bad: Any) -> date:
    try:
        return date.fromisoformat(value if isinstance(value, str) else "")
    except ValueError:
        raise bad(field_name, f"must be a date like 2025-08-07, got {_shown(value)}") from None


def _tokens(value: Any, *, field_name: str, bad: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise bad(field_name, f"must be a whole number of tokens >= 1, got {_shown(value)}")
    return value


def _fraction(value: Any, *, field_name: str, bad: Any) -> Decimal:
    if not _is_number(value) or not 0 <= value <= 1:
        raise bad(field_name, f"must be a fraction from 0 to 1 (0.5 = half price), got {_shown(value)}")
    return Decimal(value)


def _is_number(value: Any) -> bool:
    # JSON floats arrive as Decimal (parse_float); NaN and Infinity arrive as float and are refused.
    return isinstance(value, (int, Decimal)) and not isinstance(value, bool)


def _shown(value: Any) -> str:
    return str(value) if _is_number(value) else json.dumps(value, default=str)
