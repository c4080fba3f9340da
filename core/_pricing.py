"""The model table: prices, context windows and maximum replies per model, bundled with the user's overrides.

Prices are Decimals per 1M tokens, so sums over millions of prompts stay exact. A model missing
from the table has no price (``None``), never a price of zero, and no known limits.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import date
from decimal import Decimal
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ._exceptions import ConfigError
from ._routing import Route

__all__ = ["PER_TOKENS", "ROUTES", "LongPrompt", "ModelLimits", "ModelPrice", "PriceTable"]

PER_TOKENS = Decimal(1_000_000)
ROUTES = ("realtime", "batch")
_TOP_FIELDS = frozenset({"prices_as_of", "source", "currency", "unit", "batch_discount", "models",
                         "limits_as_of", "limits_source"})
_LIMIT_FIELDS = ("context_window", "max_output_tokens")
_MODEL_FIELDS = frozenset({"input", "cached_input", "cache_write", "output", "batch_discount", *_LIMIT_FIELDS,
                           *("prices_as_of", "source", "long_prompt")})
# A model's prices for requests whose prompt is longer than ``above`` tokens (Anthropic's Haiku 5.5 above 100,000).
_LONG_PROMPT_FIELDS = frozenset({"above", "input", "cached_input", "cache_write", "output"})
# Prices per model (input, cached_input = cache reads, cache_write, output); the rest of an entry is not a price.
_PRICE_FIELDS = ("input", "cached_input", "cache_write", "output")
# Snapshot names: "gpt-4o-mini-2024-07-18", the older "gpt-3.5-turbo-0125", and Anthropic's "claude-sonnet-4-5-20250929".
_SNAPSHOT = re.compile(r"-(?:\d{4}-\d{2}-\d{2}|\d{8}|\d{4})$")


@dataclass(frozen=True, slots=True)
class ModelPrice:
    """One model's standard-tier prices in the table's currency per 1M tokens."""

    input: Decimal
    cached_input: Decimal
    output: Decimal
    # Fraction taken off on the Batch API: 0.5 means half price.
    batch_discount: Decimal
    # An input token written to the prompt cache (Anthropic's 5-minute write); the input price where none is listed.
    cache_write: Decimal | None = None

    # Every token of a request whose prompt (cache reads and writes included) is longer than ``long_prompt.above``
    # tokens is priced at ``long_prompt.price``; None: one price at any length.
    long_prompt: LongPrompt | None = None

    def __post_init__(self) -> None:
        if self.cache_write is None:
            object.__setattr__(self, "cache_write", self.input)

    def for_prompt(self, prompt_tokens: int) -> ModelPrice:
        """The prices a request with this many prompt tokens pays."""
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
        bundled_text = resources.files("llm_dispatch.core").joinpath("prices.json").read_text(encoding="utf-8")
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
                cache_write=entry.get("cache_write", entry["input"]),
                output=entry["output"],
                batch_discount=entry.get("batch_discount", default_discount),
                long_prompt=_long_prompt(entry.get("long_prompt"),
                                         batch_discount=entry.get("batch_discount", default_discount)),
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
        cache_creation_tokens: int = 0,
        long_prompt: bool | None = None,
    ) -> Decimal | None:
        """What a request cost, in ``currency``; None when the model has no price. Cache reads
        (``cached_tokens``) and writes (``cache_creation_tokens``) are parts of ``prompt_tokens``.

        A model with a long-prompt price uses it when ``prompt_tokens`` is above its threshold; for usage
        summed over many requests, ``long_prompt`` says which price they paid instead."""
        if route not in ROUTES:
            raise ValueError(f"route {route!r} is unknown; use 'realtime' or 'batch'")
        for name, count in (("prompt_tokens", prompt_tokens), ("completion_tokens", completion_tokens),
                            ("cached_tokens", cached_tokens), ("cache_creation_tokens", cache_creation_tokens)):
            if count < 0:
                raise ValueError(f"{name} must be >= 0, got {count}")
        if cached_tokens + cache_creation_tokens > prompt_tokens:
            both = f" and cache_creation_tokens ({cache_creation_tokens}) together" if cache_creation_tokens else ""
            raise ValueError(
                f"cached_tokens ({cached_tokens}){both} cannot exceed prompt_tokens ({prompt_tokens}); "
                "cached tokens are part of the prompt"
            )
        price = self.price_for(model)
        if price is None:
            return None
        if long_prompt is None:
            price = price.for_prompt(prompt_tokens)
        elif long_prompt and price.long_prompt is not None:
            price = price.long_prompt.price
        assert price.cache_write is not None
        total = (
            (prompt_tokens - cached_tokens - cache_creation_tokens) * price.input
            + cached_tokens * price.cached_input
            + cache_creation_tokens * price.cache_write
            + completion_tokens * price.output
        ) / PER_TOKENS
        if route == "batch":
            total *= 1 - price.batch_discount
        return total


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
    parsed: dict[str, Decimal | int] = _prices(entry, prefix=prefix, bad=bad)
    if "batch_discount" in entry:
        parsed["batch_discount"] = _discount(entry["batch_discount"], field_name=f"{prefix}.batch_discount", bad=bad)
    # A model priced from another page than the table's: where and when, kept in the file for the reader.
    for key in ("prices_as_of", "source"):
        if key in entry and (not isinstance(entry[key], str) or not entry[key].strip()):
            raise bad(f"{prefix}.{key}", "must be a non-empty string")
    for key in _LIMIT_FIELDS:
        if key in entry:
            parsed[key] = _tokens(entry[key], field_name=f"{prefix}.{key}", bad=bad)
    if "long_prompt" in entry:
        parsed["long_prompt"] = _long_prompt_entry(entry["long_prompt"], prefix=f"{prefix}.long_prompt", bad=bad)
    return parsed


def _tokens(value: Any, *, field_name: str, bad: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise bad(field_name, f"must be a whole number of tokens >= 1, got {_shown(value)}")
    return value


def _long_prompt_entry(entry: Any, *, prefix: str, bad: Any) -> dict[str, Decimal | int]:
    if not isinstance(entry, dict):
        raise bad(prefix, "must be an object: {\"above\": tokens, \"input\": ..., \"output\": ...}")
    unknown = sorted(set(entry) - _LONG_PROMPT_FIELDS)
    if unknown:
        raise bad(f"{prefix}.{unknown[0]}", f"is unknown (allowed: {', '.join(sorted(_LONG_PROMPT_FIELDS))})")
    if "above" not in entry:
        raise bad(f"{prefix}.above", "is missing (the prompt length in tokens above which these prices apply)")
    return {"above": _tokens(entry["above"], field_name=f"{prefix}.above", bad=bad), **_prices(entry, prefix=prefix, bad=bad)}


def _prices(entry: Mapping[str, Any], *, prefix: str, bad: Any) -> dict[str, Decimal | int]:
    """The price fields of an entry, checked; a missing cache price is left out (cache tokens cost what input does)."""
    parsed: dict[str, Decimal | int] = {}
    for key in _PRICE_FIELDS:
        if key not in entry:
            if key in ("cached_input", "cache_write"):
                continue
            raise bad(f"{prefix}.{key}", "is missing (a price per 1M tokens)")
        value = entry[key]
        if not _is_number(value) or value < 0:
            raise bad(f"{prefix}.{key}", f"must be a number >= 0 (price per 1M tokens), got {_shown(value)}")
        parsed[key] = Decimal(value)
    return parsed


def _long_prompt(entry: Mapping[str, Any] | None, *, batch_discount: Decimal) -> LongPrompt | None:
    if entry is None:
        return None
    price = ModelPrice(input=entry["input"], cached_input=entry.get("cached_input", entry["input"]),
                       cache_write=entry.get("cache_write", entry["input"]), output=entry["output"],
                       batch_discount=batch_discount)
    return LongPrompt(above=entry["above"], price=price)


def _discount(value: Any, *, field_name: str, bad: Any) -> Decimal:
    if not _is_number(value) or not 0 <= value <= 1:
        raise bad(field_name, f"must be a fraction from 0 to 1 (0.5 = half price), got {_shown(value)}")
    return Decimal(value)


def _is_number(value: Any) -> bool:
    # JSON floats arrive as Decimal (parse_float); NaN and Infinity arrive as float and are refused.
    return isinstance(value, (int, Decimal)) and not isinstance(value, bool)


def _shown(value: Any) -> str:
    return str(value) if _is_number(value) else json.dumps(value, default=str)
