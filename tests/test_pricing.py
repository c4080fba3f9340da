"""Costs come out exact from the bundled price table (or the user's overrides); unknown models cost None."""

from __future__ import annotations

import json
from dataclasses import replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from llm_dispatch.core import PICO_PER_USD, ChatRequest, Charge, ConfigError, from_pico
from llm_dispatch.core.pricing._costs import CostEstimate, CostTotals, estimate_request_cost, expected_reply_tokens
from llm_dispatch.core.pricing._pricing import ModelLimits, ModelPrice, PriceTable
from llm_dispatch.core.pricing._tokens import estimate_prompt_tokens

M = 1_000_000


@pytest.fixture(scope="module")
def table() -> PriceTable:
    return PriceTable.load()


def dollars(table: PriceTable, **usage: Any) -> Decimal | None:
    """What the one formula charges for ``usage``, in dollars."""
    charge = table.price(**usage)
    return None if charge is None else charge.dollars


def write_prices(tmp_path: Path, data: Any) -> Path:
    path = tmp_path / "my-prices.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    return path


def test_bundled_table_says_where_and_when_prices_are_from(table: PriceTable) -> None:
    assert (table.prices_as_of, table.currency) == ("2026-11-26", "USD")
    assert "developers.openai.com" in table.source and "platform.claude.com" in table.source
    assert table.price_for("gpt-4o-mini") == ModelPrice(
        input=Decimal("0.15"), cached_input=Decimal("0.075"), output=Decimal("0.60"), batch_discount=Decimal("0.5"),
        tiers=table.price_for("gpt-4o-mini").tiers)
    assert {"gpt-6.2-astra", "gpt-6.2-sol", "gpt-6.1-sol", "gpt-6.1-terra", "gpt-6-astra", "gpt-6-sol", "gpt-6-luna",
            "gpt-5.6-sol", "gpt-5.6-terra", "gpt-5.6-luna", "gpt-5.5", "gpt-5.4", "gpt-5.4-mini", "gpt-5.4-nano",
            "gpt-5.2", "gpt-5.1", "gpt-5", "gpt-5-mini", "gpt-5-nano", "gpt-4.1", "gpt-4o", "gpt-4o-mini", "o3",
            "text-embedding-3-small", "text-embedding-3-large"} <= set(table.models)


def test_bundled_table_has_each_models_window_and_maximum_output_with_their_date(table: PriceTable) -> None:
    assert table.limits_as_of == "2026-11-26"
    chat = {name for name, info in table.info.items() if info.kind == "chat"}
    assert chat <= set(table.limits)
    assert table.limits_for("gpt-4o") == ModelLimits(context_window=128_000, max_output_tokens=16_384)
    assert table.limits_for("gpt-6.2-sol") == ModelLimits(context_window=1_050_000, max_input_tokens=922_000,
                                                          max_output_tokens=128_000)
    assert table.limits_for("o3") == ModelLimits(context_window=200_000, max_output_tokens=100_000)
    assert table.limits_for("gpt-5-mini") == ModelLimits(context_window=400_000, max_input_tokens=272_000,
                                                         max_output_tokens=128_000)
    # The finding, on Anthropic's own page: Sonnet 4.6 answers up to 128K tokens, not 64K.
    assert table.limits_for("claude-sonnet-4-6") == ModelLimits(context_window=1_000_000, max_output_tokens=128_000)
    assert table.limits_for("gpt-4o-mini-2024-07-18") == table.limits_for("gpt-4o-mini")
    assert table.limits_for("llama3.1") is None


def test_user_file_adds_windows_and_a_repriced_model_keeps_its_own(tmp_path: Path) -> None:
    path = write_prices(tmp_path, {
        "limits_as_of": "2026-01-02",
        "models": {
            "gpt-4o": {"input": 2, "output": 8},
            "my-vllm": {"input": 0, "output": 0, "context_window": 8192, "max_output_tokens": 2048},
            "gpt-4.1": {"input": 2, "output": 8, "max_output_tokens": 1000},
            "no-limits": {"input": 1, "output": 1},
        },
    })
    table = PriceTable.load(path=path)
    assert table.limits_as_of == "2026-01-02"
    assert table.limits_for("gpt-4o") == ModelLimits(context_window=128_000, max_output_tokens=16_384)
    assert table.limits_for("my-vllm") == ModelLimits(context_window=8192, max_output_tokens=2048)
    assert table.limits_for("gpt-4.1") == ModelLimits(context_window=1_047_576, max_output_tokens=1000)
    assert table.limits_for("no-limits") is None


