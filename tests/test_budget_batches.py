"""The batch lane under a budget: a batch's worst case reserved at the batch price when it is submitted, cut to what
fits; its answers' stored costs spent out of it as they are ingested; what an expired batch did not spend given
back."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select

from llm_dispatch import storage
from llm_dispatch.core import ChatRequest, PriceTable, worst_case_cost
from llm_dispatch.jobs import ingest_batch, submit_prompts
from test_batch_path import PEOPLE, STRUCTURED, Env, env  # noqa: F401 - the batch path's environment and its fixture


def _worst(route: str) -> int:
    request = ChatRequest(model="gpt-4o-mini", messages=[{"role": "user", "content": "question 10"}],
                          params={"max_tokens": 20})
    found = worst_case_cost(request=request, route=route, table=PriceTable.load())  # type: ignore[arg-type]
    assert found is not None and found[1] is not None
    return found[1].cost


async def _submit(env: Env, job_id: str, budget: storage.BudgetInfo | None) -> Any:
    async with storage.ResultWriter(env.sessions, job_id=job_id, prices=PriceTable.load()) as writer:
        return await submit_prompts(sessions=env.sessions, clients=env.clients, writer=writer, job_id=job_id,
                                    directory=env.directory, budget=budget)


async def _ingest(env: Env, batch_id: int, **options: Any) -> Any:
    record = await env.poll(batch_id)
    async with storage.ResultWriter(env.sessions, job_id=record.job_id, prices=PriceTable.load()) as writer:
        return await ingest_batch(sessions=env.sessions, clients=env.clients, writer=writer, record=record,
                                  directory=env.directory, max_submissions=3, **options)


async def _ledger(env: Env, job_id: str) -> tuple[int, storage.BudgetUsage, list[tuple[int | None, int]]]:
    """(the job's stored cost, the budget's period, the reservations left as (batch id, amount))."""
    async with env.sessions() as session:
        cost = (await session.execute(select(func.coalesce(func.sum(storage.Result.cost_pico_usd), 0))
                                      .where(storage.Result.job_id == job_id))).scalar_one()
        holds = (await session.execute(select(storage.Reservation.batch_id,
                                              storage.Reservation.amount_pico_usd))).all()
    [usage] = await storage.budget_usage(env.sessions, name="batches")
    return int(cost), usage, [tuple(hold) for hold in holds]


async def test_a_batch_is_cut_to_what_fits_and_ingest_spends_its_reservation(env: Env) -> None:
    worst = _worst("batch")
    assert worst * 2 <= _worst("realtime") + 1  # priced at the batch price: half
    job_id, _ = await env.job([f"question {i}" for i in range(30)])
    budget = await storage.set_budget(env.sessions, name="batches", limit_pico_usd=worst * 12, per="total")
    async with env.client:
        outcome = await _submit(env, job_id, budget)
        [batch_id] = outcome.batch_ids
        # Twelve lines fit; the other eighteen prompts wait, pending, and the batch holds its worst case.
        assert (outcome.prompts, outcome.over_budget) == (12, 18)
        assert (await env.batch(batch_id)).request_total == 12
        assert await env.statuses(job_id) == {"batched": 12, "pending": 18}
        _, usage, holds = await _ledger(env, job_id)
        assert holds == [(batch_id, worst * 12)] and usage.reserved_pico_usd == worst * 12

        await _ingest(env, batch_id)
        cost, usage, holds = await _ledger(env, job_id)
        # The answers' stored costs are spent; what the batch did not spend is free again; nothing is held.
        assert 0 < usage.spent_pico_usd == cost <= worst * 12
        assert (usage.reserved_pico_usd, holds) == (0, [])

        # What the first batch did not spend takes as many more of the waiting prompts as it holds at their worst.
        again = await _submit(env, job_id, budget)
        assert (again.prompts, again.over_budget) == (usage.left_pico_usd // worst, 18 - usage.left_pico_usd // worst)
        for batch in again.batch_ids:
            await _ingest(env, batch)
    cost, usage, holds = await _ledger(env, job_id)
    assert usage.spent_pico_usd == cost <= worst * 12
    assert (usage.reserved_pico_usd, holds) == (0, [])


async def test_an_expired_batch_gives_back_what_it_did_not_spend(env: Env) -> None:
    worst = _worst("batch")
    job_id, _ = await env.job([f"question {i}" for i in range(20)])
    budget = await storage.set_budget(env.sessions, name="batches", limit_pico_usd=worst * 100, per="total")
    env.queue_faults("expire:0.5")
    async with env.client:
        [batch_id] = (await _submit(env, job_id, budget)).batch_ids
        outcome = await _ingest(env, batch_id)
    assert (outcome.status, outcome.succeeded) == ("expired", 10)
    cost, usage, holds = await _ledger(env, job_id)
    # Half answered and paid; the other half's reservation is given back with the batch.
    assert usage.spent_pico_usd == cost > 0
    assert (usage.reserved_pico_usd, holds) == (0, [])
    assert usage.left_pico_usd == worst * 100 - cost


async def test_a_billed_line_without_an_answer_is_spent_out_of_its_batchs_reservation(env: Env) -> None:
    """A 200 line with no usable answer was billed (its usage is stored and priced): the budget counts it, as it
    counts the batch's answers, before the batch gives back what it did not spend."""
    worst = _worst("batch")
    job_id, ids = await env.job(["hollow [[sim:empty_choices]]", "question 1", "question 2"])
    budget = await storage.set_budget(env.sessions, name="batches", limit_pico_usd=worst * 100, per="total")
    async with env.client:
        [batch_id] = (await _submit(env, job_id, budget)).batch_ids
        outcome = await _ingest(env, batch_id)
    assert (outcome.succeeded, outcome.failed) == (2, 1)
    [hollow] = [r for r in await env.results(job_id) if r.prompt_id == ids[0]]
    assert hollow.status == "failed" and hollow.cost_pico_usd > 0
    cost, usage, holds = await _ledger(env, job_id)
    # Spent: the two answers and the billed line; nothing left reserved.
    assert usage.spent_pico_usd == cost and (usage.reserved_pico_usd, holds) == (0, [])
    assert usage.left_pico_usd == worst * 100 - cost


