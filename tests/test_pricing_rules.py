"""Each pricing rule through the one formula, against hand arithmetic: cache writes by duration (Anthropic's 5-minute
and 1-hour, OpenAI's), the long-context tier, service tiers (flex, priority, a provider's own), the Batch API, price
changes by date; the usage fields that carry them read from real answers, stored with each row, repriced."""

from __future__ import annotations

import json
import re
from datetime import date
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from conftest import Sim, rows
from llm_dispatch.core import to_json
from llm_dispatch import storage
from llm_dispatch.core import ChatRequest, ChatResult, ConfigError, PriceTable, estimate_request_cost
from llm_dispatch.core.wire._anthropic_answers import parse_message
from llm_dispatch.core.wire._responses import parse_chat

M = 1_000_000
# Two models written as a price file would give them; the figures are those of the provider pages they stand for
# (gpt-6.2-sol's and a Claude model's), so the arithmetic below is the arithmetic of those pages.
RULES: dict[str, Any] = {"models": {
    "rule-openai": {
        "provider": "openai", "input": 2, "cached_input": 0.1, "cache_write": 2.5, "cache_write_extended": 5,
        "output": 10, "context_window": 1_050_000, "max_input_tokens": 922_000, "max_output_tokens": 128_000,
        "long_prompt": {"above": 272_000, "input": 4, "cached_input": 0.2, "cache_write": 5, "cache_write_extended": 10,
                        "output": 15},
        "tiers": {"flex": {"discount": 0.5}, "priority": {"multiplier": 2}, "ultrafast": {"multiplier": 3}},
        "changes": [{"effective": "2027-03-01", "tiers": {"ultrafast": {"multiplier": 6}}},
                    {"effective": "2026-12-01", "input": 3}],
    },
    "rule-claude": {
        "provider": "anthropic", "input": 1, "cached_input": 0.1, "cache_write": 1.25, "cache_write_extended": 2,
        "output": 5, "context_window": 200_000, "max_output_tokens": 64_000,
        "tiers": {"fast": {"input": 2, "output": 10}},
    },
}}
TODAY = date(2026, 11, 26)


