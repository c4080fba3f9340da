"""The bundled model catalog as a user meets it: a cost for every model under each rule it has, checked against
arithmetic on the figures the catalog shows; figures a provider page gives spot-checked by hand; models past their
shutdown refused and those about to go warned of; ``llm-dispatch models``; a file in the first format still loads."""

from __future__ import annotations

import json
from datetime import date
from decimal import Decimal
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from llm_dispatch.cli.main import app
from llm_dispatch.core import InputError, PriceTable, ProviderTable, Settings, check_prompts, load_providers
from llm_dispatch.core.inputs._inputs import parse_prompt_dicts

M = 1_000_000
TODAY = date(2026, 11, 26)
CATALOG: dict[str, Any] = json.loads(resources.files("llm_dispatch.core").joinpath("prices.json").read_text(),
                                     parse_float=Decimal)
MODELS = CATALOG["models"]
# One request of every kind of token: 10,000 prompt tokens of which 2,000 cache reads and 3,000 cache writes (1,000
# of them for the longer duration), and 1,000 out.
USAGE = {"prompt_tokens": 10_000, "cached_tokens": 2_000, "cache_creation_tokens": 3_000,
         "cache_creation_extended_tokens": 1_000, "completion_tokens": 1_000}


@pytest.fixture(scope="module")
def table() -> PriceTable:
    return PriceTable.load(on=TODAY)


def by_hand(prices: dict[str, Any], usage: dict[str, int], *, scale: Decimal = Decimal(1)) -> Decimal:
    """Dollars for ``usage`` at ``prices`` (per 1M tokens), each kind of token at its own price; a cache price the
    entry does not give is the input price (an extended write, the default write's)."""
    read = prices.get("cached_input", prices["input"])
    write = prices.get("cache_write", prices["input"])
    extended = prices.get("cache_write_extended", write)
    uncached = usage["prompt_tokens"] - usage["cached_tokens"] - usage["cache_creation_tokens"]
    total = (uncached * prices["input"] + usage["cached_tokens"] * read
             + (usage["cache_creation_tokens"] - usage["cache_creation_extended_tokens"]) * write
             + usage["cache_creation_extended_tokens"] * extended + usage["completion_tokens"] * prices.get("output", 0))
    return total * scale / M


def now(name: str) -> dict[str, Any]:
    """The entry's prices with every change that took effect by today over them."""
    entry = dict(MODELS[name])
    for change in entry.get("changes", []):
        if date.fromisoformat(change["effective"]) <= TODAY:
            entry.update({key: value for key, value in change.items() if key not in ("effective", "tiers")})
    return entry


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_model_has_a_cost_under_each_of_its_rules(table: PriceTable, name: str) -> None:
    entry = now(name)
    discount = entry.get("batch_discount", CATALOG["batch_discount"])
    standard = by_hand(entry, USAGE)
    charged = table.price(model=name, route="realtime", **USAGE)
    assert charged is not None and charged.dollars == standard > 0 and charged.discount == "0"
    # The Batch API: the model's discount off every kind of token.
    batch = table.price(model=name, route="batch", **USAGE)
    assert (batch.dollars, batch.list_dollars, batch.discount) == (standard * (1 - discount), standard, str(discount))
    # Each service tier it lists: a discount (flex at the batch rate), a multiple (priority), or its own prices
    # (a cache price it does not give scales with its input price).
    for tier, rule in entry.get("tiers", {}).items():
        if "discount" in rule:
            expected = standard * (1 - rule["discount"])
        elif "multiplier" in rule:
            expected = standard * rule["multiplier"]
        else:
            scale = Decimal(rule["input"]) / Decimal(entry["input"])
            expected = by_hand({key: entry[key] * scale for key in ("input", "cached_input", "cache_write",
                                                                      "cache_write_extended") if key in entry}
                               | rule, USAGE)
        assert table.price(model=name, route="realtime", **USAGE, service_tier=tier).dollars == expected, tier
    # A request over its long-context threshold: every token at the long prices.
    long = entry.get("long_prompt")
    if long is not None:
        over = {**USAGE, "prompt_tokens": long["above"] + 1}
        assert table.price(model=name, route="realtime", **over).dollars == by_hand(long, over)
        assert table.price(model=name, route="batch", **over).dollars == by_hand(long, over) * (1 - discount)


