"""A job's ledger deltas (``storage._ledger``) sum to what its results sum to, through every way results are written
(the real-time writer's answers, reused answers, failures with and without reported usage, re-asks, answers with no
price, the batch ingest's bulk path), after the writer folds them, and after the migration that made them back-fills
a database's results; on SQLite and PostgreSQL."""

from __future__ import annotations

import re
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

ROOT = Path(__file__).resolve().parent.parent


async def from_results(sessions: Sessions, job_id: str) -> list[UsageRow]:
    """The job's usage summed from every result row (the covering index's scan): a long-prompt threshold no prompt
    reaches makes ``usage_by_route`` read the results, not the deltas."""
    return await storage.usage_by_route(sessions, job_id=job_id, long_above={"gpt-4o-mini": 10**9})


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


async def test_the_migration_sums_a_databases_results_into_deltas(sessions: Sessions, engine: AsyncEngine) -> None:
    job_id = await answered_every_way(sessions)
    other = await make_job(sessions, new_prompts(2, prefix="q"), name="other", fingerprint="e" * 64)
    async with ResultWriter(sessions, job_id=other, prices=PriceTable.load()) as writer:
        await writer.success(prompt_ids=list((await prompt_ids(sessions, other)).values()), result=answer("q"))
    expected = {job: await from_results(sessions, job) for job in (job_id, other)}

    def down_and_up(connection: object) -> None:
        config = _config()
        config.attributes["connection"] = connection
        command.downgrade(config, "-1")
        command.upgrade(config, "head")

    async with engine.begin() as connection:
        await connection.execute(delete(LedgerDelta))  # what the write paths put there: only the back-fill's now
        await connection.run_sync(down_and_up)
    for job, usage in expected.items():
        assert await storage.usage_by_route(sessions, job_id=job) == usage


def test_every_insert_into_results_goes_through_the_two_writers() -> None:
    # The deltas hold only if every results row is written by write_results or write_batch_rows, which add them.
    found = {str(path.relative_to(ROOT)) for path in (ROOT / "storage").glob("*.py")
             if re.search(r"INSERT INTO results|copy_records_to_table\(\s*\"results\"|insert\(Result\)",
                          path.read_text())}
    assert found == {"storage/_results.py", "storage/_bulk_answers.py"}