@pytest.fixture(scope="module")
def prices_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("rules") / "rules.json"
    path.write_text(json.dumps(RULES), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def table(prices_file: Path) -> PriceTable:
    return PriceTable.load(path=prices_file, on=TODAY)


def dollars(table: PriceTable, **usage: Any) -> Decimal | None:
    charge = table.price(**usage)
    return None if charge is None else charge.dollars


def test_anthropic_cache_writes_cost_by_duration(table: PriceTable) -> None:
    usage = {"prompt_tokens": M, "cached_tokens": 200_000, "cache_creation_tokens": 700_000,
             "cache_creation_extended_tokens": 400_000, "completion_tokens": 100_000}
    # 100k uncached at $1, 200k read at $0.10, 300k written for 5 minutes at $1.25, 400k for 1 hour at $2, 100k out
    # at $5: 0.1 + 0.02 + 0.375 + 0.8 + 0.5.
    assert dollars(table, model="rule-claude", route="realtime", **usage) == Decimal("1.795")
    assert dollars(table, model="rule-claude", route="batch", **usage) == Decimal("0.8975")
    # The same writes all for 5 minutes: 700k at $1.25.
    five = {**usage, "cache_creation_extended_tokens": 0}
    assert dollars(table, model="rule-claude", route="realtime", **five) == Decimal("1.495")


def test_openai_cache_writes_cost_their_price_and_reads_theirs(table: PriceTable) -> None:
    # 4,000 uncached at $2, 2,000 read at $0.10, 4,000 written at $2.50 (30 minutes), 1,000 out at $10.
    assert dollars(table, model="rule-openai", route="realtime", prompt_tokens=10_000, cached_tokens=2_000,
                   cache_creation_tokens=4_000, completion_tokens=1_000) == Decimal("0.0282")


def test_a_request_over_272k_input_tokens_pays_2x_input_and_1_5x_output_on_all_of_it(table: PriceTable) -> None:
    at = dollars(table, model="rule-openai", route="realtime", prompt_tokens=272_000, completion_tokens=1_000)
    over = dollars(table, model="rule-openai", route="realtime", prompt_tokens=272_001, completion_tokens=1_000)
    assert at == Decimal("0.554")  # 272,000 x $2 + 1,000 x $10
    assert over == Decimal("1.103004")  # 272,001 x $4 + 1,000 x $15
    # Cache reads and writes of a long request double too: 100k read at $0.20, 100k written at $5.
    assert dollars(table, model="rule-openai", route="realtime", prompt_tokens=300_000, cached_tokens=100_000,
                   cache_creation_tokens=100_000, completion_tokens=0) == Decimal("0.92")
    # On the Batch API, half of the long price.
    assert dollars(table, model="rule-openai", route="batch", prompt_tokens=272_001,
                   completion_tokens=1_000) == over / 2


def test_the_tier_the_answer_reports_sets_the_price(table: PriceTable) -> None:
    usage = {"model": "rule-openai", "prompt_tokens": 100_000, "completion_tokens": 100_000}
    standard = table.price(route="realtime", **usage, service_tier="default")
    flex = table.price(route="realtime", **usage, service_tier="flex")
    priority = table.price(route="realtime", **usage, service_tier="priority")
    # 100,000 in at $2 and 100,000 out at $10.
    assert (standard.dollars, standard.discount) == (Decimal("1.2"), "0")
    # Flex at the batch rate: half, with the list price beside it.
    assert (flex.dollars, flex.list_dollars, flex.discount) == (Decimal("0.6"), Decimal("1.2"), "0.5")
    # Priority (OpenAI's Fast mode; a request may say either word) at twice the standard price.
    assert priority.dollars == Decimal("2.4") and priority.list_dollars == Decimal("1.2")
    assert table.price(route="realtime", **usage, service_tier="fast") == priority
    assert table.price(route="realtime", **usage, service_tier="auto") == standard
    # Priority on a long request: twice the long price, 2 x (300,000 x $4 + 1,000 x $15).
    assert dollars(table, model="rule-openai", route="realtime", prompt_tokens=300_000, completion_tokens=1_000,
                   service_tier="priority") == Decimal("2.43")
    # The Batch API has its own rate whatever tier a line reports; a tier the model has no price for is unknown.
    assert dollars(table, route="batch", **usage, service_tier="priority") == Decimal("0.6")
    assert table.price(route="realtime", **usage, service_tier="scale") is None


def test_a_tier_with_its_own_prices_scales_the_cache_prices_with_its_input(table: PriceTable) -> None:
    # Anthropic's fast mode at $2 in / $10 out: cache reads at 2 x $0.10, 5-minute writes at 2 x $1.25.
    assert dollars(table, model="rule-claude", route="realtime", prompt_tokens=300_000, cached_tokens=100_000,
                   cache_creation_tokens=100_000, completion_tokens=10_000, service_tier="fast") == (
        Decimal("0.2") + Decimal("0.02") + Decimal("0.25") + Decimal("0.1"))
    # Anthropic's Priority Tier has no per-token price: unknown, never a guess.
    assert table.price(model="rule-claude", route="realtime", prompt_tokens=1, completion_tokens=1,
                       service_tier="priority") is None


def test_price_changes_take_effect_on_their_day(prices_file: Path) -> None:
    usage = {"model": "rule-openai", "route": "realtime", "prompt_tokens": 100_000, "completion_tokens": 0}
    assert dollars(PriceTable.load(path=prices_file, on=date(2026, 11, 30)), **usage) == Decimal("0.2")
    assert dollars(PriceTable.load(path=prices_file, on=date(2026, 12, 1)), **usage) == Decimal("0.3")
    # Ultrafast: 3x the standard rate through 2027-02-28, 6x from 2027-03-01 (on the new $3 input).
    ultra = {**usage, "service_tier": "ultrafast"}
    assert dollars(PriceTable.load(path=prices_file, on=date(2027, 2, 28)), **ultra) == Decimal("0.9")
    assert dollars(PriceTable.load(path=prices_file, on=date(2027, 3, 1)), **ultra) == Decimal("1.8")
    changes = PriceTable.load(path=prices_file, on=TODAY).info_for("rule-openai").changes
    assert [day.isoformat() for day, _ in changes] == ["2026-12-01", "2027-03-01"]


def test_the_estimate_prices_the_tier_a_request_asks_for(table: PriceTable) -> None:
    messages = [{"role": "user", "content": "Summarise the history of Rome."}]
    asked = {name: estimate_request_cost(request=ChatRequest(model="rule-openai", messages=messages,
                                                             params={"max_completion_tokens": 100, **tier}),
                                         route="realtime", table=table, typical_completion_tokens=100)
             for name, tier in (("standard", {}), ("flex", {"service_tier": "flex"}),
                                ("fast", {"service_tier": "fast"}))}
    assert asked["flex"].cost == asked["standard"].cost / 2 and asked["fast"].cost == asked["standard"].cost * 2
    # The worst case at the tier too: every prompt token as a cache write ($2.50, OpenAI caches by itself), the
    # whole cap out.
    prompt = asked["fast"].prompt_tokens
    assert asked["fast"].max_cost == 2 * (prompt * Decimal("2.5") + 100 * Decimal(10)) / M
    fast = estimate_request_cost(request=ChatRequest(model="rule-claude", messages=messages,
                                                     params={"max_tokens": 100, "speed": "fast"}),
                                 route="realtime", table=table, typical_completion_tokens=100)
    assert fast.max_cost == (prompt * Decimal(2) + 100 * Decimal(10)) / M


@pytest.mark.parametrize(("tiers", "field"), [
    ({"flex": {"discount": 0.5, "multiplier": 2}}, "models.m.tiers.flex"),
    ({"flex": {"discount": 0.5, "input": 1, "output": 1}}, "models.m.tiers.flex"),
    ({"priority": {"multiplier": 0}}, "models.m.tiers.priority.multiplier"),
    ({"priority": {"input": 1}}, "models.m.tiers.priority.output"),
    ({"priority": {"speed": 2}}, "models.m.tiers.priority.speed"),
    ([1], "models.m.tiers"),
])
def test_a_bad_tier_is_refused_with_its_field(tmp_path: Path, tiers: object, field: str) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"models": {"m": {"input": 1, "output": 2, "tiers": tiers}}}))
    with pytest.raises(ConfigError, match=f"field '{field}'"):
        PriceTable.load(path=path)