# Hand-computed: (prompt - cached) * input + cached * cached_input + completion * output, per 1M tokens.
@pytest.mark.parametrize(
    ("model", "route", "prompt", "cached", "completion", "expected"),
    [
        ("gpt-4o-mini", "realtime", M, 200_000, 500_000, "0.435"),  # 0.8*0.15 + 0.2*0.075 + 0.5*0.60
        ("gpt-4o-mini", "batch", M, 200_000, 500_000, "0.2175"),
        ("gpt-4o", "realtime", 2 * M, 0, M, "15"),  # 2*2.50 + 1*10
        ("gpt-5-nano", "realtime", 1000, 1000, 1000, "0.000405"),  # 0.001*0.005 + 0.001*0.40
        ("o4-mini", "batch", 3 * M, M, 0, "1.2375"),  # (2*1.10 + 1*0.275) / 2
        ("gpt-4.1", "realtime", 0, 0, 0, "0"),
    ],
)
def test_cost_matches_hand_computed_table(table: PriceTable, model: str, route: str, prompt: int, cached: int,
                                          completion: int, expected: str) -> None:
    cost = dollars(table, model=model, route=route, prompt_tokens=prompt, cached_tokens=cached,
                   completion_tokens=completion)
    assert cost == Decimal(expected)
    assert isinstance(cost, Decimal)


def test_unknown_model_has_no_cost_not_zero(table: PriceTable) -> None:
    assert table.price_for("my-finetune") is None
    assert table.price(model="my-finetune", route="realtime", prompt_tokens=10, completion_tokens=10) is None


@pytest.mark.parametrize(
    ("name", "base"),
    [("gpt-4o-mini-2024-07-18", "gpt-4o-mini"), ("gpt-4o-2024-08-06", "gpt-4o"), ("gpt-4.1-nano-0125", "gpt-4.1-nano"),
     ("gpt-5", "gpt-5"), ("gpt-6.1-sol-2026-09-29", "gpt-6.1-sol"), ("gpt-5.6", "gpt-5.6-sol")],
)
def test_dated_snapshot_names_use_their_model_price(table: PriceTable, name: str, base: str) -> None:
    assert table.price_for(name) == table.price_for(base)


def test_snapshot_of_an_unknown_model_is_unknown(table: PriceTable) -> None:
    assert table.price_for("gpt-3.5-turbo-0125") is None
    assert table.price_for("gpt-4o-mini-preview") is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"prompt_tokens": -1}, "prompt_tokens must be >= 0, got -1"),
        ({"completion_tokens": -1}, "completion_tokens must be >= 0"),
        ({"cached_tokens": -1}, "cached_tokens must be >= 0"),
        ({"route": "express"}, "route 'express' is unknown"),  # flex is a lane now
    ],
)
def test_impossible_usage_is_refused(table: PriceTable, kwargs: dict[str, Any], message: str) -> None:
    usage: dict[str, Any] = {"model": "gpt-4o", "route": "realtime", "prompt_tokens": 10, "completion_tokens": 0,
                             **kwargs}
    with pytest.raises(ValueError, match=message):
        table.price(**usage)


