"""A job's shards, read a keyset page at a time as real-time runs read them: every open prompt in exactly one
shard, in input order, with prompts stored while the shards page, stretches already answered, gaps in the input
positions, another job's prompts interleaved, and a run killed with prompts in flight. A temporary SQLite file per
test, and PostgreSQL when ``LLM_DISPATCH_TEST_PG_URL`` is set."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

import pytest
from sqlalchemy import update

from llm_dispatch import storage
from llm_dispatch.storage import Prompt, Sessions

# The SQLite / PostgreSQL fixtures are test_storage's own (imported names are what pytest finds).
from test_storage import db, engine, make_job, new_prompts, prompt_ids, sessions  # noqa: F401


async def shard_pages(sessions: Sessions, *, job_id: str, shard: tuple[int, int], page: int) -> list[list[int]]:
    """The shard's open prompts page by page, as a real-time run plans them (``plan_realtime``'s keyset)."""
    pages: list[list[int]] = []
    after: tuple[int, int] | None = None
    while True:
        found = await storage.unfinished_prompts(sessions, job_id=job_id, shard=shard, after=after, limit=page)
        pages.append([prompt.id for prompt in found])
        if len(found) < page:
            return pages
        after = (found[-1].position, found[-1].id)


async def set_status(sessions: Sessions, ids: Iterable[int], status: str) -> None:
    async with sessions.begin() as session:
        await session.execute(update(Prompt).where(Prompt.id.in_(list(ids))).values(status=status))


async def open_ids_in_order(sessions: Sessions, job_id: str) -> list[int]:
    return await storage.unfinished_prompt_ids(sessions, job_id=job_id)


def assert_each_once(shards: list[list[int]], expected: list[int]) -> None:
    found = [pid for shard in shards for pid in shard]
    assert sorted(found) == sorted(expected)
    assert len(found) == len(set(found))
    for shard in shards:  # each shard's prompts come in input order
        assert shard == [pid for pid in expected if pid in set(shard)]


@pytest.mark.parametrize("count, page", [(4, 3), (3, 1), (5, 7), (1, 4)])
async def test_every_open_prompt_is_in_one_shard_through_answered_stretches_and_gaps(
    sessions: Sessions, count: int, page: int
) -> None:
    # Positions 0..59, then a gap, then 400..439: the shards' windows step over stored positions, not numbers.
    job_id = await make_job(sessions, new_prompts(60) + new_prompts(40, start=400))
    # Another job's prompts take ids between this job's.
    await make_job(sessions, new_prompts(30, prefix="other"), name="other", fingerprint="e" * 64)
    await storage.add_prompts(sessions, job_id=job_id, prompts=new_prompts(20, start=1000))
    ids = await prompt_ids(sessions, job_id)
    # A long answered stretch (more than a window grows to at the smallest page), and a few answered here and there.
    answered = [ids[f"p-{i}"] for i in (*range(5, 50), 401, 402, 403, 1004)]
    await set_status(sessions, answered, "succeeded")
    expected = await open_ids_in_order(sessions, job_id)
    assert len(expected) == 120 - len(answered)
    shards = [[pid for part in await shard_pages(sessions, job_id=job_id, shard=(i, count), page=page) for pid in part]
              for i in range(count)]
    assert_each_once(shards, expected)


async def test_prompts_stored_while_the_shards_page_are_each_in_one_shard(sessions: Sessions) -> None:
    job_id = await make_job(sessions, new_prompts(30))
    count, page = 3, 4
    taken: list[list[int]] = [[] for _ in range(count)]
    after: list[tuple[int, int] | None] = [None] * count
    # Each shard reads one page; then the rest of the job is stored (a recording run storing its next slice);
    # then every shard pages on to its end.
    for i in range(count):
        found = await storage.unfinished_prompts(sessions, job_id=job_id, shard=(i, count), limit=page)
        taken[i] += [prompt.id for prompt in found]
        after[i] = (found[-1].position, found[-1].id)
    await storage.add_prompts(sessions, job_id=job_id, prompts=new_prompts(50, start=30))
    for i in range(count):
        while True:
            found = await storage.unfinished_prompts(sessions, job_id=job_id, shard=(i, count), after=after[i],
                                                     limit=page)
            taken[i] += [prompt.id for prompt in found]
            if len(found) < page:
                break
            after[i] = (found[-1].position, found[-1].id)
    assert_each_once(taken, await open_ids_in_order(sessions, job_id))


async def test_a_shard_run_again_after_a_kill_takes_its_own_prompts_left_in_flight(sessions: Sessions) -> None:
    job_id = await make_job(sessions, new_prompts(40))
    count = 4
    first = [[pid for part in await shard_pages(sessions, job_id=job_id, shard=(i, count), page=3) for pid in part]
             for i in range(count)]
    # Killed with -9: each shard had answered its first prompts and held its next ones in flight.
    for shard in first:
        await set_status(sessions, shard[:4], "succeeded")
        await set_status(sessions, shard[4:6], "in_flight")
    again = [[pid for part in await shard_pages(sessions, job_id=job_id, shard=(i, count), page=3) for pid in part]
             for i in range(count)]
    assert again == [shard[4:] for shard in first]
    assert_each_once(again, await open_ids_in_order(sessions, job_id))


async def test_a_shards_requests_in_input_order_are_its_prompts_each_once(sessions: Sessions) -> None:
    job_id = await make_job(sessions, new_prompts(50) + new_prompts(10, start=200))
    ids = await prompt_ids(sessions, job_id)
    await set_status(sessions, [ids[f"p-{i}"] for i in range(10, 40)], "succeeded")
    shards = []
    for i in range(3):
        shards.append([row.id async for rows in storage.unfinished_work_in_order(sessions, job_id=job_id, page=2,
                                                                                  shard=(i, 3)) for row in rows])
    assert_each_once(shards, await open_ids_in_order(sessions, job_id))


async def test_a_shards_page_is_full_until_its_last(sessions: Sessions) -> None:
    # Pages come short only at the end: a run takes a short page for its last (``RealtimePlan.last``).
    job_id = await make_job(sessions, new_prompts(100))
    pages = await shard_pages(sessions, job_id=job_id, shard=(1, 4), page=6)
    assert [len(part) for part in pages] == [6, 6, 6, 6, 1]


@pytest.mark.parametrize("page", [1, 3, 7, 50])
async def test_a_whole_jobs_pages_take_each_open_prompt_once_in_input_order(sessions: Sessions, page: int) -> None:
    # No shard: pages read windows of positions too. Gaps, positions two prompts share, another lane's prompts
    # between this lane's (a sparse stretch), an answered stretch and another job's prompts.
    prompts = new_prompts(60) + new_prompts(20, prefix="q", start=10) + new_prompts(30, start=500)
    routed = [replace(p, planned_route="realtime" if p.position % 3 == 0 or 20 <= p.position < 45 else "batch")
              for p in prompts]
    job_id = await make_job(sessions, routed)
    await make_job(sessions, new_prompts(30, prefix="other"), name="other", fingerprint="e" * 64)
    ids = await prompt_ids(sessions, job_id)
    await set_status(sessions, [ids[f"p-{i}"] for i in (1, 2, 50, 51, 52, 501)], "succeeded")
    expected = await storage.unfinished_prompt_ids(sessions, job_id=job_id, planned_route="batch")
    assert len(expected) > 40

    pages: list[list[int]] = []
    after: tuple[int, int] | None = None
    while True:
        found = await storage.unfinished_prompts(sessions, job_id=job_id, planned_route="batch", after=after,
                                                 limit=page)
        pages.append([prompt.id for prompt in found])
        if len(found) < page:
            break
        after = (found[-1].position, found[-1].id)
    assert [pid for part in pages for pid in part] == expected
    assert all(len(part) == page for part in pages[:-1])  # short only at the end
    in_order = [row.id async for rows in storage.unfinished_work_in_order(sessions, job_id=job_id, page=page,
                                                                           planned_route="batch") for row in rows]
    assert in_order == expected
