"""Gemini's Batch Mode through the batch steps (submit, poll, ingest, cancel), against the simulator over real
sockets: inline requests and an uploaded file (the Files API's resumable protocol), every batch state, per-request
errors settled per line, a cancel, a lost create found again by its display name, and a crash between record and
create."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from llm_dispatch import storage
from conftest import BatchEnv, Sim
from test_batch_path import PEOPLE, STRUCTURED
from llm_dispatch.jobs import Clients, IngestOutcome, advance_submission, ingest_batch, submit_prompts
from llm_dispatch.jobs._collect import cancel_batches
from llm_dispatch.core import GeminiBatchApi, LLMClient, PriceTable, dedupe_key

MODEL = "gemini-2.5-flash"
PRICES = PriceTable.load()
KEY = "gemini-sim-key"


@dataclass
class Env(BatchEnv):
    # Bytes a batch may hold inline (20 MB at Google); small in a test, so the file path is taken.
    inline_max_bytes: int | None = None

    @property
    def clients(self) -> Clients:
        clients = Clients.of(self.client)
        if self.inline_max_bytes is not None:
            clients._batch_apis["gemini"] = GeminiBatchApi(self.client, inline_max_bytes=self.inline_max_bytes)
        return clients

    async def job(self, contents: list[str], *, params: dict[str, Any] | None = None) -> tuple[str, list[int]]:
        job_id = await storage.create_job(self.sessions, name="t", fingerprint="g" * 64, input_path=None, model=MODEL,
                                          settings={})
        prompts = []
        for i, content in enumerate(contents):
            messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": content}]
            params = params or {"max_tokens": 20}
            prompts.append(storage.NewPrompt(
                custom_id=f"c-{i}", position=i, model=MODEL, messages=messages, params=params,
                dedupe_key=dedupe_key(model=MODEL, messages=messages, params=params),
                planned_route="batch", route_reason="test"))
        await storage.add_prompts(self.sessions, job_id=job_id, prompts=prompts)
        return job_id, await storage.unfinished_prompt_ids(self.sessions, job_id=job_id)

    async def submit(self, job_id: str, **options: Any) -> list[int]:
        async with storage.ResultWriter(self.sessions, job_id=job_id, prices=PRICES) as writer:
            outcome = await submit_prompts(sessions=self.sessions, clients=self.clients, writer=writer, job_id=job_id,
                                           directory=self.directory, **options)  # type: ignore[arg-type]
        return outcome.batch_ids

    async def finish(self, batch_id: int, *, max_submissions: int = 3, **options: Any) -> IngestOutcome:
        record = await self.poll(batch_id)
        async with storage.ResultWriter(self.sessions, job_id=record.job_id, prices=PRICES) as writer:
            return await ingest_batch(sessions=self.sessions, clients=self.clients, writer=writer, record=record,
                                      directory=self.directory, max_submissions=max_submissions, **options)


@pytest.fixture
async def env(sim: Sim, db_url: str, tmp_path: Path) -> AsyncIterator[Env]:
    sim.configure(batch_processing_seconds=0.3)
    engine = storage.create_engine(db_url)
    await storage.migrate(engine)
    async with LLMClient(provider="gemini", base_url=sim.root, api_key=KEY, max_retries=2) as client:
        yield Env(storage.session_factory(engine), client, tmp_path / "batches", sim)
    await engine.dispose()


def gemini_batches(sim: Sim) -> list[dict]:
    response = httpx.get(f"{sim.root}/v1beta/batches", params={"pageSize": 100}, timeout=5)
    return response.raise_for_status().json().get("operations", [])


@pytest.mark.parametrize("inline", [True, False], ids=["inline", "file"])
async def test_a_gemini_batch_answers_every_prompt_priced_at_half(env: Env, inline: bool) -> None:
    env.inline_max_bytes = None if inline else 100  # over 100 bytes: the Files API
    job_id, ids = await env.job([f"question {i}" for i in range(6)] + ["question 0"])  # the last repeats the first
    [batch_id] = await env.submit(job_id)
    record = await env.batch(batch_id)
    assert record.provider == "gemini" and record.provider_batch_id.startswith("batches/")
    assert (record.input_file_id is None) == inline
    assert inline or record.input_file_id.startswith("files/")
    assert record.request_total == 6  # identical prompts share one request
    outcome = await env.finish(batch_id)
    assert (outcome.status, outcome.succeeded, outcome.failed, outcome.unknown_lines) == ("completed", 7, 0, 0)
    assert await storage.job_counts(env.sessions, job_id=job_id) == {"succeeded": 7}
    rows = await env.results(job_id)
    assert sorted(r.prompt_id for r in rows) == sorted(ids)
    paid = [r for r in rows if r.route == "batch"]
    assert len(paid) == 6 and all(r.discount == "0.5" and r.cost_pico_usd for r in paid)
    assert all(r.cost_pico_usd * 2 == r.list_cost_pico_usd for r in paid)
    [made] = gemini_batches(env.sim)
    assert made["metadata"]["displayName"] == f"llm-dispatch:{job_id}:{batch_id}"
    assert ("fileName" in made["metadata"]["inputConfig"]) != inline
    assert env.sim.stats()["gemini_batches"] == 1 and env.sim.stats()["batches"] == 0


@pytest.mark.parametrize("inline", [True, False], ids=["inline", "file"])
async def test_each_request_without_an_answer_is_settled_by_its_status(env: Env, inline: bool) -> None:
    """Sent again: RESOURCE_EXHAUSTED, UNAVAILABLE, DEADLINE_EXCEEDED, CANCELLED; failed: INVALID_ARGUMENT and
    UNAUTHENTICATED."""
    env.inline_max_bytes = None if inline else 100
    contents = ["quota [[sim:429]]", "busy [[sim:503]]", "slow [[sim:line_timeout]]", "stopped [[sim:line_cancelled]]",
                "bad [[sim:400]]", "key [[sim:401]]", "fine"]
    job_id, ids = await env.job(contents)
    [batch_id] = await env.submit(job_id)
    outcome = await env.finish(batch_id)
    assert (outcome.status, outcome.succeeded, outcome.resend) == ("completed", 1, 4)
    assert outcome.failed_by_code == {"INVALID_ARGUMENT": 1, "UNAUTHENTICATED": 1}
    assert await storage.job_counts(env.sessions, job_id=job_id) == {"succeeded": 1, "failed": 2, "pending": 4}


async def test_an_expired_batch_sends_its_requests_again_in_the_next(env: Env) -> None:
    job_id, ids = await env.job([f"q {i}" for i in range(8)])
    env.queue_faults("expire:0.5")
    [first] = await env.submit(job_id)
    outcome = await env.finish(first)
    assert outcome.status == "expired" and outcome.succeeded == 0 and outcome.resend == 8
    [second] = await env.submit(job_id, resubmission_of=first)
    assert (await env.finish(second)).succeeded == 8
    assert await storage.job_counts(env.sessions, job_id=job_id) == {"succeeded": 8}
    assert env.sim.stats()["gemini_batches"] == 2


async def test_a_failed_create_is_kept_and_nothing_is_answered(env: Env) -> None:
    job_id, ids = await env.job(["a", "b"])
    env.queue_faults("fail_validation")
    with pytest.raises(ExceptionGroup) as raised:
        await env.submit(job_id)
    [error] = raised.value.exceptions
    assert "HTTP 400" in str(error) and "batchGenerateContent" in str(error) and "fail_validation" in str(error)
    assert env.sim.stats()["gemini_batches"] == 0
    assert await storage.job_counts(env.sessions, job_id=job_id) == {"batched": 2}


async def test_cancel_keeps_what_was_answered_and_fails_the_cancelled_requests(env: Env) -> None:
    env.sim.configure(batch_processing_seconds=3.0)
    env.inline_max_bytes = 100
    job_id, ids = await env.job([f"q {i}" for i in range(200)])
    [batch_id] = await env.submit(job_id)
    await env.poll(batch_id, until=lambda r: r.request_completed >= 20)
    [cancelled] = await cancel_batches(sessions=env.sessions, clients=env.clients, job_id=job_id)
    assert cancelled.cancel_requested
    outcome = await env.finish(batch_id)
    assert outcome.status == "cancelled"
    assert outcome.succeeded >= 20 and outcome.succeeded + outcome.failed == 200 and outcome.resend == 0
    assert outcome.failed_by_code == {"cancelled": outcome.failed}
    assert await storage.job_counts(env.sessions, job_id=job_id) == {"succeeded": outcome.succeeded,
                                                                      "failed": outcome.failed}


@pytest.mark.parametrize("fault", ["create_lost_hang:2", "create_lost_drop", "create_lost_502"])
async def test_a_lost_create_is_found_by_its_display_name_not_made_twice(env: Env, fault: str) -> None:
    client = LLMClient(provider="gemini", base_url=env.sim.root, api_key=KEY, max_retries=2,
                       request_timeout=0.5, file_timeout=0.5)
    await env.check_a_lost_create_is_adopted(fault, client=client, made=lambda: [
        {"id": batch["name"]} for batch in gemini_batches(env.sim)], counted="gemini_batches")


@pytest.mark.parametrize("inline", [True, False], ids=["inline", "file"])
async def test_a_crash_after_the_create_left_uploaded_is_adopted_by_the_next_run(env: Env, inline: bool) -> None:
    env.inline_max_bytes = None if inline else 100
    job_id, ids = await env.job([f"q {i}" for i in range(4)])
    [batch_id] = await env.submit(job_id)
    made = (await env.batch(batch_id)).provider_batch_id
    assert made is not None
    # As a process killed after the create reached Google but before its answer was stored leaves it.
    async with env.sessions.begin() as session:
        await session.execute(storage.Batch.__table__.update().where(storage.Batch.id == batch_id)
                              .values(status="uploaded", provider_batch_id=None))
    record = await advance_submission(sessions=env.sessions, clients=env.clients, record=await env.batch(batch_id))
    assert record.provider_batch_id == made
    assert env.sim.stats()["gemini_batches"] == 1
    await env.finish(batch_id)
    assert await storage.job_counts(env.sessions, job_id=job_id) == {"succeeded": 4}


async def test_an_upload_cut_short_leaves_the_batch_preparing_and_the_next_run_uploads_it_once(env: Env) -> None:
    env.inline_max_bytes = 100
    job_id, ids = await env.job([f"q {i}" for i in range(6)])
    env.queue_faults("hang_upload:30")  # the upload's last chunk is held: the client gives up, as a killed run would
    impatient = LLMClient(provider="gemini", base_url=env.sim.root, api_key=KEY, max_retries=0, request_timeout=0.5,
                          file_timeout=0.5)
    async with impatient as env.client:
        with pytest.raises(ExceptionGroup):
            await env.submit(job_id)
    [record] = await storage.unfinished_batches(env.sessions, job_id=job_id)
    assert (record.status, record.input_file_id, record.provider_batch_id) == ("preparing", None, None)
    assert env.sim.stats()["gemini_uploads"] == 1 and gemini_batches(env.sim) == []
    async with LLMClient(provider="gemini", base_url=env.sim.root, api_key=KEY, max_retries=2) as env.client:
        record = await advance_submission(sessions=env.sessions, clients=env.clients, record=record)
        assert record.input_file_id is not None and record.input_file_id.startswith("files/")
        await env.finish(record.id)
    assert env.sim.stats()["gemini_uploads"] == 2 and len(gemini_batches(env.sim)) == 1
    assert await storage.job_counts(env.sessions, job_id=job_id) == {"succeeded": 6}
    assert env.sim.stats()["gemini_batch_lines"] == 6


async def test_invalid_answers_are_asked_again_in_a_gemini_follow_up_batch_held_by_the_budget(env: Env) -> None:
    job_id, _ = await env.job(PEOPLE, params=STRUCTURED)
    budget = await storage.set_budget(env.sessions, name="gemini", limit_pico_usd=10**12, per="total")
    [first] = await env.submit(job_id, budget=budget)
    outcome = await env.finish(first, budget=budget, max_reasks=2)
    [follow_up] = outcome.reask_batches
    assert (outcome.invalid, outcome.reasked_in_batches, outcome.reasks_over_budget) == (2, 2, 0)
    assert (await env.batch(follow_up)).provider == "gemini"
    [usage] = await storage.budget_usage(env.sessions, name="gemini")
    assert usage.reserved_pico_usd > 0  # the follow-up batch holds its worst case at the batch price
    await env.finish(follow_up, budget=budget, max_reasks=2)
    assert await storage.job_counts(env.sessions, job_id=job_id) == {"succeeded": 3}
    [usage] = await storage.budget_usage(env.sessions, name="gemini")
    spent = sum(r.cost_pico_usd or 0 for r in await env.results(job_id))
    assert usage.spent_pico_usd == spent > 0 and usage.reserved_pico_usd == 0
    made = gemini_batches(env.sim)
    assert len(made) == 2 and all(batch["metadata"]["model"] == f"models/{MODEL}" for batch in made)
