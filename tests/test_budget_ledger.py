"""The budget ledger: reservations that hold a cap with several processes at once (SQLite and PostgreSQL), periods
that roll over, leases of dead processes given back."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select

from llm_dispatch import storage
from llm_dispatch.core import PICO_PER_USD, ChatRequest, ChatResult, PriceTable, worst_case_cost

pytestmark = pytest.mark.asyncio(loop_scope="function")

REQUEST = ChatRequest(model="gpt-4o-mini", messages=[{"role": "user", "content": "hello there"}],
                      params={"max_tokens": 100})


def worst() -> int:
    found = worst_case_cost(request=REQUEST, route="realtime", table=PriceTable.load())
    assert found is not None and found[1] is not None
    return found[1].cost


# One process spending on a shared budget: 16 requests at a time reserve, "answer" at a cost between a tenth and
# all of their worst case, and settle it in a transaction of their own, as the result writer does; until a
# reservation does not fit. Prints what it sent and what its answers cost.
SPENDER = textwrap.dedent("""
    import asyncio, json, pathlib, random, sys
    from llm_dispatch import storage
    from llm_dispatch.core import ChatRequest, PriceTable

    async def main(url, name, seed, ready, processes):
        rng = random.Random(seed)
        request = ChatRequest(model="gpt-4o-mini", messages=[{"role": "user", "content": "hello there"}],
                              params={"max_tokens": 100})
        engine = storage.create_engine(url)
        await storage.migrate(engine)
        sessions = storage.session_factory(engine)
        budget = await storage.get_budget(sessions, name=name)
        # Every process ready before any spends: they spend side by side however the machine schedules them.
        pathlib.Path(ready, str(seed)).touch()
        while len(list(pathlib.Path(ready).iterdir())) < processes:
            await asyncio.sleep(0.01)
        sent, spent, refused = 0, 0, 0
        try:
            async with storage.BudgetLease(sessions, budget=budget, prices=PriceTable.load(), block=4) as lease:
                async def one():
                    nonlocal sent, spent, refused
                    while True:
                        amount = await lease.reserve(request)
                        if amount is None:
                            refused += 1
                            return
                        sent += 1
                        await asyncio.sleep(rng.random() / 200)
                        cost = rng.randint(amount // 10, amount)
                        lease.buffered(cost)
                        lease.landed(amount)
                        async with sessions.begin() as session:
                            moved = await lease.settle(await session.connection(), cost=cost)
                        lease.settled(cost=cost, moved=moved)
                        spent += cost
                await asyncio.gather(*(one() for _ in range(16)))
        finally:
            await engine.dispose()
        print(json.dumps({"sent": sent, "spent": spent, "refused": refused}))

    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])))
