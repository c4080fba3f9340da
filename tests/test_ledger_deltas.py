"""A job's ledger deltas (``storage._ledger``) sum to what its results sum to, through every way results are written
(the real-time writer's answers, reused answers, failures with and without reported usage, re-asks, answers with no
price, the batch ingest's bulk path), for a job of several models, endpoints and providers split by a long-prompt
price too, after the writer folds them, and after the migrations that made them back-fill a database's results; on
SQLite and PostgreSQL."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

from alembic import command
from sqlalchemy import delete, func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from test_storage import answer, db, engine, make_job, new_prompts, prompt_ids, sessions  # noqa: F401

from llm_dispatch import storage
from llm_dispatch.core import PriceTable
from llm_dispatch.core._exceptions import APIResponseValidationError, RateLimitError
from llm_dispatch.storage import ResultWriter, Sessions, UsageRow
from llm_dispatch.storage._migrate import _config
from llm_dispatch.storage._models import LedgerDelta
from llm_dispatch.storage._usage import usage_from_results

ROOT = Path(__file__).resolve().parent.parent


async def from_results(sessions: Sessions, job_id: str, long_above: dict[str, int] | None = None) -> list[UsageRow]:
    """The job's usage summed from every result row, each joined to its prompt."""
    return await usage_from_results(sessions, job_id=job_id, long_above=long_above or {})


async def delta_rows(sessions: Sessions, job_id: str) -> int:
    async with sessions() as session:
        return int(await session.scalar(select(func.count()).select_from(LedgerDelta)
                                        .where(LedgerDelta.job_id == job_id)) or 0)


async def answered_every_way(sessions: Sessions) -> str:
    job_id = await make_job(sessions, new_prompts(12))
    ids = list((await prompt_ids(sessions, job_id)).values())
    priced = PriceTable.load()
    empty = APIResponseValidationError("a 2xx with no answer")
    empty.usage = answer("", tokens=30)
    async with ResultWriter(sessions, job_id=job_id, prices=priced) as writer:
        # A transaction (and its deltas) per call, as a slow run writes them.
        for call in (
            writer.success(prompt_ids=ids[0:2], result=answer("shared", tokens=7)),  # the second reused
            writer.success(prompt_ids=[ids[2]], result=answer("flex", tokens=9), route="flex"),
            writer.failure(prompt_ids=[ids[3]], error=RateLimitError("slow down", status_code=429), final=False),
            writer.failure(prompt_ids=[ids[3]], error=empty, model="gpt-4o-mini"),
            writer.success(prompt_ids=[ids[4]], result=answer("again", tokens=11), reask=1),
        ):
            await call
            await writer.flush()
        assert await delta_rows(sessions, job_id) == 4  # the 429 added nothing
    async with ResultWriter(sessions, job_id=job_id) as writer:  # no price table: costs unknown
        await writer.success(prompt_ids=[ids[5]], result=answer("unpriced", tokens=13))
    await storage.create_batch_record(sessions, job_id=job_id, model="gpt-4o-mini", file_path=None,
                                      members=[(pid, f"line-{n}") for n, pid in enumerate(ids[6:])])
    await storage.store_batch_answers(sessions, job_id=job_id, latency_s=60.0, model="gpt-4o-mini", prices=priced,
                                      answers=[(ids[6:8], answer("bulk", tokens=17)), ([ids[8]], answer("own", tokens=5))])
    return job_id


async def test_the_deltas_sum_to_what_the_results_sum_to(sessions: Sessions) -> None:
    job_id = await answered_every_way(sessions)
    from_deltas = await storage.usage_by_route(sessions, job_id=job_id)
    assert from_deltas == await from_results(sessions, job_id)
    # The catalog has no flex price for the model: unknown there too, beside the writer given no table.
    assert {(u.route, u.cost_basis, u.unpriced > 0) for u in from_deltas} == {
        ("realtime", "answer", False), ("realtime", None, True), ("flex", "answer", True), ("batch", "answer", False)}
    assert sum(u.prompts for u in from_deltas) == 7  # reused and the 429 left out, the usage of the empty 2xx in
    # Each writer folded its job's deltas as it closed: one row per key (the bulk ingest's slice is one already).
    assert await delta_rows(sessions, job_id) == len(from_deltas)


async def back_filled(engine: AsyncEngine) -> None:
    """The database taken back to before the deltas, its deltas removed, and upgraded again: the migrations that made
    them (0027, 0028) fill them from the results."""
    def down_and_up(connection: object) -> None:
        config = _config()
        config.attributes["connection"] = connection
        command.downgrade(config, "0023")
        command.upgrade(config, "head")

    async with engine.begin() as connection:
        await connection.execute(delete(LedgerDelta))  # what the write paths put there: only the back-fill's now
        await connection.run_sync(down_and_up)


async def test_the_migration_sums_a_databases_results_into_deltas(sessions: Sessions, engine: AsyncEngine) -> None:
    job_id = await answered_every_way(sessions)
    other = await make_job(sessions, new_prompts(2, prefix="q"), name="other", fingerprint="e" * 64)
    async with ResultWriter(sessions, job_id=other, prices=PriceTable.load()) as writer:
        await writer.success(prompt_ids=list((await prompt_ids(sessions, other)).values()), result=answer("q"))
    expected = {job: await from_results(sessions, job) for job in (job_id, other)}

    await back_filled(engine)
    for job, usage in expected.items():
        assert await storage.usage_by_route(sessions, job_id=job) == usage