# Figures as the provider's page prints them, and the sum worked out by hand.
@pytest.mark.parametrize(("model", "usage", "route", "tier", "expected"), [
    # gpt-6-luna: $0.10 in, $0.01 cached, $0.125 cache write, $0.50 out. 5,000 uncached x 0.10 + 2,000 read x 0.01
    # + 3,000 written x 0.125 + 1,000 out x 0.50 = 1,395 per 1M.
    ("gpt-6-luna", {**USAGE, "cache_creation_extended_tokens": 0}, "realtime", None, "0.001395"),
    # Anthropic 5-minute (1.25x) and 1-hour (2x) writes, Claude Opus 5.5: $4 in, $0.20 read, $5 / $8 written, $20 out:
    # 5,000 x 4 + 2,000 x 0.2 + 2,000 x 5 + 1,000 x 8 + 1,000 x 20 = 58,400 per 1M.
    ("claude-opus-5-5", USAGE, "realtime", None, "0.0584"),
    # OpenAI cache writes, gpt-6.1-terra ($1 in, $0.05 read, $1.25 written, $5 out), the 12-hour write at $2.50:
    # 5,000 + 100 + 2,500 + 2,500 + 5,000 = 15,100.
    ("gpt-6.1-terra", USAGE, "realtime", None, "0.0151"),
    # Long context, gpt-6.2-sol over 272K: $4 in and $15 out on all of it: 272,001 x 4 + 1,000 x 15.
    ("gpt-6.2-sol", {"prompt_tokens": 272_001, "completion_tokens": 1_000}, "realtime", None, "1.103004"),
    # Flex at the batch rate, gpt-6-luna: (100,000 x 0.10 + 100,000 x 0.50) / 2.
    ("gpt-6-luna", {"prompt_tokens": 100_000, "completion_tokens": 100_000}, "realtime", "flex", "0.03"),
    # Priority (Fast mode) at its own listed price, gpt-5.4: $5 in, $30 out.
    ("gpt-5.4", {"prompt_tokens": 100_000, "completion_tokens": 100_000}, "realtime", "fast", "3.5"),
    # Priority on a long gpt-5.4 request: its long prices (2x in, 1.5x out) times the priority factor (2x).
    ("gpt-5.4", {"prompt_tokens": 300_000, "completion_tokens": 10_000}, "realtime", "priority", "3.45"),
    # The Batch API, Claude Sonnet 5.5: half of 100,000 x $2 + 100,000 x $10.
    ("claude-sonnet-5-5", {"prompt_tokens": 100_000, "completion_tokens": 100_000}, "batch", None, "0.6"),
    # Claude Haiku 5.5 over 100,000 prompt tokens: every token 5x ($0.50 in, $2.50 out).
    ("claude-haiku-5-5", {"prompt_tokens": 100_001, "completion_tokens": 1_000}, "realtime", None, "0.0525005"),
    # Embeddings: input alone, text-embedding-3-small at $0.02.
    ("text-embedding-3-small", {"prompt_tokens": M, "completion_tokens": 0}, "realtime", None, "0.02"),
])
def test_provider_figures_by_hand(table: PriceTable, model: str, usage: dict[str, int], route: str,
                                  tier: str | None, expected: str) -> None:
    assert table.price(model=model, route=route, **usage, service_tier=tier).dollars == Decimal(expected)


def test_a_price_change_takes_effect_on_its_day() -> None:
    # gpt-5.6-sol: $5 / $30 at launch, $4 / $20 from 2026-08-21 (its cache write 1.25x input throughout).
    usage = {"model": "gpt-5.6-sol", "route": "realtime", "prompt_tokens": 100_000, "completion_tokens": 100_000}
    assert PriceTable.load(on=date(2026, 8, 20)).price(**usage).dollars == Decimal("3.5")
    assert PriceTable.load(on=date(2026, 8, 21)).price(**usage).dollars == Decimal("2.4")
    # Claude Sonnet 5.5's cache reads: $0.20, then $0.10 from 2026-10-07.
    read = {"model": "claude-sonnet-5-5", "route": "realtime", "prompt_tokens": M, "cached_tokens": M,
            "completion_tokens": 0}
    assert PriceTable.load(on=date(2026, 10, 6)).price(**read).dollars == Decimal("0.2")
    assert PriceTable.load(on=date(2026, 10, 7)).price(**read).dollars == Decimal("0.1")


