"""Storage at scale: the bulk statements of a batch's ingest, and the reports read from indexes (a job's models and
endpoints, its usage summed per model, structured statistics found from the partial index). A temporary SQLite file
per test, and PostgreSQL when ``LLM_DISPATCH_TEST_PG_URL`` is set."""

from __future__ import annotations

from dataclasses import replace

import pytest
from sqlalchemy import text

from llm_dispatch import storage
from llm_dispatch.core import PriceTable
from llm_dispatch.storage import ResultWriter, Sessions

# The SQLite / PostgreSQL fixtures are test_storage's own (imported names are what pytest finds).
from test_storage import (  # noqa: F401
    Db,
    answer,
    db,
    engine,
    make_job,
    new_prompts,
    prompt_ids,
    prompt_row,
    results_of,
    sessions,
)


async def test_bulk_answers_settle_each_state_and_leave_settled_prompts_alone(sessions: Sessions) -> None:
    job_id = await make_job(sessions, new_prompts(5))
    ids = await prompt_ids(sessions, job_id)
    await storage.create_batch_record(sessions, job_id=job_id, model="gpt-4o-mini", file_path=None,
                                      members=[(pid, f"line-{name}") for name, pid in ids.items()])
    # p-1 was answered by another ingest first: it keeps that answer's state and attempts.
    async with ResultWriter(sessions, job_id=job_id) as writer:
        await writer.success(prompt_ids=[ids["p-1"]], result=answer("first", attempts=2), route="batch")
    refused = replace(answer(), text=None, refusal="I can't help with that")
    invalid = replace(answer("not json"), violation="the answer is not JSON")
    written = await storage.store_batch_answers(
        sessions, job_id=job_id, model="gpt-4o-mini", prices=PriceTable.load(), latency_s=30.0,
        answers=[([ids["p-0"]], refused), ([ids["p-1"]], answer("again")), ([ids["p-2"], ids["p-3"]], invalid)])
    assert written == 4
    rows = {name: await prompt_row(sessions, pid) for name, pid in ids.items()}
    assert {name: (row.status, row.attempts, row.failed_retryable) for name, row in rows.items()} == {
        "p-0": ("refused", 1, None), "p-1": ("succeeded", 2, None), "p-2": ("invalid", 1, None),
        "p-3": ("invalid", 0, None), "p-4": ("batched", 0, None)}
    [paid] = await results_of(sessions, ids["p-2"])
    [shared] = await results_of(sessions, ids["p-3"])
    assert (paid.route, paid.status, paid.violation, paid.latency_ms) == ("batch", "invalid", "the answer is not JSON",
                                                                          30_000.0)
    assert (shared.route, shared.cost_pico_usd) == ("reused", 0)
    assert paid.cost_pico_usd is not None and paid.cost_pico_usd > 0


async def test_batching_prompts_on_postgresql_writes_no_index_entry_and_no_new_page(db: Db, sessions: Sessions) -> None:
    # Heap-only updates: with no index on the status and half of each page free, a prompt's new row version goes
    # beside the old one, so marking a job's prompts batched grows neither the table nor any of its indexes.
    if db.kind != "postgres":
        pytest.skip("PostgreSQL storage")
    job_id = await make_job(sessions, new_prompts(400))
    ids = await prompt_ids(sessions, job_id)
    size = text("SELECT pg_total_relation_size('prompts')")
    async with sessions() as session:
        before = (await session.execute(size)).scalar_one()
    await storage.create_batch_record(sessions, job_id=job_id, model="gpt-4o-mini", file_path=None,
                                      members=[(pid, f"line-{pid}") for pid in ids.values()])
    assert await storage.job_counts(sessions, job_id=job_id) == {"batched": 400}
    async with sessions() as session:
        assert (await session.execute(size)).scalar_one() == before