# Two models of a price file: one priced apart above 20 prompt tokens, one at any length.
PRICES = {"models": {
    "long-a": {"provider": "openai", "input": 1, "output": 2, "long_prompt": {"above": 20, "input": 3, "output": 4}},
    "plain-b": {"provider": "anthropic", "input": 5, "output": 6},
}}
SPLIT = {"long-a": 20}


async def several_models(sessions: Sessions, prices: PriceTable) -> str:
    """A job of two models, one of them on two endpoints and two providers, answered at lengths either side of
    long-a's threshold, by the real-time writer (not told the job: it looks each prompt up) and by the bulk path."""
    kinds = [("long-a", "chat", "openai"), ("long-a", "responses", "openai"), ("plain-b", "chat", "anthropic"),
             ("long-a", "chat", "azure")]
    prompts = [replace(p, model=kinds[i % 4][0], endpoint=kinds[i % 4][1], provider=kinds[i % 4][2])
               for i, p in enumerate(new_prompts(16, prefix="m"))]
    job_id = await make_job(sessions, prompts, name="mixed", fingerprint="d" * 64)
    ids = list((await prompt_ids(sessions, job_id)).values())
    async with ResultWriter(sessions, prices=prices) as writer:
        for i, pid in enumerate(ids[:8]):
            await writer.success(prompt_ids=[pid], result=answer(tokens=10 + 4 * i), model=prompts[i].model)
    await storage.create_batch_record(sessions, job_id=job_id, model="long-a", file_path=None,
                                      members=[(pid, f"line-{n}") for n, pid in enumerate(ids[8:])])
    await storage.store_batch_answers(sessions, job_id=job_id, latency_s=60.0, model="long-a", prices=prices,
                                      answers=[([pid], answer("bulk", tokens=15 + 3 * n)) for n, pid in enumerate(ids[8:])])
    return job_id


async def test_a_job_of_several_models_is_read_from_its_deltas_split_at_a_long_prompt(
        sessions: Sessions, tmp_path: Path) -> None:
    path = tmp_path / "prices.json"
    path.write_text(json.dumps(PRICES))
    prices = PriceTable.load(path=path)
    job_id = await several_models(sessions, prices)
    split = await storage.usage_by_route(sessions, job_id=job_id, long_above=SPLIT)
    assert split == await from_results(sessions, job_id, SPLIT)
    assert await storage.usage_by_route(sessions, job_id=job_id) == await from_results(sessions, job_id)
    assert {(u.model, u.endpoint, u.provider) for u in split} == {
        ("long-a", "chat", "openai"), ("long-a", "responses", "openai"), ("plain-b", "chat", "anthropic"),
        ("long-a", "chat", "azure")}
    assert {u.long_prompt for u in split if u.model == "long-a"} == {False, True}
    # What the reads above used: the deltas hold each model, endpoint and provider, and long-a's split at 20.
    async with sessions() as session:
        kept = {(row.model, row.endpoint, row.provider, row.long_above, row.long_prompt) for row in
                (await session.execute(select(LedgerDelta).where(LedgerDelta.job_id == job_id))).scalars()}
    assert kept == {("long-a", "chat", "openai", 20, False), ("long-a", "chat", "openai", 20, True),
                    ("long-a", "responses", "openai", 20, False), ("long-a", "responses", "openai", 20, True),
                    ("long-a", "chat", "azure", 20, True), ("plain-b", "chat", "anthropic", None, False)}
    # A price table that splits long-a elsewhere than the one its answers were priced with: the results say.
    assert (await storage.usage_by_route(sessions, job_id=job_id, long_above={"long-a": 30})
            == await from_results(sessions, job_id, {"long-a": 30}))


async def test_the_migration_keeps_a_job_of_several_models_apart(
        sessions: Sessions, engine: AsyncEngine, tmp_path: Path) -> None:
    path = tmp_path / "prices.json"
    path.write_text(json.dumps(PRICES))
    job_id = await several_models(sessions, PriceTable.load(path=path))
    expected, split = await from_results(sessions, job_id), await from_results(sessions, job_id, SPLIT)
    await back_filled(engine)
    assert await storage.usage_by_route(sessions, job_id=job_id) == expected
    # The threshold of a back-filled delta is not known: a split read sums the results.
    assert await storage.usage_by_route(sessions, job_id=job_id, long_above=SPLIT) == split


def test_every_insert_into_results_goes_through_the_two_writers() -> None:
    # The deltas hold only if every results row is written by write_results or write_batch_rows, which add them.
    found = {str(path.relative_to(ROOT)) for path in (ROOT / "storage").glob("*.py")
             if re.search(r"INSERT INTO results|copy_records_to_table\(\s*\"results\"|insert\(Result\)",
                          path.read_text())}
    assert found == {"storage/_results.py", "storage/_bulk_answers.py"}
