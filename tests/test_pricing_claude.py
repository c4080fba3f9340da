"""Claude prices in the bundled table: cache reads and writes, the batch discount, dated snapshot names."""

from __future__ import annotations

import json
from decimal import Decimal
from importlib import resources

import pytest

from llm_dispatch import PriceTable, RowPricer, from_pico


@pytest.fixture(scope="module")
def table() -> PriceTable:
    return PriceTable.load()


def test_every_claude_entry_says_where_and_when_its_price_was_read() -> None:
    models = json.loads(resources.files("llm_dispatch").joinpath("prices.json").read_text())["models"]
    claude = {name: entry for name, entry in models.items() if name.startswith("claude-")}
    assert len(claude) >= 10
    for name, entry in claude.items():
        assert entry["source"].startswith("https://platform.claude.com/"), name
        assert entry["prices_as_of"] == "2026-11-25", name
        # Anthropic's 5-minute cache write is 1.25x input (Haiku 3's is listed as $0.30); a read costs at most 0.1x
        # input (the 5.x models read for less: Opus 5.5 and Sonnet 5.5 0.05x, Fable 5.1 0.025x). Fable 5.2 lists no
        # cache prices: its reads and writes count as input, never less.
        if name == "claude-3-haiku":
            continue
        if "cache_write" not in entry:
            assert "cached_input" not in entry and "no cache prices" in entry["source"], name
            continue
        assert Decimal(str(entry["cache_write"])) == Decimal(str(entry["input"])) * Decimal("1.25"), name
        assert Decimal(str(entry["cached_input"])) <= Decimal(str(entry["input"])) * Decimal("0.1"), name


@pytest.mark.parametrize(("snapshot", "model"), [
    ("claude-sonnet-4-5-20250929", "claude-sonnet-4-5"), ("claude-haiku-4-5-20251001", "claude-haiku-4-5"),
    ("claude-opus-4-1-20250805", "claude-opus-4-1"), ("claude-opus-4-20250514", "claude-opus-4"),
    ("claude-3-5-haiku-20241022", "claude-3-5-haiku"), ("claude-3-haiku-20240307", "claude-3-haiku"),
])
def test_dated_snapshot_names_resolve_to_their_model(table: PriceTable, snapshot: str, model: str) -> None:
    assert table.price_for(snapshot) == table.price_for(model) is not None
    assert table.limits_for(snapshot) == table.limits_for(model) is not None


def test_cache_reads_and_writes_are_priced_apart_and_batch_is_half(table: PriceTable) -> None:
    usage = {"prompt_tokens": 1_000_000, "completion_tokens": 100_000, "cached_tokens": 200_000,
             "cache_creation_tokens": 300_000}
    # claude-haiku-4-5: 500k uncached at $1, 200k read at $0.10, 300k written at $1.25, 100k out at $5.
    expected = Decimal("0.5") + Decimal("0.02") + Decimal("0.375") + Decimal("0.5")
    assert table.cost(model="claude-haiku-4-5", route="realtime", **usage) == expected
    assert table.cost(model="claude-haiku-4-5", route="batch", **usage) == expected / 2
    pricer = RowPricer(table)
    row = pricer.price(model="claude-haiku-4-5-20251001", route="batch", **usage)
    assert row is not None
    assert from_pico(row.cost) == expected / 2 and from_pico(row.list_cost) == expected and row.discount == "0.5"
    plain = pricer.price(model="gpt-4o-mini", route="realtime", prompt_tokens=10, completion_tokens=1)
    assert plain is not None and plain.cost == plain.list_cost


def test_cache_tokens_cannot_exceed_the_prompt(table: PriceTable) -> None:
    with pytest.raises(ValueError, match="cache_creation_tokens"):
        table.cost(model="claude-haiku-4-5", route="realtime", prompt_tokens=10, completion_tokens=0,
                   cached_tokens=6, cache_creation_tokens=6)
