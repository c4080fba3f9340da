"""Anthropic's Message Batches through the batch steps (submit, poll, ingest, cancel), against the simulator over
real sockets: every batch state, every result line type, a lost create adopted, and a crash between record and create."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from llm_dispatch import storage
from conftest import BatchEnv, Sim
from llm_dispatch.jobs import IngestOutcome, advance_submission, ingest_batch, submit_prompts
from llm_dispatch.jobs._collect import cancel_batches
from llm_dispatch.core import LLMClient, PriceTable, dedupe_key
MODEL = "claude-haiku-4-5"
PRICES = PriceTable.load()


@dataclass
class Env(BatchEnv):

    async def job(self, contents: list[str]) -> tuple[str, list[int]]:
        job_id = await storage.create_job(self.sessions, name="t", fingerprint="a" * 64, input_path=None, model=MODEL,
                                          settings={})
        prompts = []
        for i, content in enumerate(contents):
            messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": content}]
            params = {"max_tokens": 20}
            prompts.append(storage.NewPrompt(
                custom_id=f"c-{i}", position=i, model=MODEL, messages=messages, params=params,
                dedupe_key=dedupe_key(model=MODEL, messages=messages, params=params),
                planned_route="batch", route_reason="test"))
        await storage.add_prompts(self.sessions, job_id=job_id, prompts=prompts)
        return job_id, await storage.unfinished_prompt_ids(self.sessions, job_id=job_id)

    async def submit(self, job_id: str, **options: object) -> list[int]:
        async with storage.ResultWriter(self.sessions, job_id=job_id, prices=PRICES) as writer:
            outcome = await submit_prompts(sessions=self.sessions, clients=self.clients, writer=writer, job_id=job_id,
                                           directory=self.directory, **options)  # type: ignore[arg-type]
        return outcome.batch_ids

    async def finish(self, batch_id: int, *, max_submissions: int = 3) -> IngestOutcome:
        record = await self.poll(batch_id)
        async with storage.ResultWriter(self.sessions, job_id=record.job_id, prices=PRICES) as writer:
            return await ingest_batch(sessions=self.sessions, clients=self.clients, writer=writer, record=record,
                                      directory=self.directory, max_submissions=max_submissions)



@pytest.fixture
async def env(sim: Sim, db_url: str, tmp_path: Path) -> AsyncIterator[Env]:
    sim.configure(batch_processing_seconds=0.3)
    engine = storage.create_engine(db_url)
    await storage.migrate(engine)
    async with LLMClient(provider="anthropic", base_url=sim.root, api_key="sk-ant-sim-key", max_retries=2) as client:
        yield Env(storage.session_factory(engine), client, tmp_path / "batches", sim)
    await engine.dispose()


def message_batches(sim: Sim) -> list[dict]:
    response = httpx.get(f"{sim.root}/v1/messages/batches", params={"limit": 100},
                         headers={"anthropic-version": "2023-06-01"}, timeout=60)
    return response.raise_for_status().json()["data"]


async def test_a_message_batch_answers_every_prompt_priced_at_half(env: Env) -> None:
    job_id, ids = await env.job([f"question {i}" for i in range(6)] + ["question 0"])  # the last repeats the first
    [batch_id] = await env.submit(job_id)
    record = await env.batch(batch_id)
    assert record.provider == "anthropic" and record.input_file_id is None
    assert record.provider_batch_id is not None and record.provider_batch_id.startswith("msgbatch_")
    assert record.request_total == 6  # identical prompts share one request
    outcome = await env.finish(batch_id)
    assert (outcome.status, outcome.succeeded, outcome.failed, outcome.unknown_lines) == ("completed", 7, 0, 0)
    assert await storage.job_counts(env.sessions, job_id=job_id) == {"succeeded": 7}
    rows = await env.results(job_id)
    assert sorted(r.prompt_id for r in rows) == sorted(ids)
    paid = [r for r in rows if r.route == "batch"]
    assert len(paid) == 6 and all(r.discount == "0.5" and r.cost_pico_usd and r.response_id.startswith("msg_")
                                  for r in paid)
    assert all(r.cost_pico_usd * 2 == r.list_cost_pico_usd for r in paid)
    assert env.sim.stats()["message_batches"] == 1 and env.sim.stats()["batches"] == 0


async def test_result_lines_errored_expired_and_succeeded_each_settle_their_prompt(env: Env) -> None:
    job_id, ids = await env.job(["fine [[sim:400]]", "busy [[sim:529]]", "a", "b", "c", "d"])
    env.queue_faults("expire:0.5")  # the first half is answered, the rest of the batch ends as expired lines
    [batch_id] = await env.submit(job_id)
    outcome = await env.finish(batch_id)
    assert outcome.status == "completed"  # Anthropic ends every batch as 'ended'; the lines say what happened
    assert outcome.failed == 1 and outcome.failed_by_code == {"invalid_request_error": 1}
    assert outcome.succeeded == 1  # 'a' (the first half: the 400, the 529, 'a')
    assert outcome.resend == 4  # the overloaded line and the three expired ones
    counts = await storage.job_counts(env.sessions, job_id=job_id)
    assert counts == {"failed": 1, "succeeded": 1, "pending": 4}
    [failure] = [r for r in await env.results(job_id) if r.status == "failed" and r.prompt_id == ids[0]]
    assert failure.error_class == "BatchLineError" and failure.route == "batch"
    retried = [r for r in await env.results(job_id) if r.status == "failed" and r.prompt_id == ids[1]]
    assert [r.error_class for r in retried] == ["BatchLineError"]  # kept as history; the prompt is pending again


async def test_expired_lines_go_in_the_next_batch_and_are_answered_once(env: Env) -> None:
    job_id, ids = await env.job([f"q {i}" for i in range(8)])
    env.queue_faults("expire:0.5")
    [first] = await env.submit(job_id)
    outcome = await env.finish(first)
    assert (outcome.succeeded, outcome.resend, outcome.to_realtime) == (4, 4, 0)
    again = await storage.unfinished_prompt_ids(env.sessions, job_id=job_id)
    assert len(again) == 4
    [second] = await env.submit(job_id, resubmission_of=first)
    assert (await env.finish(second)).succeeded == 4
    assert await storage.job_counts(env.sessions, job_id=job_id) == {"succeeded": 8}
    answered = [r.prompt_id for r in await env.results(job_id) if r.status == "succeeded"]
    assert sorted(answered) == sorted(ids)  # each prompt answered exactly once
    assert env.sim.stats()["message_batches"] == 2


async def test_cancel_keeps_what_was_answered_and_fails_the_canceled_lines(env: Env) -> None:
    env.sim.configure(batch_processing_seconds=3.0)
    job_id, ids = await env.job([f"q {i}" for i in range(200)])
    [batch_id] = await env.submit(job_id)
    await env.poll(batch_id, until=lambda r: r.request_completed >= 20)
    [cancelled] = await cancel_batches(sessions=env.sessions, clients=env.clients, job_id=job_id)
    assert cancelled.cancel_requested and cancelled.status in ("cancelling", "completed")
    outcome = await env.finish(batch_id)
    assert outcome.succeeded >= 20 and outcome.succeeded + outcome.failed == 200 and outcome.resend == 0
    assert outcome.failed_by_code == {"cancelled": outcome.failed}
    failed = {r.error_class for r in await env.results(job_id) if r.status == "failed"}
    assert failed == {"BatchCancelledError"}
    assert await storage.job_counts(env.sessions, job_id=job_id) == {"succeeded": outcome.succeeded,
                                                                      "failed": outcome.failed}


@pytest.mark.parametrize("fault", ["create_lost_hang:2", "create_lost_drop", "create_lost_502"])
async def test_a_lost_create_is_adopted_not_made_twice(env: Env, fault: str) -> None:
    client = LLMClient(provider="anthropic", base_url=env.sim.root, api_key="sk-ant-sim-key", max_retries=2,
                       request_timeout=0.5, file_timeout=0.5)
    await env.check_a_lost_create_is_adopted(fault, client=client, made=lambda: message_batches(env.sim),
                                             counted="message_batches")


async def test_a_crash_after_the_create_left_uploaded_is_adopted_by_the_next_run(env: Env) -> None:
    job_id, ids = await env.job([f"q {i}" for i in range(4)])
    [batch_id] = await env.submit(job_id)
    record = await env.batch(batch_id)
    assert record.provider_batch_id is not None
    made = record.provider_batch_id
    # As a process that died after the create reached Anthropic but before its answer was stored leaves it.
    async with env.sessions.begin() as session:
        await session.execute(storage.Batch.__table__.update().where(storage.Batch.id == batch_id)
                              .values(status="uploaded", provider_batch_id=None))
    record = await env.batch(batch_id)
    record = await advance_submission(sessions=env.sessions, clients=env.clients, record=record)
    assert record.provider_batch_id == made
    assert env.sim.stats()["message_batches"] == 1
    await env.finish(batch_id)
    assert await storage.job_counts(env.sessions, job_id=job_id) == {"succeeded": 4}


async def test_a_batch_is_split_at_the_limit_and_each_part_answered(env: Env) -> None:
    job_id, ids = await env.job([f"q {i}" for i in range(7)])
    batch_ids = await env.submit(job_id, max_requests=3)
    assert len(batch_ids) == 3
    for batch_id in batch_ids:
        await env.finish(batch_id)
    assert await storage.job_counts(env.sessions, job_id=job_id) == {"succeeded": 7}
    assert env.sim.stats()["message_batches"] == 3


async def test_same_size_batches_created_together_each_get_their_own_provider_batch(env: Env) -> None:
    # Message Batches carry no metadata: a look-up could take a sibling's batch of the same size, unless
    # creates take turns and each id is stored before the next look-up.
    job_id, ids = await env.job([f"q {i}" for i in range(8)])
    env.queue_faults("create_lost_502")  # the first create's answer is lost: it is looked up among its siblings
    batch_ids = await env.submit(job_id, max_requests=2)
    records = [await storage.get_batch(env.sessions, batch_id=b) for b in batch_ids]
    made = {b["id"] for b in message_batches(env.sim)}
    assert len(made) == 4 and {r.provider_batch_id for r in records if r is not None} == made
    for batch_id in batch_ids:
        await env.finish(batch_id)
    assert await storage.job_counts(env.sessions, job_id=job_id) == {"succeeded": 8}
    assert sorted(r.prompt_id for r in await env.results(job_id)) == sorted(ids)


async def test_each_kind_of_result_without_an_answer_is_settled_as_anthropic_documents_it(env: Env) -> None:
    """Sent again: errored timeout_error, api_error (and overloaded, rate limit), canceled and expired results;
    failed: the request's or the account's own errors; a succeeded result with no content (billed) is not sent
    again."""
    contents = ["slow [[sim:line_timeout]]", "broken [[sim:503]]", "stopped [[sim:line_cancelled]]",
                "late [[sim:line_expired]]", "key [[sim:401]]", "credit [[sim:402]]", "hollow [[sim:empty_choices]]",
                "fine"]
    job_id, ids = await env.job(contents)
    [batch_id] = await env.submit(job_id)
    outcome = await env.finish(batch_id)
    assert (outcome.succeeded, outcome.resend) == (1, 4)
    assert outcome.failed_by_code == {"authentication_error": 1, "billing_error": 1, "unusable_answer": 1}
    counts = await storage.job_counts(env.sessions, job_id=job_id)
    assert counts == {"pending": 4, "failed": 3, "succeeded": 1}
    rows = {r.prompt_id: r for r in await env.results(job_id)}
    assert rows[ids[0]].error_class == "BatchLineError" and "timed out" in (rows[ids[0]].error_message or "")
    assert "billed" in (rows[ids[6]].error_message or "")