def test_user_file_overrides_and_adds_models(tmp_path: Path) -> None:
    path = write_prices(tmp_path, {
        "prices_as_of": "2025-09-01",
        "batch_discount": 0.25,
        "models": {
            "gpt-4o": {"input": 2, "cached_input": 1, "output": 8},
            "my-finetune": {"input": 3, "output": 12, "batch_discount": 0},
        },
    })
    table = PriceTable.load(path=path)
    assert table.prices_as_of == "2025-09-01" and table.currency == "USD"
    # Overridden model, user's global discount: (2 + 8) * 0.75.
    assert dollars(table, model="gpt-4o", route="batch", prompt_tokens=M, completion_tokens=M) == Decimal("7.5")
    # New model without cached_input: cached tokens cost the input price; its own discount of 0.
    assert dollars(table, model="my-finetune", route="batch", prompt_tokens=M, cached_tokens=M,
                   completion_tokens=0) == Decimal(3)
    # Untouched bundled model picks up the user's global discount.
    assert dollars(table, model="gpt-4o-mini", route="batch", prompt_tokens=M, completion_tokens=0) == Decimal("0.1125")
    # The bundled table itself is unchanged.
    assert dollars(PriceTable.load(), model="gpt-4o", route="batch", prompt_tokens=M, completion_tokens=M) == Decimal("6.25")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"models": {"gpt-4o": {"input": "cheap", "output": 1}}},
         "field 'models.gpt-4o.input' must be a number >= 0 (price per 1M tokens), got \"cheap\""),
        ({"models": {"gpt-4o": {"input": -1, "output": 1}}}, "field 'models.gpt-4o.input' must be a number >= 0"),
        ({"models": {"gpt-4o": {"input": 1}}}, "field 'models.gpt-4o.output' is missing"),
        ({"models": {"gpt-4o": {"input": 1, "output": 1, "ouput": 2}}}, "field 'models.gpt-4o.ouput' is unknown"),
        ({"models": {"gpt-4o": 2.5}}, "field 'models.gpt-4o' must be an object"),
        ({"models": []}, "field 'models' must be an object"),
        ({"batch_discount": 1.5}, "field 'batch_discount' must be a fraction from 0 to 1 (0.5 = half price), got 1.5"),
        ({"models": {"x": {"input": 1, "output": 1, "batch_discount": True}}}, "field 'models.x.batch_discount'"),
        ({"prices_as_of": "last week"}, "field 'prices_as_of' must be a date like 2025-08-07"),
        ({"limits_as_of": 2026}, "field 'limits_as_of' must be a date like 2025-08-07"),
        ({"models": {"x": {"input": 1, "output": 1, "context_window": "128k"}}},
         "field 'models.x.context_window' must be a whole number of tokens >= 1, got \"128k\""),
        ({"models": {"x": {"input": 1, "output": 1, "max_output_tokens": 0}}},
         "field 'models.x.max_output_tokens' must be a whole number of tokens >= 1, got 0"),
        ({"models": {"x": {"input": 1, "output": 1, "max_output_tokens": 4096.5}}}, "got 4096.5"),
        ({"currency": "EUR"}, "field 'currency' is 'EUR' but prices must be 'USD'"),
        ({"modles": {}}, "field 'modles' is unknown"),
        ([1, 2], "expected a JSON object with a 'models' object, got list"),
        ('{"models": {', "invalid JSON"),
    ],
)
def test_malformed_user_file_names_file_and_field(tmp_path: Path, data: Any, message: str) -> None:
    path = write_prices(tmp_path, data)
    with pytest.raises(ConfigError) as info:
        PriceTable.load(path=path)
    assert str(info.value).startswith(f"price file {path}: ")
    assert message in str(info.value)


def test_missing_user_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        PriceTable.load(path=tmp_path / "nope.json")


def test_expected_reply_under_a_cap_follows_the_exponential_tail() -> None:
    assert expected_reply_tokens(typical=100, cap=None) == 100
    assert expected_reply_tokens(typical=100, cap=100) == pytest.approx(63.21, abs=0.01)  # 1 - 1/e
    assert expected_reply_tokens(typical=100, cap=300) == pytest.approx(95.02, abs=0.01)  # 1 - e^-3
    assert expected_reply_tokens(typical=100, cap=1) == pytest.approx(1.0, abs=0.01)  # a tiny cap is nearly always hit
    assert expected_reply_tokens(typical=0, cap=50) == 0


