"""``llm-dispatch models``: the model catalog as the runs price it (the bundled one, with a price file over it)."""

from __future__ import annotations

from decimal import Decimal
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from llm_dispatch.core import PriceTable, format_duration

# Price fields as listed, and the figure a secondary source alone gives is marked with.
_PRICES = ("input", "cached_input", "cache_write", "cache_write_extended", "output")
SECONDARY_MARK = "*"


def catalog(table: PriceTable, *, provider: str | None = None) -> dict[str, Any]:
    """Every model of ``table`` (of ``provider`` when given) with its prices, limits, tiers, shutdown and sources."""
    models = [describe(table, name) for name in table.models]
    return {"prices_as_of": table.prices_as_of, "priced_on": table.priced_on.isoformat() if table.priced_on else None,
            "prices_file": table.prices_file, "currency": table.currency, "unit": "per 1M tokens",
            "models": [model for model in models if provider is None or model["provider"] == provider],
            "lanes": [{"lane": lane.name, "provider": lane.provider, "endpoints": list(lane.endpoints),
                       "window": format_duration(lane.window), "discount": _number(lane.discount), "tier": lane.tier,
                       "source": lane.source, "note": lane.note}
                      for lane in table.lanes.values() if provider is None or lane.provider == provider]}


def describe(table: PriceTable, name: str) -> dict[str, Any]:
    """One model as ``llm-dispatch models --json`` shows it: prices in effect on the table's day."""
    price, info, limits = table.models[name], table.info[name], table.limits.get(name)
    shutdown = info.shutdown
    status = ("current" if shutdown is None else
              "shut down" if table.priced_on is not None and table.priced_on >= shutdown else "shutting down")
    long = price.long_prompt
    return {
        "name": name, "provider": info.provider, "kind": info.kind, "status": status,
        **{key: _number(getattr(price, key)) for key in _PRICES},
        "batch_discount": _number(price.batch_discount),
        "context_window": limits.context_window if limits else None,
        "max_input_tokens": limits.max_input_tokens if limits else None,
        "max_output_tokens": limits.max_output_tokens if limits else None,
        "dimensions": info.dimensions,
        "long_prompt": None if long is None else {
            "above": long.above, **{key: _number(getattr(long.price, key)) for key in _PRICES}},
        # Each tier as the catalog gives it: a discount (flex), a multiplier (priority), or its own prices.
        "tiers": {tier: {key: _number(value) for key, value in
                         (("discount", found.discount or None), ("multiplier", None if found.multiplier == 1
                                                                 else found.multiplier),
                          *((key, getattr(found, key)) for key in _PRICES)) if value is not None}
                  for tier, found in price.tiers.items()},
        "changes": [{"effective": day.isoformat(), **{key: _plain(value) for key, value in change.items()}}
                    for day, change in info.changes],
        "shutdown": None if shutdown is None else shutdown.isoformat(), "replacement": info.replacement,
        "aliases": list(info.aliases), "prices_as_of": info.prices_as_of or table.prices_as_of,
        "source": info.source or (table.prices_file if info.user else table.source),
        "secondary": {"fields": list(info.secondary_fields), "source": info.secondary_source}
        if info.secondary_fields else None,
        "note": info.note, "from_prices_file": info.user,
    }


# The table's columns, and which go first (last of this tuple first) when a terminal is too narrow for all.
_COLUMNS = ("model", "provider", "input", "cached", "write", "write+", "output", "window", "max out", "tiers",
            "shutdown", "as of")
_DROPPED_FIRST = ("as of", "write+", "write", "tiers", "max out", "provider", "window", "cached")