@pytest.mark.parametrize(("changes", "field"), [
    ([{"input": 1}], "models.m.changes[0].effective"),
    ([{"effective": "soon", "input": 1}], "models.m.changes[0].effective"),
    ([{"effective": "2027-01-01"}], "models.m.changes[0]"),
    ({"effective": "2027-01-01"}, "models.m.changes"),
])
def test_a_bad_price_change_is_refused_with_its_field(tmp_path: Path, changes: object, field: str) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"models": {"m": {"input": 1, "output": 2, "changes": changes}}}))
    with pytest.raises(ConfigError, match=f"field '{re.escape(field)}'"):
        PriceTable.load(path=path)


def test_openai_usage_fields_are_read_from_the_answer() -> None:
    body = {"id": "chatcmpl-1", "model": "gpt-6-luna", "service_tier": "flex",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5_000, "completion_tokens": 700, "total_tokens": 5_700,
                      "prompt_tokens_details": {"cached_tokens": 1_024, "cache_write_tokens": 2_048},
                      "completion_tokens_details": {"reasoning_tokens": 512}}}
    result = parse_chat(httpx.Response(200, json=body)).result
    assert (result.prompt_tokens, result.cached_tokens, result.cache_creation_tokens, result.reasoning_tokens,
            result.service_tier) == (5_000, 1_024, 2_048, 512, "flex")


def test_anthropic_usage_fields_are_read_from_the_answer() -> None:
    body = {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-opus-5-5",
            "content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn",
            "usage": {"input_tokens": 100, "cache_read_input_tokens": 200, "cache_creation_input_tokens": 300,
                      "cache_creation": {"ephemeral_5m_input_tokens": 100, "ephemeral_1h_input_tokens": 200},
                      "output_tokens": 50, "output_tokens_details": {"thinking_tokens": 30},
                      "service_tier": "standard", "speed": "fast"}}
    result = parse_message(httpx.Response(200, json=body)).result
    assert (result.prompt_tokens, result.cached_tokens, result.cache_creation_tokens,
            result.cache_creation_extended_tokens, result.reasoning_tokens, result.service_tier) == (
        600, 200, 300, 200, 30, "fast")


def answer(**usage: Any) -> ChatResult:
    return ChatResult(text="x", finish_reason="stop", model=None, response_id="r", latency_s=0.1,
                      **{"cached_tokens": 0, **usage})


