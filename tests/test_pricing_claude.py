"""Claude prices in the bundled table: cache reads and writes, the batch discount, dated snapshot names."""

from __future__ import annotations

import json
import re
from decimal import Decimal
from importlib import resources
from pathlib import Path

import pytest

from llm_dispatch.core import (ChatRequest, ChatResult, ConfigError, CostTotals, PriceTable, estimate_request_cost,
                          from_pico)


@pytest.fixture(scope="module")
def table() -> PriceTable:
    return PriceTable.load()


def test_every_claude_entry_says_where_and_when_its_price_was_read() -> None:
    models = json.loads(resources.files("llm_dispatch.core").joinpath("prices.json").read_text())["models"]
    claude = {name: entry for name, entry in models.items() if name.startswith("claude-")}
    assert len(claude) >= 15
    for name, entry in claude.items():
        secondary = entry.get("secondary", {}).get("fields", [])
        assert entry["source"].startswith("https://platform.claude.com/") or "input" in secondary, name
        assert entry["prices_as_of"] in ("2026-11-26", "2026-11-25"), name
        # Anthropic's 5-minute cache write is 1.25x input, the 1-hour one 2x (Haiku 3's are listed as $0.30 and
        # $0.50); a read costs at most 0.1x input (the 5.x models read for less: Opus 5.5 and Sonnet 5.5 0.05x,
        # the Fables 5.1 and 5.2 0.025x).
        if name == "claude-3-haiku":
            continue
        assert Decimal(str(entry["cache_write"])) == Decimal(str(entry["input"])) * Decimal("1.25"), name
        assert Decimal(str(entry["cache_write_extended"])) == Decimal(str(entry["input"])) * 2, name
        assert Decimal(str(entry["cached_input"])) <= Decimal(str(entry["input"])) * Decimal("0.1"), name
    # The finding: Fable 5.2 has cache prices (read $0.20, not its $8 input, 40x less), from a
    # secondary source only, and marked so.
    fable = claude["claude-fable-5-2"]
    assert (fable["cached_input"], fable["cache_write"], fable["cache_write_extended"]) == (0.2, 10, 16)
    assert {"cached_input", "cache_write"} <= set(fable["secondary"]["fields"])


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
    assert table.price(model="claude-haiku-4-5", route="realtime", **usage).dollars == expected
    row = table.price(model="claude-haiku-4-5-20251001", route="batch", **usage)
    assert row is not None
    assert from_pico(row.cost) == expected / 2 and from_pico(row.list_cost) == expected and row.discount == "0.5"
    plain = table.price(model="gpt-4o-mini", route="realtime", prompt_tokens=10, completion_tokens=1)
    assert plain is not None and plain.cost == plain.list_cost


def test_a_haiku_5_5_prompt_over_100k_tokens_pays_5x_on_every_token(table: PriceTable) -> None:
    def usage(prompt: int) -> dict[str, int]:
        return {"prompt_tokens": prompt, "completion_tokens": 10_000, "cached_tokens": 20_000,
                "cache_creation_tokens": 30_000}

    # Up to 100,000 prompt tokens (cache reads and writes are part of them): $0.10 in, $0.01 read, $0.125 written,
    # $0.50 out per 1M; over it, every token of the request at $0.50, $0.05, $0.625 and $2.50.
    at = (50_000 * Decimal("0.10") + 20_000 * Decimal("0.01") + 30_000 * Decimal("0.125")
          + 10_000 * Decimal("0.50")) / 1_000_000
    over = (50_001 * Decimal("0.50") + 20_000 * Decimal("0.05") + 30_000 * Decimal("0.625")
            + 10_000 * Decimal("2.50")) / 1_000_000
    # Both sides of the line, on both routes: the cost, and the list cost (real-time) beside it.
    for prompt, expected in ((100_000, at), (100_001, over)):
        for route, paid in (("realtime", expected), ("batch", expected / 2)):
            row = table.price(model="claude-haiku-5-5", route=route, **usage(prompt))
            assert row is not None and (from_pico(row.cost), from_pico(row.list_cost)) == (paid, expected), (prompt, route)


def test_summed_usage_says_which_price_its_requests_paid(table: PriceTable) -> None:
    totals = CostTotals(table=table)
    # Three requests of 60,000 prompt tokens each: 180,000 in all, each at the short price.
    short = totals.add(model="claude-haiku-5-5", route="realtime", prompt_tokens=180_000, completion_tokens=0,
                       requests=3, long_prompt=False)
    assert short == Decimal("0.018")
    with pytest.raises(TypeError, match="long_prompt"):
        totals.add(model="claude-haiku-5-5", route="realtime", prompt_tokens=180_000, completion_tokens=0, requests=3)


def test_the_estimate_prices_a_long_prompt_at_the_long_price(table: PriceTable) -> None:
    request = ChatRequest(model="claude-haiku-5-5", messages=[{"role": "user", "content": "word " * 120_000}],
                          params={"max_tokens": 100})
    guess = estimate_request_cost(request=request, route="realtime", table=table, typical_completion_tokens=100)
    assert guess.prompt_tokens > 100_000
    assert guess.cost == (guess.prompt_tokens * Decimal("0.50") + guess.completion_tokens * Decimal("2.50")) / 1_000_000