def test_estimate_uses_prompt_estimate_and_reply_cap(table: PriceTable) -> None:
    messages = [{"role": "user", "content": "What is the capital of Australia?"}]
    capped = ChatRequest(model="gpt-4o-mini", messages=messages, params={"max_tokens": 120})
    estimate = estimate_request_cost(request=capped, route="realtime", table=table, typical_completion_tokens=300)
    prompt = estimate_prompt_tokens(messages)
    # 300 x (1 - e^(-120/300)) = 98.90: a cap well under the typical length is what most replies hit.
    assert estimate == CostEstimate(
        prompt_tokens=prompt, completion_tokens=99,
        cost=(prompt * Decimal("0.15") + 99 * Decimal("0.60")) / M,
        max_completion_tokens=120, max_cost=(prompt * Decimal("0.15") + 120 * Decimal("0.60")) / M,
    )
    # A cap above the typical length: 80 x (1 - e^(-1.5)) = 62.15 expected, the cap bounds the cost.
    loose = estimate_request_cost(request=capped, route="realtime", table=table, typical_completion_tokens=80)
    assert (loose.completion_tokens, loose.max_completion_tokens) == (62, 120)
    assert loose.cost == (prompt * Decimal("0.15") + 62 * Decimal("0.60")) / M
    assert loose.max_cost == estimate.max_cost
    newer = ChatRequest(model="gpt-4o-mini", messages=messages, params={"max_completion_tokens": 50})
    # 300 x (1 - e^(-1/6)) = 46.06
    assert estimate_request_cost(request=newer, route="batch", table=table,
                                 typical_completion_tokens=300).completion_tokens == 46
    uncapped = ChatRequest(model="gpt-4o-mini", messages=messages)
    typical = estimate_request_cost(request=uncapped, route="batch", table=table, typical_completion_tokens=300)
    assert (typical.prompt_tokens, typical.completion_tokens) == (prompt, 300)
    assert typical.cost == (prompt * Decimal("0.15") + 300 * Decimal("0.60")) / M / 2


def test_the_bound_is_the_cap_else_the_models_maximum_output_else_none(table: PriceTable) -> None:
    messages = [{"role": "user", "content": "Summarise the history of Rome."}]
    prompt = estimate_prompt_tokens(messages)
    # No max_tokens: a gpt-4o reply may run to its maximum output, 16,384 tokens, not the typical 100.
    uncapped = estimate_request_cost(request=ChatRequest(model="gpt-4o", messages=messages), route="realtime",
                                     table=table, typical_completion_tokens=100)
    assert uncapped.completion_tokens == 100 and uncapped.max_completion_tokens == 16_384
    assert uncapped.max_cost == (prompt * Decimal("2.50") + 16_384 * Decimal("10.00")) / M
    # A cap above the model's maximum cannot be reached: the maximum bounds it.
    over = estimate_request_cost(request=ChatRequest(model="gpt-4o", messages=messages,
                                                     params={"max_completion_tokens": 50_000}),
                                 route="batch", table=table, typical_completion_tokens=100)
    assert over.max_completion_tokens == 16_384
    assert over.max_cost == (prompt * Decimal("2.50") + 16_384 * Decimal("10.00")) / M / 2
    # A model whose maximum output is unknown: no bound without max_tokens, though it has a price.
    priced = PriceTable(prices_as_of="2025-08-07", source="test", currency="USD",
                        models={"my-model": ModelPrice(input=Decimal(1), cached_input=Decimal(1), output=Decimal(2),
                                                       batch_discount=Decimal("0.5"))})
    unbounded = estimate_request_cost(request=ChatRequest(model="my-model", messages=messages), route="realtime",
                                      table=priced, typical_completion_tokens=100)
    assert unbounded.cost == (prompt + 200) / Decimal(M)
    assert unbounded.max_completion_tokens is None and unbounded.max_cost is None
    capped = estimate_request_cost(request=ChatRequest(model="my-model", messages=messages, params={"max_tokens": 10}),
                                   route="realtime", table=priced, typical_completion_tokens=100)
    assert capped.max_cost == (prompt + 20) / Decimal(M)


