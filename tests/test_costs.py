"""The cost ledger against hand-computed figures: stored cost per route, savings, unknown models, what
another price table would say (``reprice``), the estimate."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from decimal import Decimal

import pytest

from llm_dispatch.core import to_json
from llm_dispatch import storage
from llm_dispatch.core.pricing._pricing import ModelPrice, PriceTable
from llm_dispatch.core.pricing._tokens import estimate_prompt_tokens
from llm_dispatch.core._types import ChatResult, dedupe_key
from llm_dispatch.jobs import actual_cost, estimate_cost, reprice

M = 1_000_000


@pytest.fixture
async def sessions(db_url: str) -> AsyncIterator[storage.ResultWriter]:
    engine = storage.create_engine(db_url)
    await storage.migrate(engine)
    yield storage.session_factory(engine)
    await engine.dispose()


async def job(sessions, specs: list[tuple[str, str, str]], *, params: dict | None = None) -> tuple[str, list[int]]:
    """specs: (model, route, content) per prompt, each with ``params`` (default: max_tokens 50)."""
    job_id = await storage.create_job(sessions, name="t", fingerprint="c" * 64, input_path=None, model="m", settings={})
    prompts = []
    for i, (model, route, content) in enumerate(specs):
        messages = [{"role": "user", "content": content}]
        params = {"max_tokens": 50} if params is None else params
        prompts.append(storage.NewPrompt(custom_id=f"p{i}", position=i, model=model, messages=messages, params=params,
                                         dedupe_key=dedupe_key(model=model, messages=messages, params=params),
                                         planned_route=route, route_reason="test"))
    await storage.add_prompts(sessions, job_id=job_id, prompts=prompts)
    return job_id, await storage.unfinished_prompt_ids(sessions, job_id=job_id)


def answer(prompt: int, completion: int, cached: int = 0) -> ChatResult:
    return ChatResult(text="x", finish_reason="stop", prompt_tokens=prompt, completion_tokens=completion,
                      cached_tokens=cached, model="gpt-4o-mini-2024-07-18", response_id="r", latency_s=0.1, attempts=1)


def doubled(table: PriceTable) -> PriceTable:
    """Every price twice the bundled one, as a user's price file would give them."""
    models = {name: replace(price, input=price.input * 2, cached_input=price.cached_input * 2, output=price.output * 2)
              for name, price in table.models.items()}
    return replace(table, models=models, prices_as_of="2026-01-01", prices_file="doubled.json")