async def test_a_follow_up_batch_of_reasks_holds_its_worst_case_and_spends_it_as_any_batch(env: Env) -> None:
    job_id, _ = await env.job(PEOPLE, params=STRUCTURED)
    budget = await storage.set_budget(env.sessions, name="batches", limit_pico_usd=10**12, per="total")
    async with env.client:
        [first] = (await _submit(env, job_id, budget)).batch_ids
        outcome = await _ingest(env, first, budget=budget, max_reasks=2)
        [follow_up] = outcome.reask_batches
        assert (outcome.invalid, outcome.reasked_in_batches, outcome.reasks_over_budget) == (2, 2, 0)
        # The follow-up holds a reservation of its own, at least what its two lines may cost at the batch price.
        cost, usage, holds = await _ledger(env, job_id)
        assert [batch for batch, _ in holds] == [follow_up] and usage.reserved_pico_usd == holds[0][1] > 0
        assert usage.spent_pico_usd == cost
        await _ingest(env, follow_up, budget=budget, max_reasks=2)
    cost, usage, holds = await _ledger(env, job_id)
    assert await env.statuses(job_id) == {"succeeded": 3}
    # Every answer, the re-asks' included, spent out of what its batch held; nothing held after.
    assert usage.spent_pico_usd == cost > 0 and (usage.reserved_pico_usd, holds) == (0, [])


async def test_a_budget_that_cannot_hold_the_reasks_stops_the_follow_up_batch(env: Env) -> None:
    job_id, _ = await env.job(PEOPLE, params=STRUCTURED)
    async with env.client:
        [first] = (await _submit(env, job_id, None)).batch_ids
        # Set once the prompts are out: nothing is left for a re-ask's worst case.
        budget = await storage.set_budget(env.sessions, name="batches", limit_pico_usd=1, per="total")
        outcome = await _ingest(env, first, budget=budget, max_reasks=2)
    assert (outcome.invalid, outcome.reask_batches, outcome.reasks_over_budget) == (2, [], 2)
    assert len(await storage.job_batches(env.sessions, job_id=job_id)) == 1  # no follow-up batch was made
    # Not asked again: the two keep their invalid answers; nothing is reserved or spent by what was not sent.
    assert await env.statuses(job_id) == {"succeeded": 1, "invalid": 2}
    _, usage, holds = await _ledger(env, job_id)
    assert (usage.spent_pico_usd, usage.reserved_pico_usd, holds) == (0, 0, [])