def test_a_model_past_its_shutdown_is_refused_and_one_about_to_go_is_warned_of(table: PriceTable) -> None:
    # gpt-4.1-nano was shut down on 2026-10-23: one line naming the model, the day and what to do.
    with pytest.raises(InputError, match=r"gpt-4.1-nano was shut down on 2026-10-23 \(OpenAI no longer serves it\); "
                                         r"pick a current model") as info:
        parse_prompt_dicts([{"prompt": "hi", "model": "gpt-4.1-nano"}], default_model="gpt-6-luna", table=table)
    assert info.value.field == "model" and info.value.line == 1
    with pytest.raises(InputError, match="claude-opus-4-20250514 was shut down on 2026-06-15 \\(Anthropic"):
        parse_prompt_dicts([{"prompt": "hi", "model": "claude-opus-4-20250514"}], default_model="m", table=table)
    # gpt-5-mini goes on 2026-12-11: the check passes and says how many prompts use it and what replaces it.
    check = check_prompts([{"prompt": "a", "model": "gpt-5-mini"}, {"prompt": "b", "model": "gpt-5-mini"},
                           {"prompt": "c"}], default_model="gpt-6-luna", table=table, warn=False)
    [warning] = check.warnings
    assert warning.endswith(": 2 prompts use gpt-5-mini, which shuts down on 2026-12-11 (in 15 days); move them to "
                            "gpt-6.1-terra before then")
    # On its day it is refused.
    with pytest.raises(InputError, match="gpt-5-mini was shut down on 2026-12-11.*use gpt-6.1-terra instead"):
        parse_prompt_dicts([{"prompt": "hi", "model": "gpt-5-mini"}], default_model="m",
                           table=PriceTable.load(on=date(2026, 12, 11)))


def test_the_run_command_refuses_a_shut_down_model_before_anything_is_sent(tmp_path: Path) -> None:
    prompts = tmp_path / "old.jsonl"
    prompts.write_text(json.dumps({"id": "a", "prompt": "hi"}) + "\n" + json.dumps({"id": "b", "prompt": "hi",
                                                                                      "model": "o4-mini"}) + "\n")
    shown = CliRunner().invoke(app, ["run", str(prompts), "--simulate", "--database-url",
                                     f"sqlite+aiosqlite:///{tmp_path / 'x.db'}"])
    assert shown.exit_code == 2
    assert shown.output.strip().splitlines() == [
        f"error: {prompts}:2: o4-mini was shut down on 2026-10-23 (OpenAI no longer serves it); pick a current model "
        "(`llm-dispatch models` lists the catalog) (field 'model')"]
    assert not (tmp_path / "x.db").exists()


def test_the_default_model_and_the_examples_are_current(table: PriceTable) -> None:
    assert table.info_for(Settings().model).shutdown is None
    root = Path(__file__).resolve().parents[1] / "examples"
    # The mixed example names a declared host's models (examples/providers.toml): those are the file's, not the
    # catalog's.
    providers = ProviderTable(declared=load_providers(root / "providers.toml"))
    for path in sorted(root.glob("*.jsonl")):
        check = check_prompts(path, default_model=Settings().model, table=table, warn=False, model_providers=providers)
        assert not [w for w in check.warnings if "shuts down" in w], path
        for line in path.read_text().splitlines():
            model = json.loads(line).get("model", Settings().model)
            if providers.resolve(model).provider in providers.declared:
                continue
            assert table.info_for(model) is not None and table.info_for(model).shutdown is None, (path, model)


def test_the_models_command_lists_the_catalog(tmp_path: Path) -> None:
    shown = CliRunner().invoke(app, ["models", "--json"])
    assert shown.exit_code == 0, shown.output
    listed = {model["name"]: model for model in json.loads(shown.output)["models"]}
    assert set(listed) == set(MODELS)
    luna = listed["gpt-6-luna"]
    assert (luna["provider"], luna["input"], luna["cached_input"], luna["cache_write"], luna["output"],
            luna["context_window"], luna["max_output_tokens"], luna["shutdown"], luna["prices_as_of"]) == (
        "openai", 0.1, 0.01, 0.125, 0.5, 1_050_000, 128_000, None, "2026-11-26")
    assert luna["source"].startswith("https://developers.openai.com/") and luna["tiers"]["flex"] == {"discount": 0.5}
    assert listed["o1"]["status"] == "shut down" and listed["gpt-5"]["status"] == "shutting down"
    assert listed["gpt-5"]["replacement"] == "gpt-6.1-sol"
    assert "input" in listed["gpt-4o"]["secondary"]["fields"] and listed["gpt-4o"]["secondary"]["source"]
    table = CliRunner().invoke(app, ["models", "--provider", "anthropic"])
    assert table.exit_code == 0 and "claude-haiku-5-5" in table.output and "gpt-6-luna" not in table.output
    assert "2026-06-15 (past)" in table.output  # claude-opus-4
    # A price file over the bundled catalog: its model listed, marked as the user's.
    mine = tmp_path / "mine.json"
    mine.write_text(json.dumps({"models": {"my-vllm": {"input": 0, "output": 0, "context_window": 32768}}}))
    listed = {m["name"]: m for m in json.loads(CliRunner().invoke(app, ["models", "--json", "--prices-file", str(mine)])
                                               .output)["models"]}
    assert listed["my-vllm"]["from_prices_file"] and listed["my-vllm"]["source"] == str(mine)