@pytest.mark.parametrize(("long_prompt", "field"), [
    ({"input": 1, "output": 2}, "models.m.long_prompt.above"),
    ({"above": 0, "input": 1, "output": 2}, "models.m.long_prompt.above"),
    ({"above": 10, "output": 2}, "models.m.long_prompt.input"),
    ({"above": 10, "input": 1, "output": 2, "extra": 1}, "models.m.long_prompt.extra"),
    ([10, 1, 2], "models.m.long_prompt"),
])
def test_a_bad_long_prompt_entry_is_refused_with_its_field(tmp_path: Path, long_prompt: object, field: str) -> None:
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"models": {"m": {"input": 1, "output": 2, "long_prompt": long_prompt}}}))
    with pytest.raises(ConfigError, match=f"field '{re.escape(field)}'"):
        PriceTable.load(path=prices)


async def test_reprice_prices_each_request_at_its_own_length(tmp_path: Path) -> None:
    from llm_dispatch import storage
    from llm_dispatch.jobs import reprice

    engine = storage.create_engine(f"sqlite+aiosqlite:///{tmp_path / 'r.db'}")
    await storage.migrate(engine)
    sessions = storage.session_factory(engine)
    table = PriceTable.load()
    try:
        job_id = await storage.create_job(sessions, name="long", fingerprint="l" * 64, input_path=None,
                                          model="claude-haiku-5-5", settings={})
        await storage.add_prompts(sessions, job_id=job_id, prompts=[
            storage.NewPrompt(custom_id=f"c{i}", position=i, model="claude-haiku-5-5",
                              messages=[{"role": "user", "content": f"q{i}"}], params={}, dedupe_key=f"{i:064d}",
                              planned_route="realtime", route_reason="test") for i in range(3)])
        ids = await storage.unfinished_prompt_ids(sessions, job_id=job_id)
        async with storage.ResultWriter(sessions, job_id=job_id, prices=table) as writer:
            for pid, prompt in zip(ids, (60_000, 70_000, 150_000), strict=True):
                await writer.success(prompt_ids=[pid], result=ChatResult(
                    text="a", finish_reason="end_turn", prompt_tokens=prompt, completion_tokens=1_000, cached_tokens=0,
                    model="claude-haiku-5-5", response_id=f"msg_{pid}", latency_s=0.1))
        again = await reprice(sessions=sessions, job_id=job_id, table=table)
    finally:
        await engine.dispose()
    # Two short requests and one long: summed, their 280,000 prompt tokens would all have been priced long.
    expected = ((130_000 * Decimal("0.10") + 2_000 * Decimal("0.50"))
                + (150_000 * Decimal("0.50") + 1_000 * Decimal("2.50"))) / 1_000_000
    [row] = again.rows
    assert (row.requests, row.prompt_tokens) == (3, 280_000)
    assert row.stored == row.repriced == expected and row.difference == 0


def test_the_worst_case_writes_the_prompt_to_the_cache_only_where_the_request_can(table: PriceTable) -> None:
    from llm_dispatch.core import worst_case_cost
    from llm_dispatch.core.pricing._tokens import estimate_input_tokens

    plain = ChatRequest(model="claude-haiku-4-5", messages=[{"role": "user", "content": "word " * 500}],
                        params={"max_tokens": 1_000})
    prompt = estimate_input_tokens(plain)
    # No cache_control: Anthropic writes nothing, so the prompt is input at $1 and 1,000 tokens out at $5.
    assert worst_case_cost(request=plain, route="realtime", table=table) == (
        1_000, table.price(model="claude-haiku-4-5", route="realtime", prompt_tokens=prompt, completion_tokens=1_000))
    ceiling, charge = worst_case_cost(request=plain, route="realtime", table=table)  # type: ignore[misc]
    assert charge.dollars == (prompt * Decimal(1) + 1_000 * Decimal(5)) / 1_000_000
    # A marked block may write the whole prompt: at the 5-minute price ($1.25), on the Batch API half of it.
    marked = ChatRequest(model="claude-haiku-4-5", params={"max_tokens": 1_000}, messages=[{"role": "user", "content": [
        {"type": "text", "text": "word " * 500, "cache_control": {"type": "ephemeral"}}]}])
    prompt = estimate_input_tokens(marked)
    _, charge = worst_case_cost(request=marked, route="batch", table=table)  # type: ignore[misc]
    assert charge.dollars == (prompt * Decimal("1.25") + 1_000 * Decimal(5)) / 1_000_000 / 2
    # No cap: the model's maximum output (64,000 for Haiku 4.5); a model with none and no cap has no bound.
    ceiling, _ = worst_case_cost(request=ChatRequest(model="claude-haiku-4-5", messages=plain.messages),
                                 route="realtime", table=table)  # type: ignore[misc]
    assert ceiling == 64_000
    assert worst_case_cost(request=ChatRequest(model="my-own", messages=plain.messages), route="realtime",
                           table=table) is None