async def test_a_jobs_models_and_endpoints_each_once_in_order(sessions: Sessions) -> None:
    prompts = [replace(p, model=model, endpoint=endpoint) for p, (model, endpoint) in zip(new_prompts(6), [
        ("gpt-4o-mini", "responses"), ("gpt-4o", "chat"), ("gpt-4o-mini", "chat"), ("gpt-4o", "chat"),
        ("text-embedding-3-small", "embeddings"), ("gpt-4o-mini", "chat")])]
    job_id = await make_job(sessions, prompts)
    other = await make_job(sessions, [replace(p, model="o3") for p in new_prompts(2, prefix="q")], fingerprint="e" * 64)
    assert await storage.job_model_endpoints(sessions, job_id=job_id) == [
        ("gpt-4o", "chat"), ("gpt-4o-mini", "chat"), ("gpt-4o-mini", "responses"),
        ("text-embedding-3-small", "embeddings")]
    assert await storage.job_models(sessions, job_id=job_id) == ["gpt-4o", "gpt-4o-mini", "text-embedding-3-small"]
    assert await storage.job_model_endpoints(sessions, job_id=other) == [("o3", "chat")]
    assert await storage.job_model_endpoints(sessions, job_id="no-such-job") == []


async def test_usage_is_summed_per_model_with_one_model_or_several(sessions: Sessions) -> None:
    prices = PriceTable.load()
    mixed = await make_job(sessions, [replace(p, model="gpt-4o" if i % 2 else "gpt-4o-mini")
                                      for i, p in enumerate(new_prompts(4))])
    single = await make_job(sessions, new_prompts(3, prefix="s"), fingerprint="e" * 64)
    async with ResultWriter(sessions, prices=prices) as writer:
        for job_id in (mixed, single):
            for i, pid in enumerate((await prompt_ids(sessions, job_id)).values()):
                model = "gpt-4o" if job_id == mixed and i % 2 else "gpt-4o-mini"
                await writer.success(prompt_ids=[pid], result=answer(tokens=10 + 20 * i), model=model)
    by_model = {u.model: (u.prompts, u.prompt_tokens, u.endpoint) for u in
                await storage.usage_by_route(sessions, job_id=mixed)}
    assert by_model == {"gpt-4o-mini": (2, 10 + 50, "chat"), "gpt-4o": (2, 30 + 70, "chat")}
    [one] = await storage.usage_by_route(sessions, job_id=single)
    assert (one.route, one.model, one.prompts, one.prompt_tokens, one.endpoint) == (
        "realtime", "gpt-4o-mini", 3, 10 + 30 + 50, "chat")
    assert one.cost_pico_usd > 0 and one.unpriced == 0
    # A long-prompt threshold splits one model's requests, on either path.
    split = await storage.usage_by_route(sessions, job_id=single, long_above={"gpt-4o-mini": 35})
    assert sorted((u.long_prompt, u.prompts, u.prompt_tokens) for u in split) == [(False, 2, 40), (True, 1, 50)]
    split = await storage.usage_by_route(sessions, job_id=mixed, long_above={"gpt-4o": 50})
    assert sorted((u.model, u.long_prompt, u.prompts) for u in split) == [
        ("gpt-4o", False, 1), ("gpt-4o", True, 1), ("gpt-4o-mini", False, 2)]


async def test_structured_statistics_only_for_a_job_with_checked_answers(sessions: Sessions) -> None:
    structured = await make_job(sessions, new_prompts(2))
    plain = await make_job(sessions, new_prompts(2, prefix="q"), fingerprint="e" * 64)
    async with ResultWriter(sessions) as writer:
        first, second = (await prompt_ids(sessions, structured)).values()
        await writer.success(prompt_ids=[first], result=replace(answer('{"a": 1}'), parsed={"a": 1}))
        await writer.success(prompt_ids=[second], result=replace(answer("nope"), violation="not JSON"))
        for pid in (await prompt_ids(sessions, plain)).values():
            await writer.success(prompt_ids=[pid], result=answer())
    # Another job's checked answers say nothing of this one's.
    assert await storage.structured_stats(sessions, job_id=plain) is None
    stats = await storage.structured_stats(sessions, job_id=structured)
    assert stats is not None and (stats.prompts, stats.valid_first, stats.still_invalid) == (2, 1, 1)