async def test_each_stored_cost_follows_its_answers_tier_and_cache_writes_and_reprice_shows_what_ifs(
    tmp_path: Path, table: PriceTable
) -> None:
    from llm_dispatch.jobs import reprice

    engine = storage.create_engine(f"sqlite+aiosqlite:///{tmp_path / 'rules.db'}")
    await storage.migrate(engine)
    sessions = storage.session_factory(engine)
    answers = {
        "flex": ("rule-openai", answer(prompt_tokens=100_000, completion_tokens=100_000, service_tier="flex")),
        "priority": ("rule-openai", answer(prompt_tokens=100_000, completion_tokens=100_000, service_tier="priority")),
        "writes": ("rule-claude", answer(prompt_tokens=M, cached_tokens=200_000, cache_creation_tokens=700_000,
                                         cache_creation_extended_tokens=400_000, completion_tokens=100_000,
                                         service_tier="standard", reasoning_tokens=40_000)),
    }
    try:
        job_id = await storage.create_job(sessions, name="rules", fingerprint="r" * 64, input_path=None,
                                          model="rule-openai", settings={})
        await storage.add_prompts(sessions, job_id=job_id, prompts=[
            storage.NewPrompt(custom_id=name, position=i, model=model, messages=[{"role": "user", "content": name}],
                              params={}, dedupe_key=f"{i:064d}", planned_route="realtime", route_reason="test")
            for i, (name, (model, _)) in enumerate(answers.items())])
        ids = await storage.unfinished_prompt_ids(sessions, job_id=job_id)
        async with storage.ResultWriter(sessions, job_id=job_id, prices=table) as writer:
            for pid, (model, result) in zip(ids, answers.values(), strict=True):
                await writer.success(prompt_ids=[pid], result=result, model=model)
        flex = await reprice(sessions=sessions, job_id=job_id, table=table, tier="flex")
        batch = await reprice(sessions=sessions, job_id=job_id, table=table, route="batch")
        as_is = await reprice(sessions=sessions, job_id=job_id, table=table)
    finally:
        await engine.dispose()
    db_url = f"sqlite+aiosqlite:///{tmp_path / 'rules.db'}"
    stored = {name: (cost, discount, tier, extended, reasoning) for name, cost, discount, tier, extended, reasoning
              in rows(db_url, "SELECT p.custom_id, r.cost_pico_usd, r.discount, r.service_tier, "
                              "r.cache_creation_extended_tokens, r.reasoning_tokens "
                              "FROM results r JOIN prompts p ON p.id = r.prompt_id")}
    assert stored == {"flex": (600_000_000_000, "0.5", "flex", None, None),
                      "priority": (2_400_000_000_000, "0", "priority", None, None),
                      "writes": (1_795_000_000_000, "0", "standard", 400_000, 40_000)}
    # As answered, repriced with the same table: no difference.
    assert as_is.repriced.total == as_is.stored.total == Decimal("0.6") + Decimal("2.4") + Decimal("1.795")
    # What if every answer had been flex (Claude has no flex: unknown), or sent through the Batch API.
    by_model = {row.model: row for row in flex.rows}
    assert by_model["rule-openai"].repriced == Decimal("1.2") and by_model["rule-claude"].repriced is None
    assert batch.repriced.total == Decimal("0.6") + Decimal("0.6") + Decimal("0.8975")
    assert (batch.tier, batch.route, to_json(batch)["route"]) == (None, "batch", "batch")


@pytest.mark.prefect
async def test_a_flex_request_over_real_sockets_is_stored_at_the_flex_price(
    prefect_api: str, sim: Sim, db_url: str, prices_file: Path
) -> None:
    from llm_dispatch.flows.dispatch import dispatch

    prompts = [{"id": "flex", "prompt": "a flex question", "model": "rule-openai", "urgency": "urgent",
                "params": {"service_tier": "flex", "max_completion_tokens": 50}},
               {"id": "std", "prompt": "a standard question", "model": "rule-openai", "urgency": "urgent",
                "params": {"max_completion_tokens": 50}}]
    summary = to_json(await dispatch(prompts=prompts, base_url=sim.base_url, database_url=SecretStr(db_url), wait=True,
                                     prices_file=str(prices_file)))
    assert summary["counts"] == {"succeeded": 2}
    stored = {cid: (tier, cost, discount, p, c) for cid, tier, cost, discount, p, c in rows(db_url, """
        SELECT p.custom_id, r.service_tier, r.cost_pico_usd, r.discount, r.prompt_tokens, r.completion_tokens
        FROM results r JOIN prompts p ON p.id = r.prompt_id""")}
    for name, tier, rate, discount in (("flex", "flex", Decimal("0.5"), "0.5"), ("std", "default", Decimal(1), "0")):
        served, cost, off, prompt, completion = stored[name]
        # $2 in and $10 out per 1M, at the tier's rate: picodollars = tokens x price x 10^6.
        assert (served, off, cost) == (tier, discount, int((prompt * 2 + completion * 10) * rate * M))


def test_a_prompt_over_the_models_maximum_input_is_refused_though_it_fits_the_window(tmp_path: Path) -> None:
    from llm_dispatch.core import InputError
    from llm_dispatch.core.inputs._inputs import parse_prompt_dicts

    path = tmp_path / "p.json"
    path.write_text(json.dumps({"models": {"m": {"input": 1, "output": 1, "context_window": 1_000,
                                                 "max_input_tokens": 100}}}))
    table = PriceTable.load(path=path)
    assert parse_prompt_dicts([{"prompt": "short"}], default_model="m", table=table)
    with pytest.raises(InputError, match=r"more than m's maximum input of 100; shorten it") as info:
        parse_prompt_dicts([{"prompt": "word " * 300}], default_model="m", table=table)
    assert info.value.field == "prompt"