# The first format of the table (prices.json as shipped before the catalog), as a user's file.
FIRST_FORMAT = {
    "prices_as_of": "2025-08-07", "source": "https://openai.com/api/pricing", "limits_as_of": "2026-11-23",
    "limits_source": "https://platform.openai.com/docs/models", "currency": "USD", "unit": "per 1M tokens",
    "batch_discount": 0.5,
    "models": {
        "gpt-4o": {"input": 2.50, "cached_input": 1.25, "output": 10.00, "context_window": 128000,
                   "max_output_tokens": 16384},
        "claude-haiku-5-5": {"input": 0.10, "cached_input": 0.01, "cache_write": 0.125, "output": 0.50,
                             "long_prompt": {"above": 100000, "input": 0.50, "cached_input": 0.05,
                                             "cache_write": 0.625, "output": 2.50},
                             "context_window": 1000000, "max_output_tokens": 128000, "prices_as_of": "2026-11-25",
                             "source": "https://platform.claude.com/docs/en/models/haiku-5-5/overview"},
        "my-vllm": {"input": 0, "output": 0, "context_window": 32768, "max_output_tokens": 4096},
    },
}


def test_a_price_file_in_the_first_format_still_loads_and_merges(tmp_path: Path) -> None:
    path = tmp_path / "old.json"
    path.write_text(json.dumps(FIRST_FORMAT))
    table = PriceTable.load(path=path, on=TODAY)
    assert (table.prices_as_of, table.prices_file) == ("2025-08-07", str(path))
    # Its gpt-4o replaces the bundled prices (and so their tiers), keeps the facts (the shutdown date).
    assert table.price(model="gpt-4o", route="realtime", prompt_tokens=M, completion_tokens=M).dollars == Decimal("12.5")
    assert table.price(model="gpt-4o", route="realtime", prompt_tokens=1, completion_tokens=1,
                       service_tier="priority") is None
    assert table.info_for("gpt-4o").shutdown == date(2027, 1, 14)
    # Its Haiku 5.5 has no 1-hour price: a 1-hour write costs what a 5-minute one does.
    assert table.price(model="claude-haiku-5-5", route="realtime", prompt_tokens=100, cache_creation_tokens=100,
                       cache_creation_extended_tokens=100, completion_tokens=0).dollars == Decimal("0.0000125")
    assert table.limits_for("my-vllm").context_window == 32768
    # Bundled models it does not name are as bundled.
    assert table.price_for("gpt-6-luna") == PriceTable.load(on=TODAY).price_for("gpt-6-luna")


@pytest.mark.parametrize("width", [80, 120, 200])
def test_the_models_table_shows_whole_cells_in_a_terminal_of_any_width(width: int) -> None:
    """Too narrow a terminal leaves columns out (and says which), never squeezes one into nothing or cuts a cell."""
    from io import StringIO

    from rich.console import Console

    from llm_dispatch.cli.catalog import catalog, print_catalog

    data = catalog(PriceTable.load())
    screen = StringIO()
    print_catalog(Console(file=screen, width=width, force_terminal=True, color_system=None), data)
    lines = screen.getvalue().splitlines()
    assert max(len(line) for line in lines) <= width
    assert not [line for line in lines if "…" in line]
    header = next(line for line in lines if "model" in line and "input" in line)
    assert "output" in header and "┃┃" not in header and "┃ ┃" not in header  # no column squeezed to nothing
    assert "gpt-5.4-mini" in screen.getvalue() and "$0.075*" in screen.getvalue()
    assert ("Not shown at this width" in screen.getvalue()) == (width < 160)


def test_the_models_table_piped_keeps_every_column_and_cell_whole() -> None:
    from io import StringIO

    from rich.console import Console

    from llm_dispatch.cli.catalog import catalog, print_catalog

    piped = StringIO()
    print_catalog(Console(file=piped, width=160, force_terminal=False), catalog(PriceTable.load()))
    text = piped.getvalue()
    assert "…" not in text and "Not shown" not in text
    header = next(line for line in text.splitlines() if "model" in line and "input" in line)
    assert all(column in header for column in ("provider", "write+", "tiers", "shutdown", "as of"))