async def answered_job(sessions, table: PriceTable) -> tuple[str, list[int]]:
    job_id, ids = await job(sessions, [("gpt-4o-mini", "realtime", "a"), ("gpt-4o-mini", "batch", "b"),
                                       ("gpt-4o-mini", "batch", "b"), ("mystery-model", "realtime", "c")])
    async with storage.ResultWriter(sessions, job_id=job_id, prices=table) as writer:
        await writer.success(prompt_ids=[ids[0]], result=answer(M, M // 2, cached=200_000), model="gpt-4o-mini")
        # One batch line answered two identical prompts: paid once.
        await writer.success(prompt_ids=[ids[1], ids[2]], result=answer(M, M // 2, cached=200_000), route="batch",
                             model="gpt-4o-mini")
        # Answered under a snapshot name the table does not price as such: the model asked for decides.
        await writer.success(prompt_ids=[ids[3]], result=answer(1000, 1000), model="mystery-model")
    return job_id, ids


async def test_actual_cost_per_route_with_cached_tokens_savings_and_an_unknown_model(sessions) -> None:
    job_id, _ = await answered_job(sessions, PriceTable.load())
    ledger = await actual_cost(sessions=sessions, job_id=job_id)

    # gpt-4o-mini: 0.8M x 0.15 + 0.2M x 0.075 + 0.5M x 0.60 = 0.435 real-time; half in a batch.
    assert ledger.totals.realtime.cost == Decimal("0.435")
    assert ledger.totals.batch.cost == Decimal("0.2175")
    assert ledger.totals.batch.prompts == 1  # the reused answer is not paid again
    assert ledger.total == Decimal("0.6525")
    assert ledger.savings == Decimal("0.2175")
    assert not ledger.complete and ledger.totals.unpriced_models == {"mystery-model": 1}
    shown = to_json(ledger)
    assert shown["total"] == 0.6525 and shown["routes"]["realtime"]["unpriced"] == 1
    assert shown["priced_with"] == [{"prices_as_of": "2026-11-26", "prices_file": None, "cost_basis": "answer",
                                     "requests": 3}]


async def test_stored_costs_keep_the_prices_of_their_day_and_reprice_shows_another_table(sessions) -> None:
    bundled = PriceTable.load()
    old_id, _ = await answered_job(sessions, bundled)
    new_id, _ = await answered_job(sessions, doubled(bundled))

    old, new = [await actual_cost(sessions=sessions, job_id=job_id) for job_id in (old_id, new_id)]
    assert (old.total, old.savings, old.prices_as_of) == (Decimal("0.6525"), Decimal("0.2175"), "2026-11-26")
    assert (new.total, new.savings, new.prices_as_of) == (Decimal("1.305"), Decimal("0.435"), "2026-01-01")
    assert new.priced_with[0].prices_file == "doubled.json"

    what_if = await reprice(sessions=sessions, job_id=old_id, table=doubled(bundled))
    rows = {(row.route, row.model): row for row in what_if.rows}
    assert (rows["realtime", "gpt-4o-mini"].stored, rows["realtime", "gpt-4o-mini"].repriced) == (
        Decimal("0.435"), Decimal("0.870"))
    assert rows["batch", "gpt-4o-mini"].difference == Decimal("0.2175")
    # Unknown stays unknown on both sides: no difference is made up.
    assert (rows["realtime", "mystery-model"].stored_unpriced, rows["realtime", "mystery-model"].repriced) == (1, None)
    assert rows["realtime", "mystery-model"].difference is None
    shown = to_json(what_if)
    assert shown["stored"]["total"] == 0.6525 and shown["repriced"]["total"] == 1.305 and shown["difference"] is None
    # The what-if wrote nothing.
    assert (await actual_cost(sessions=sessions, job_id=old_id)).total == Decimal("0.6525")


async def test_the_estimate_learns_reply_length_from_stored_answers(sessions) -> None:
    table = PriceTable.load()
    done_id, done = await job(sessions, [("gpt-4o-mini", "realtime", f"q{i}") for i in range(20)])
    async with storage.ResultWriter(sessions, job_id=done_id) as writer:
        for pid in done:
            await writer.success(prompt_ids=[pid], result=answer(10, 30))
    fresh = await estimate_cost(sessions=sessions, job_id=done_id, table=table, typical_completion_tokens=100)
    assert fresh.totals.realtime.prompts == 0  # nothing open in the finished job

    job_id, _ = await job(sessions, [("gpt-4o-mini", "batch", "new question"), ("other", "realtime", "x")])
    estimate = await estimate_cost(sessions=sessions, job_id=job_id, table=table, typical_completion_tokens=100)
    # 20 stored answers of 30 tokens: 30 replaces the setting for gpt-4o-mini; "other" keeps 100.
    assert estimate.reply_tokens == {"gpt-4o-mini": 30, "other": 100}
    # Both capped at 50: 30 x (1 - e^(-50/30)) = 24.33 and 100 x (1 - e^(-0.5)) = 39.35.
    assert estimate.totals.batch.completion_tokens == 24
    assert estimate.totals.realtime.completion_tokens == 39
    assert estimate.totals.unpriced_models == {"other": 1} and not estimate.complete


async def test_answers_cut_at_their_cap_count_as_longer_replies(sessions) -> None:
    table = PriceTable.load()
    done_id, done = await job(sessions, [("gpt-4o-mini", "realtime", f"q{i}") for i in range(30)])
    async with storage.ResultWriter(sessions, job_id=done_id) as writer:
        for i, pid in enumerate(done):
            # 20 ended on their own at 20 tokens, 10 were cut at max_tokens=50.
            cut = i >= 20
            result = replace(answer(10, 50), finish_reason="length") if cut else answer(10, 20)
            await writer.success(prompt_ids=[pid], result=result)
    lengths = (await storage.reply_lengths(sessions, models=["gpt-4o-mini"]))["gpt-4o-mini"]
    assert (lengths.replies, lengths.tokens, lengths.cut) == (30, 900, 10)
    # 900 tokens seen over the 20 replies that ended on their own: 45, not the plain mean of 30.
    assert lengths.typical == 45

    job_id, _ = await job(sessions, [("gpt-4o-mini", "realtime", "next")])
    estimate = await estimate_cost(sessions=sessions, job_id=job_id, table=table, typical_completion_tokens=100)
    assert estimate.reply_tokens == {"gpt-4o-mini": 45}
    # 45 x (1 - e^(-50/45)) = 30.19
    assert estimate.totals.realtime.completion_tokens == 30


async def test_the_upper_bound_is_each_cap_else_the_models_maximum_output(sessions) -> None:
    table = PriceTable.load()
    capped_id, _ = await job(sessions, [("gpt-4o-mini", "realtime", "one"), ("gpt-4o-mini", "batch", "two")])
    capped = await estimate_cost(sessions=sessions, job_id=capped_id, table=table, typical_completion_tokens=100)
    one, two = (estimate_prompt_tokens([{"role": "user", "content": c}]) for c in ("one", "two"))
    # Every reply at its cap of 50 tokens; the batch one at half price.
    assert capped.max_total == ((one * Decimal("0.15") + 50 * Decimal("0.60"))
                                + (two * Decimal("0.15") + 50 * Decimal("0.60")) / 2) / M

    free_id, _ = await job(sessions, [("gpt-4o-mini", "realtime", "one")], params={})
    free = await estimate_cost(sessions=sessions, job_id=free_id, table=table, typical_completion_tokens=100)
    # No max_tokens: the reply may run to gpt-4o-mini's maximum output of 16,384 tokens, not the typical 100.
    assert free.totals.realtime.completion_tokens == 100
    assert free.max_total == (one * Decimal("0.15") + 16_384 * Decimal("0.60")) / M
    # What the JSON summary shows: about a cent, where 100-token replies alone would say $0.00006.
    assert to_json(free)["max_total"] == pytest.approx(0.00983, abs=0.000005) and free.unbounded_models == {}


async def test_a_model_of_unknown_maximum_output_without_max_tokens_is_unbounded(sessions) -> None:
    from llm_dispatch.flows.dispatch import describe_estimate

    bundled = PriceTable.load()
    price = ModelPrice(input=Decimal(1), cached_input=Decimal(1), output=Decimal(2), batch_discount=Decimal("0.5"))
    table = PriceTable(prices_as_of="2025-08-07", source="test", currency="USD",
                       models={**bundled.models, "my-model": price}, limits=bundled.limits)
    job_id, _ = await job(sessions, [("gpt-4o-mini", "realtime", "one"), ("my-model", "batch", "two"),
                                     ("mystery", "batch", "three")], params={})
    estimate = await estimate_cost(sessions=sessions, job_id=job_id, table=table, typical_completion_tokens=100)

    assert estimate.total > 0 and estimate.max_total is None
    assert estimate.unbounded_models == {"my-model": 1}
    shown = to_json(estimate)
    assert shown["max_total"] is None and shown["unbounded_models"] == {"my-model": 1}
    described = describe_estimate(estimate)
    assert "(at most: unbounded, no max_tokens and no maximum output known for my-model)" in described
    assert "NO PRICE for mystery" in described


async def _recorded_estimates(db_url: str, path, *, table: PriceTable):
    """(the estimate from the sums made while recording the input at ``path`` as a new job, the estimate read back
    from the database, the job's open rows)."""
    from llm_dispatch.core import Settings
    from llm_dispatch.jobs import record_job, routing_rules

    # The input's unpriced model is the user's own: sent as given, its cost unknown.
    settings = Settings(database_url=db_url, allow_unknown_model=True)
    async with storage.open_database(db_url) as sessions:
        job = await record_job(source=str(path), job_id=None, settings=settings, sessions=sessions,
                               rules=routing_rules(settings), estimate=True, new_job=True)
        assert job.sums is not None
        made = await estimate_cost(sessions=sessions, job_id=job.job_id, table=table, typical_completion_tokens=100,
                                   recorded=job.sums)
        read = await estimate_cost(sessions=sessions, job_id=job.job_id, table=table, typical_completion_tokens=100)
        rows = [row async for page in storage.unfinished_work_pages(sessions, job_id=job.job_id, page=100)
                for row in page]
    return made, read, rows


async def test_a_new_jobs_estimate_made_while_it_is_stored_is_the_one_read_back(db_url: str, tmp_path) -> None:
    """``run`` estimates a new job from the sums its recording made (no second read of every prompt); the figures
    are those of the estimate read back from the database, and of each open request estimated on its own."""
    import json

    from llm_dispatch.core import REQUEST_ROUTES, ChatRequest, estimate_request_cost

    long_text = "word " * 300_000  # above gpt-6.1-terra's long-prompt threshold (272,000 tokens)
    marked = [{"role": "user", "content": [{"type": "text", "text": "cached context", "cache_control":
                                             {"type": "ephemeral", "ttl": "1h"}}]}]
    records = [
        *({"id": f"luna-{i}", "model": "gpt-6-luna", "prompt": f"question {i}", "params": {"max_completion_tokens": 80},
           "urgency": "urgent"} for i in range(5)),
        {"id": "same-1", "model": "gpt-4o-mini", "prompt": "the same", "urgency": "urgent"},
        {"id": "same-2", "model": "gpt-4o-mini", "prompt": "the same", "urgency": "urgent"},
        {"id": "same-3", "model": "gpt-4o-mini", "prompt": "the same", "urgency": "bulk"},
        {"id": "uncapped", "model": "gpt-4o-mini", "prompt": "no cap", "urgency": "urgent"},
        {"id": "capped", "model": "gpt-4o-mini", "prompt": "capped answers", "params": {"max_tokens": 30}},
        {"id": "priority", "model": "gpt-6.1-terra", "prompt": "fast", "params": {"service_tier": "priority",
                                                                               "max_completion_tokens": 40}},
        {"id": "long", "model": "gpt-6.1-terra", "prompt": long_text, "params": {"max_completion_tokens": 10},
         "urgency": "urgent"},
        {"id": "lane", "model": "gpt-5.5", "endpoint": "responses", "prompt": "in three hours",
         "params": {"max_completion_tokens": 200}, "deadline": "3h"},
        {"id": "claude", "model": "claude-sonnet-5-5", "messages": marked, "params": {"max_tokens": 64}},
        {"id": "claude-plain", "model": "claude-sonnet-5-5", "prompt": "plain", "params": {"max_tokens": 64},
         "urgency": "bulk"},
        {"id": "vector", "model": "text-embedding-3-small", "endpoint": "embeddings", "input": "a text to embed"},
        {"id": "mystery", "model": "mystery-model", "prompt": "unpriced", "params": {"max_tokens": 5}},
    ]
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    table = PriceTable.load()
    made, read, rows = await _recorded_estimates(db_url, path, table=table)
    assert to_json(made) == to_json(read)
    assert (made.max_total, made.unbounded_models, made.reply_tokens) == (
        read.max_total, read.unbounded_models, read.reply_tokens)
    assert made.unpriced_models == {"mystery-model": 1}
    # Every lane the input took is in it: real-time, the Batch API and the 3-hour one.
    assert {"realtime", "batch"} < set(made.routes) and len(made.routes) == 3
    assert made.totals.endpoints.keys() == {"chat", "responses", "embeddings"}
    # Each open request on its own (an identical request once per half), summed: the same total and worst case.
    seen: set[tuple[bool, str]] = set()
    total = worst = Decimal(0)
    for row in sorted(rows, key=lambda row: row.id):
        half = row.planned_route == "batch"
        if (half, row.dedupe_key) in seen:
            continue
        seen.add((half, row.dedupe_key))
        lane = row.planned_route if row.planned_route in REQUEST_ROUTES else "batch" if half else "realtime"
        guess = estimate_request_cost(request=ChatRequest(model=row.model, messages=row.messages, params=row.params,
                                                          endpoint=row.endpoint),
                                      route=lane, table=table, typical_completion_tokens=100)
        total += guess.cost or 0
        worst += guess.max_cost or 0
    assert len(seen) == len(records) - 1  # same-1 and same-2 are one request
    assert made.totals.realtime.prompts + made.totals.batch.prompts == len(seen)
    assert made.total == total and made.total > 0
    assert made.max_total == worst

    # A priced model of unknown maximum output with no cap leaves the worst case unbounded, however it was made.
    assert table.limits_for("gpt-5-pro") is None or table.limits_for("gpt-5-pro").max_output_tokens is None
    path.write_text(path.read_text() + json.dumps({"id": "unbounded", "model": "gpt-5-pro", "prompt": "x"}) + "\n")
    made, read, _ = await _recorded_estimates(db_url, path, table=table)
    assert to_json(made) == to_json(read)
    assert made.unbounded_models == read.unbounded_models == {"gpt-5-pro": 1} and made.max_total is None