""")


async def _shared_budget(url: str, *, processes: int, tmp_path: Path) -> None:
    engine = storage.create_engine(url)
    await storage.migrate(engine)
    sessions = storage.session_factory(engine)
    limit = worst() * 150  # room for 150 requests at their worst, about 270 at their mean cost
    await storage.set_budget(sessions, name="team", limit_pico_usd=limit, per="total")
    script = tmp_path / "spender.py"
    script.write_text(SPENDER)
    ready = tmp_path / "ready"
    ready.mkdir()
    procs = [subprocess.Popen([sys.executable, str(script), url, "team", str(seed), str(ready), str(processes)],
                              stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for seed in range(processes)]
    outputs = [await asyncio.to_thread(proc.communicate, timeout=240) for proc in procs]
    for proc, (_, stderr) in zip(procs, outputs):
        assert proc.returncode == 0, stderr
    found = [json.loads(stdout) for stdout, _ in outputs]
    [usage] = await storage.budget_usage(sessions, name="team")
    await engine.dispose()
    spent = sum(each["spent"] for each in found)
    # Every answer's cost was counted, nothing is held any more, and the cap held.
    assert usage.spent_pico_usd == spent
    assert usage.reserved_pico_usd == 0
    assert spent <= limit
    # Each process stopped because its next reservation did not fit, once the budget was mostly spent. (How the
    # sends split between the processes is the scheduler's business: one may have spent it all.)
    assert all(each["refused"] for each in found)
    assert spent > limit // 2


async def test_two_processes_on_sqlite_share_a_budget_and_stay_under_it(tmp_path: Path) -> None:
    await _shared_budget(f"sqlite+aiosqlite:///{tmp_path / 'shared.db'}", processes=2, tmp_path=tmp_path)


async def test_four_processes_on_postgresql_share_a_budget_and_stay_under_it(pg_url: str, tmp_path: Path) -> None:
    await _shared_budget(pg_url, processes=4, tmp_path=tmp_path)


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


async def _settle(sessions: storage.Sessions, lease: storage.BudgetLease, *, amount: int, cost: int) -> None:
    lease.buffered(cost)
    lease.landed(amount)
    async with sessions.begin() as session:
        moved = await lease.settle(await session.connection(), cost=cost)
    lease.settled(cost=cost, moved=moved)


@pytest.fixture
async def sessions(db_url: str):
    engine = storage.create_engine(db_url)
    await storage.migrate(engine)
    yield storage.session_factory(engine)
    await engine.dispose()


async def test_a_daily_budget_rolls_over_at_midnight_utc(sessions: storage.Sessions) -> None:
    each = worst()
    budget = await storage.set_budget(sessions, name="daily", limit_pico_usd=each * 3, per="day")
    clock = Clock(datetime(2026, 11, 26, 23, 59, 50, tzinfo=UTC))
    async with storage.BudgetLease(sessions, budget=budget, prices=PriceTable.load(), block=2, clock=clock) as lease:
        amounts = [await lease.reserve(REQUEST) for _ in range(4)]
        assert amounts == [each, each, each, None]  # the fourth does not fit the day
        assert lease.exhausted
        for amount in amounts[:2]:
            await _settle(sessions, lease, amount=amount, cost=each // 2)
        # Midnight passes with one request still out: the next day's first reservation waits for it to be stored.
        clock.now += timedelta(seconds=20)
        lease._exhausted = False  # a new run the next day would start afresh; this lease goes on
        later = asyncio.create_task(lease.reserve(REQUEST))
        await asyncio.sleep(0.2)
        assert not later.done()
        await _settle(sessions, lease, amount=amounts[2], cost=each // 4)
        assert await asyncio.wait_for(later, 5) == each
        await _settle(sessions, lease, amount=each, cost=each // 5)
    usages = await storage.budget_usage(sessions, name="daily", now=clock.now, history=True)
    assert [(u.period, u.spent_pico_usd, u.reserved_pico_usd) for u in usages] == [
        ("2026-11-27", each // 5, 0), ("2026-11-26", each // 2 * 2 + each // 4, 0)]
    assert usages[0].left_pico_usd == each * 3 - each // 5


async def test_a_monthly_budget_counts_per_calendar_month(sessions: storage.Sessions) -> None:
    budget = await storage.set_budget(sessions, name="monthly", limit_pico_usd=5 * PICO_PER_USD, per="month")
    first = await storage.hold_for(sessions, budget=budget, amount=4 * PICO_PER_USD,
                                   now=datetime(2026, 11, 30, 12, tzinfo=UTC))
    assert first is not None
    assert await storage.hold_for(sessions, budget=budget, amount=2 * PICO_PER_USD,
                                  now=datetime(2026, 11, 30, 13, tzinfo=UTC)) is None
    assert await storage.hold_for(sessions, budget=budget, amount=2 * PICO_PER_USD,
                                  now=datetime(2026, 12, 1, 0, tzinfo=UTC)) is not None


async def test_a_dead_runs_lease_is_given_back_once_expired(sessions: storage.Sessions) -> None:
    each = worst()
    budget = await storage.set_budget(sessions, name="shared", limit_pico_usd=each * 10, per="total")
    clock = Clock(datetime(2026, 11, 26, 12, tzinfo=UTC))
    dead = storage.BudgetLease(sessions, budget=budget, prices=PriceTable.load(), block=10, clock=clock,
                               ttl=timedelta(minutes=30))
    await dead.__aenter__()
    assert await dead.reserve(REQUEST) == each  # holds the whole budget, then its process dies
    async with storage.BudgetLease(sessions, budget=budget, prices=PriceTable.load(), block=1, clock=clock) as alive:
        assert await alive.reserve(REQUEST) is None
    clock.now += timedelta(minutes=31)
    async with storage.BudgetLease(sessions, budget=budget, prices=PriceTable.load(), block=1, clock=clock) as alive:
        assert await alive.reserve(REQUEST) == each
        await _settle(sessions, alive, amount=each, cost=each)
    [usage] = await storage.budget_usage(sessions, name="shared")
    assert (usage.spent_pico_usd, usage.reserved_pico_usd) == (each, 0)


async def test_a_cost_above_its_reservation_is_spent_all_the_same(sessions: storage.Sessions) -> None:
    each = worst()
    budget = await storage.set_budget(sessions, name="tight", limit_pico_usd=each, per="total")
    async with storage.BudgetLease(sessions, budget=budget, prices=PriceTable.load(), block=1) as lease:
        amount = await lease.reserve(REQUEST)
        assert amount == each
        # The prompt was longer than estimated: the answer is paid, and counted, beyond what was held.
        await _settle(sessions, lease, amount=amount, cost=each + 7)
        assert await lease.reserve(REQUEST) is None
    [usage] = await storage.budget_usage(sessions, name="tight")
    assert (usage.spent_pico_usd, usage.reserved_pico_usd, usage.left_pico_usd) == (each + 7, 0, 0)


async def _job_with_prompts(sessions: storage.Sessions, n: int) -> tuple[str, list[int]]:
    job_id = await storage.create_job(sessions, name="job", fingerprint="f" * 64, input_path=None, model="gpt-4o-mini",
                                      settings={})
    await storage.add_prompts(sessions, job_id=job_id, prompts=[
        storage.NewPrompt(custom_id=f"p-{i}", position=i, model="gpt-4o-mini", messages=REQUEST.messages,
                          params=REQUEST.params, metadata=None, dedupe_key=f"{i:064d}") for i in range(n)])
    return job_id, await storage.unfinished_prompt_ids(sessions, job_id=job_id)


def _answer(completion_tokens: int) -> ChatResult:
    return ChatResult(text="hi", finish_reason="stop", prompt_tokens=12, completion_tokens=completion_tokens,
                      cached_tokens=0, model="gpt-4o-mini", response_id="r", latency_s=0.1)


async def _stored_cost(sessions: storage.Sessions, job_id: str) -> int:
    async with sessions() as session:
        return int((await session.execute(select(func.sum(storage.Result.cost_pico_usd))
                                          .where(storage.Result.job_id == job_id))).scalar_one())


async def test_the_writer_settles_each_answer_at_its_stored_cost(sessions: storage.Sessions) -> None:
    each = worst()
    job_id, ids = await _job_with_prompts(sessions, 3)
    budget = await storage.set_budget(sessions, name="writer", limit_pico_usd=each * 10, per="total")
    table = PriceTable.load()
    async with storage.BudgetLease(sessions, budget=budget, prices=table, block=4) as lease:
        async with storage.ResultWriter(sessions, job_id=job_id, prices=table, budget=lease) as writer:
            for prompt_id, tokens in zip(ids, (5, 50, 100)):
                amount = await lease.reserve(REQUEST)
                await writer.success(prompt_ids=[prompt_id], result=_answer(tokens), model="gpt-4o-mini")
                lease.landed(amount)
            await writer.flush()
            [usage] = await storage.budget_usage(sessions, name="writer")
            # Settled in the transaction that stored the answers; the lease still holds the rest of its block.
            assert usage.spent_pico_usd == await _stored_cost(sessions, job_id)
            assert usage.reserved_pico_usd == each * 4 - usage.spent_pico_usd
    [usage] = await storage.budget_usage(sessions, name="writer")
    assert usage.reserved_pico_usd == 0


async def test_a_job_budget_starts_with_what_the_job_already_cost(sessions: storage.Sessions) -> None:
    job_id, ids = await _job_with_prompts(sessions, 2)
    async with storage.ResultWriter(sessions, job_id=job_id, prices=PriceTable.load()) as writer:
        await writer.success(prompt_ids=[ids[0]], result=_answer(40), model="gpt-4o-mini")
    before = await _stored_cost(sessions, job_id)
    assert before > 0
    info = await storage.set_job_budget(sessions, job_id=job_id, limit_pico_usd=PICO_PER_USD)
    assert info.per == "total"
    [usage] = await storage.budget_usage(sessions, name=info.name)
    assert (usage.spent_pico_usd, usage.limit_pico_usd) == (before, PICO_PER_USD)
    # Raising it (a resume with a higher --budget) keeps what was spent.
    await storage.set_job_budget(sessions, job_id=job_id, limit_pico_usd=2 * PICO_PER_USD)
    [usage] = await storage.budget_usage(sessions, name=info.name)
    assert (usage.spent_pico_usd, usage.limit_pico_usd) == (before, 2 * PICO_PER_USD)


async def test_two_transactions_settling_one_reservation_at_once_move_what_it_holds_once(pg_url: str) -> None:
    # A batch's ingest stores two slices side by side on PostgreSQL, each settling the batch's one reservation.
    engine = storage.create_engine(pg_url)
    try:
        await storage.migrate(engine)
        sessions = storage.session_factory(engine)
        budget = await storage.set_budget(sessions, name="batches", limit_pico_usd=1000, per="total")
        hold = await storage.hold_for(sessions, budget=budget, amount=100)
        assert hold is not None
        async with engine.connect() as first, engine.connect() as second, engine.connect() as watcher:
            await first.begin()
            await storage.settle_holds(first, costs={hold: 80})
            await second.begin()
            later = asyncio.create_task(storage.settle_holds(second, costs={hold: 80}))
            # Until the second transaction waits on the first's locks (or has finished without waiting).
            waiting = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            while not later.done() and not (await watcher.exec_driver_sql(waiting)).scalar():
                await asyncio.sleep(0.01)
            await first.commit()
            await later
            await second.commit()
        usage = await storage.budget_usage(sessions, name="batches")
        assert (usage[0].spent_pico_usd, usage[0].reserved_pico_usd) == (160, 0)
        async with sessions() as session:
            left = await session.scalar(select(storage.Reservation.amount_pico_usd)
                                        .where(storage.Reservation.id == hold))
        assert left == 0  # not 100 - 80 - 80: each transaction moved what the other left
    finally:
        await engine.dispose()