def print_catalog(console: Console, data: dict[str, Any]) -> None:
    """The catalog as tables. Piped, every cell whole at the width it needs; in a terminal too narrow for every
    column, the least needed columns are left out (the caption names them) rather than any being squeezed."""
    rows = [_row(model) for model in data["models"]]
    shown = list(_COLUMNS)
    table = _table(data, rows, shown)
    if console.is_terminal:
        for column in _DROPPED_FIRST:
            if _width(console, table) <= console.width:
                break
            shown.remove(column)
            table = _table(data, rows, shown)
    else:
        console = Console(file=console.file, width=max(console.width, _width(console, table)),
                          no_color=console.no_color, force_terminal=False)
    console.print(table, crop=False)
    hidden = [column for column in _COLUMNS if column not in shown]
    console.print(Text(
        f"{SECONDARY_MARK}: a figure only a secondary source gives (--json: secondary, source). "
        "cached: a cache read; write: a cache write (Anthropic 5 minutes, OpenAI 30 minutes); write+: Anthropic's "
        "1-hour, OpenAI's 12-hour write; -: no price of its own (billed as input, write+ as a write). The Batch API: "
        "half price. tiers: service tiers with their own price (prio = priority/fast); >N: every token of a request "
        "over N prompt tokens at a higher price. --json has them all, with aliases and each model's source page."
        + (f" Not shown at this width: {', '.join(hidden)} (a wider terminal, or --json, has them)." if hidden else ""),
        style="dim"), width=min(console.width, 120))
    if data["lanes"]:
        lanes = Table(title="lanes shorter than the Batch API's 24 h (a deadline takes the cheapest that fits)")
        for column in ("lane", "provider", "endpoints", "window", "discount", "source"):
            lanes.add_column(column, no_wrap=column != "source", overflow="fold")
        for lane in data["lanes"]:
            off = f"{lane['discount']:.0%}" if lane["discount"] is not None else f"the model's {lane['tier']} tier"
            lanes.add_row(lane["lane"], lane["provider"], ", ".join(lane["endpoints"]), lane["window"], off,
                          lane["source"])
        console.print(lanes)


def _width(console: Console, table: Table) -> int:
    """The width ``table`` takes with every cell whole."""
    return Measurement.get(console, console.options.update_width(100_000), table).maximum


def _table(data: dict[str, Any], rows: list[dict[str, str]], columns: list[str]) -> Table:
    title = (f"models, USD per 1M tokens, as priced on {data['priced_on']}"
             + (f" ({data['prices_file']} over the bundled catalog)" if data["prices_file"] else ""))
    table = Table(title=title, padding=(0, 1))
    for column in columns:
        table.add_column(column, justify="left" if column in ("model", "provider", "tiers", "shutdown") else "right",
                         no_wrap=True)
    for row in rows:
        table.add_row(*(row[column] for column in columns))
    return table


def _row(model: dict[str, Any]) -> dict[str, str]:
    """One model's cells, by column."""
    marked = set(model["secondary"]["fields"]) if model["secondary"] else set()

    def shown(key: str, fmt: Callable[[Any], str] = str, *, same_as: str | None = None) -> str:
        value = model[key]
        # A cache price equal to the input price is no price of its own: such tokens are billed as input.
        if value is None or (same_as is not None and value == model[same_as]):
            return "-"
        return fmt(value) + (SECONDARY_MARK if key in marked or key.removesuffix("_extended") in marked else "")

    status = model["shutdown"] or ""
    if model["status"] == "shut down":
        status = f"[red]{status} (past)[/]"
    elif model["status"] == "shutting down":
        status = f"[yellow]{status}[/]"
    tiers = [_TIER_SHORT.get(tier, tier) for tier in model["tiers"]]
    if model["long_prompt"]:
        tiers.append(">" + _tokens(model["long_prompt"]["above"]))
    tiers_marked = "tiers" in marked or "long_prompt" in marked or any(f.startswith("tiers.") for f in marked)
    return {
        "model": model["name"], "provider": model["provider"] or "-",
        "input": shown("input", _money), "cached": shown("cached_input", _money, same_as="input"),
        "write": shown("cache_write", _money, same_as="input"),
        "write+": shown("cache_write_extended", _money, same_as="cache_write"),
        "output": shown("output", _money, same_as="kind" if model["kind"] != "embedding" else "output"),
        "window": shown("context_window", _tokens), "max out": shown("max_output_tokens", _tokens),
        "tiers": ",".join(tiers) + (SECONDARY_MARK if tiers_marked and tiers else ""), "shutdown": status,
        "as of": model["prices_as_of"],
    }


_TIER_SHORT = {"priority": "prio", "ultrafast": "ultra"}


def _number(value: Decimal | None) -> float | None:
    return None if value is None else float(value)


def _plain(value: Any) -> Any:
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value


def _money(value: float) -> str:
    return f"${value:,.4f}".rstrip("0").rstrip(".") if value else "$0"


def _tokens(value: int) -> str:
    return f"{value // 1000:,}K" if value >= 10_000 and value % 1000 == 0 else f"{value:,}"