def test_estimate_counts_tools_as_input_and_unknown_model_as_none(table: PriceTable) -> None:
    messages = [{"role": "user", "content": "hi"}]
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    plain = estimate_request_cost(request=ChatRequest(model="x", messages=messages), route="realtime", table=table,
                                  typical_completion_tokens=10)
    with_tools = estimate_request_cost(request=ChatRequest(model="x", messages=messages, params={"tools": tools}),
                                       route="realtime", table=table, typical_completion_tokens=10)
    assert with_tools.prompt_tokens > plain.prompt_tokens
    assert plain.cost is None and with_tools.cost is None


def test_totals_track_known_cost_unpriced_models_and_savings(table: PriceTable) -> None:
    totals = CostTotals(table=table)
    assert totals.add(model="gpt-4o-mini", route="realtime", prompt_tokens=M, cached_tokens=200_000,
                      completion_tokens=500_000) == Decimal("0.435")
    assert totals.add(model="gpt-4o-mini-2024-07-18", route="batch", prompt_tokens=M, cached_tokens=200_000,
                      completion_tokens=500_000) == Decimal("0.2175")
    assert totals.add(model="gpt-4o", route="batch", prompt_tokens=2 * M, completion_tokens=M) == Decimal("7.5")
    assert totals.add(model="mystery", route="batch", prompt_tokens=M, completion_tokens=M) is None
    assert totals.add(model="mystery", route="realtime", prompt_tokens=5, completion_tokens=5) is None

    assert (totals.realtime.prompts, totals.realtime.cost, totals.realtime.unpriced) == (2, Decimal("0.435"), 1)
    assert (totals.batch.prompts, totals.batch.cost, totals.batch.unpriced) == (3, Decimal("7.7175"), 1)
    assert totals.batch.prompt_tokens == 4 * M and totals.batch.cached_tokens == 200_000
    assert totals.cost == Decimal("8.1525")
    assert totals.unpriced == 2 and totals.unpriced_models == {"mystery": 2}
    # Batch at real-time prices: 0.435 + 15 = 15.435; it cost 7.7175.
    assert totals.savings == Decimal("7.7175")


def test_the_formula_stores_whole_picodollars_with_the_discount_and_list_price() -> None:
    table = PriceTable.load()
    # gpt-5-nano's cached input on the Batch API is 2.5 nanodollars a token: whole picodollars, exact.
    batch = table.price(model="gpt-5-nano-2025-08-07", route="batch", prompt_tokens=3, completion_tokens=1,
                        cached_tokens=3)
    assert batch == Charge(cost=7_500 + 200_000, list_cost=15_000 + 400_000, discount="0.5")
    assert batch.dollars * PICO_PER_USD == batch.cost
    realtime = table.price(model="gpt-4o-mini", route="realtime", prompt_tokens=10, completion_tokens=5)
    assert realtime == Charge(cost=4_500_000, list_cost=4_500_000, discount="0")
    assert table.price(model="mystery", route="realtime", prompt_tokens=1, completion_tokens=1) is None

    # A price finer than a picodollar a token is rounded half-even per charge, not truncated.
    fine = replace(table, models={"m": ModelPrice(input=Decimal("0.0000005"), cached_input=Decimal(0),
                                                  output=Decimal(0), batch_discount=Decimal("0.5"))})
    assert fine.price(model="m", route="realtime", prompt_tokens=3, completion_tokens=0).cost == 2
    assert from_pico(1_387_500) == Decimal("0.0000013875")


def test_cache_use_a_provider_reports_beyond_the_prompt_is_counted_as_far_as_the_prompt_goes() -> None:
    # Usage the ledger stores is never refused when repriced: reads past the prompt count as the whole prompt
    # read, writes past what is left as the rest written.
    table = PriceTable.load()
    over = table.price(model="gpt-4o-mini", route="realtime", prompt_tokens=10, cached_tokens=11, completion_tokens=0)
    assert over == table.price(model="gpt-4o-mini", route="realtime", prompt_tokens=10, cached_tokens=10,
                               completion_tokens=0)
    assert over.cost == 10 * 75_000
    both = table.price(model="claude-haiku-4-5", route="realtime", prompt_tokens=10, completion_tokens=0,
                       cached_tokens=6, cache_creation_tokens=6)
    assert both.cost == 6 * 100_000 + 4 * 1_250_000
