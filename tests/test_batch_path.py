"""The Batch API path without Prefect: submit, poll, ingest and settle, against the simulator over real sockets."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from sqlalchemy import func, select

from llm_dispatch import storage
from conftest import BatchEnv, Sim
from test_storage import answer
from llm_dispatch.core import BATCH_ID_KEY, JOB_ID_KEY, BadRequestError, LLMClient, OpenAIBatchApi
from llm_dispatch.core._types import dedupe_key
from llm_dispatch.storage import Prompt, Result, Sessions
from llm_dispatch.jobs import ingest_batch
from llm_dispatch.jobs import advance_submission, submit_prompts


@dataclass
class Env(BatchEnv):

    async def job(self, contents: list[str], *, deadline: datetime | None = None,
                  params: dict[str, Any] | None = None) -> tuple[str, list[int]]:
        job_id = await storage.create_job(
            self.sessions, name="t", fingerprint=f"{len(contents):064d}", input_path=None, model="gpt-4o-mini",
            settings={})
        params = params or {"max_tokens": 20}
        prompts = []
        for i, content in enumerate(contents):
            messages = [{"role": "user", "content": content}]
            prompts.append(storage.NewPrompt(
                custom_id=f"c-{i}", position=i, model="gpt-4o-mini", messages=messages, params=params,
                dedupe_key=dedupe_key(model="gpt-4o-mini", messages=messages, params=params),
                planned_route="batch", route_reason="test", deadline=deadline))
        await storage.add_prompts(self.sessions, job_id=job_id, prompts=prompts)
        ids = await storage.unfinished_prompt_ids(self.sessions, job_id=job_id)
        return job_id, ids

    async def submit(self, job_id: str, **kwargs: object) -> list[int]:
        async with storage.ResultWriter(self.sessions, job_id=job_id) as writer:
            outcome = await submit_prompts(
                sessions=self.sessions, clients=self.clients, writer=writer, job_id=job_id,
                directory=self.directory, **kwargs)  # type: ignore[arg-type]
        return outcome.batch_ids

    async def finish(self, batch_id: int, *, max_submissions: int = 3, now: datetime | None = None,
                     max_reasks: int = 0):
        record = await self.poll(batch_id)
        async with storage.ResultWriter(self.sessions, job_id=record.job_id) as writer:
            return await ingest_batch(sessions=self.sessions, clients=self.clients, writer=writer, record=record,
                                      directory=self.directory, max_submissions=max_submissions, now=now,
                                      max_reasks=max_reasks)

    async def statuses(self, job_id: str) -> dict[str, int]:
        return await storage.job_counts(self.sessions, job_id=job_id)


    async def prompts(self, job_id: str) -> list[Prompt]:
        async with self.sessions() as session:
            return list((await session.scalars(select(Prompt).where(Prompt.job_id == job_id).order_by(Prompt.position))).all())


PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
STRUCTURED = {"max_tokens": 100,
              "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON,
                                                                         "strict": True}}}
# One valid answer, two invalid ones (the simulator breaks the first answer only: asked again, they are valid).
PEOPLE = ["Invent a person.", "Invent a person. [[sim:wrong_type]]", "Invent a person. [[sim:missing_field]]"]


@asynccontextmanager
async def batch_env(sim: Sim, url: str, tmp_path: Path) -> AsyncIterator[Env]:
    sim.configure(batch_processing_seconds=0.3)
    engine = storage.create_engine(url)
    await storage.migrate(engine)
    async with LLMClient(base_url=sim.base_url, api_key=None, max_retries=2) as client:
        yield Env(storage.session_factory(engine), client, tmp_path / "batches", sim)
    await engine.dispose()


@pytest.fixture
async def env(sim: Sim, db_url: str, tmp_path: Path) -> AsyncIterator[Env]:
    async with batch_env(sim, db_url, tmp_path) as made:
        yield made


@pytest.fixture(params=["sqlite", "postgresql"])
def any_db_url(request: pytest.FixtureRequest) -> str:
    """This test's SQLite file, then a PostgreSQL database of its own (skipped when none is configured)."""
    return str(request.getfixturevalue("db_url" if request.param == "sqlite" else "pg_url"))


@pytest_asyncio.fixture(loop_scope="function")  # the test's loop: an asyncpg connection is bound to its loop
async def any_env(sim: Sim, any_db_url: str, tmp_path: Path) -> AsyncIterator[Env]:
    async with batch_env(sim, any_db_url, tmp_path) as made:
        yield made


def provider_batches(sim: Sim) -> list[dict]:
    return httpx.get(f"{sim.base_url}/batches", params={"limit": 100}, timeout=60).raise_for_status().json()["data"]


async def test_happy_path_one_line_per_distinct_request_every_answer_stored(env: Env) -> None:
    contents = [f"question {i}" for i in range(30)] + ["question 3"]  # the last repeats one
    job_id, ids = await env.job(contents)
    [batch_id] = await env.submit(job_id)

    record = await env.batch(batch_id)
    assert record.provider_batch_id and record.request_total == 30
    assert await env.statuses(job_id) == {"batched": 31}
    [provider] = provider_batches(env.sim)
    assert provider["metadata"] == {JOB_ID_KEY: job_id, BATCH_ID_KEY: str(batch_id)}

    outcome = await env.finish(batch_id)
    assert (outcome.status, outcome.succeeded, outcome.failed, outcome.resend) == ("completed", 31, 0, 0)
    assert await env.statuses(job_id) == {"succeeded": 31}
    results = await env.results(job_id)
    assert sorted(r.route for r in results).count("batch") == 30
    assert [r.route for r in results].count("reused") == 1
    assert all(r.text and r.prompt_tokens and r.completion_tokens for r in results if r.route == "batch")
    record = await env.batch(batch_id)
    assert record.status == "ingested" and record.request_completed == 30


async def test_files_split_at_the_providers_limit(env: Env) -> None:
    job_id, ids = await env.job([f"q {i}" for i in range(25)])
    batch_ids = await env.submit(job_id, max_requests=10)
    assert len(batch_ids) == 3
    totals = [(await storage.get_batch(env.sessions, batch_id=b)).request_total for b in batch_ids]  # type: ignore[union-attr]
    assert totals == [10, 10, 5]
    for batch_id in batch_ids:
        await env.finish(batch_id)
    assert await env.statuses(job_id) == {"succeeded": 25}



async def test_identical_prompts_pages_apart_share_one_line_and_are_reused_later(env: Env) -> None:
    # Read two prompts a page: the four "same" prompts (stored far apart) span pages, yet make one line.
    contents = ["same", "a", "b", "same", "c", "same", "d", "same"]
    job_id, ids = await env.job(contents)
    [batch_id] = await env.submit(job_id, page=2)
    record = await env.batch(batch_id)
    assert record.request_total == 5
    members = await storage.batch_members(env.sessions, batch_id=batch_id)
    assert sorted(len(prompt_ids) for prompt_ids in members.values()) == [1, 1, 1, 1, 4]
    await env.finish(batch_id)
    assert await env.statuses(job_id) == {"succeeded": 8}
    assert sorted(r.route for r in await env.results(job_id)) == ["batch"] * 5 + ["reused"] * 3

    # A later job asking the same, page by page: every stored answer is reused, only the new request is sent.
    again, _ = await env.job([*contents, "new"])
    [batch_id] = await env.submit(again, page=2)
    record = await env.batch(batch_id)
    assert record.request_total == 1
    await env.finish(batch_id)
    assert sorted(r.route for r in await env.results(again)) == ["batch"] + ["reused"] * 8


async def test_a_request_repeated_in_the_job_but_open_once_is_one_line_of_its_open_prompt(env: Env) -> None:
    # "same" is asked three times, but one of them failed for good and one is answered: the job repeats the
    # request, and only its third prompt is open (the repeated keys are the job's, read from its index alone).
    contents = ["same", "a", "same", "b", "same", "c"]
    job_id, ids = await env.job(contents)
    async with storage.ResultWriter(env.sessions, job_id=job_id) as writer:
        await writer.failure(prompt_ids=[ids[0]], error=BadRequestError("bad", status_code=400))
    await storage.mark_in_flight(env.sessions, prompt_ids=[ids[2]])
    async with storage.ResultWriter(env.sessions, job_id=job_id) as writer:
        await writer.success(prompt_ids=[ids[2]], result=answer())
    [batch_id] = await env.submit(job_id, page=1, retry_failed="retryable")
    members = await storage.batch_members(env.sessions, batch_id=batch_id)
    # The answered one's answer is reused for the open "same": only a, b and c are sent.
    assert sorted(pid for group in members.values() for pid in group) == [ids[1], ids[3], ids[5]]
    assert (await env.batch(batch_id)).request_total == 3
    await env.finish(batch_id)
    assert await env.statuses(job_id) == {"failed": 1, "succeeded": 5}
    # Without a stored answer to reuse, the open prompt of a request the job repeats is one line of its own.
    again, again_ids = await env.job([f"{text} again" for text in contents])
    async with storage.ResultWriter(env.sessions, job_id=again) as writer:
        await writer.failure(prompt_ids=[again_ids[0], again_ids[2]], error=BadRequestError("bad", status_code=400))
    [batch_id] = await env.submit(again, page=1)
    members = await storage.batch_members(env.sessions, batch_id=batch_id)
    assert sorted(members.values()) == sorted([[again_ids[i]] for i in (1, 3, 4, 5)])


async def test_a_submission_reads_a_page_of_rows_at_a_time_and_records_each_file_when_complete(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id, ids = await env.job([f"q {i % 7}" for i in range(40)])  # 7 requests, each asked 5 or 6 times
    pages: list[int] = []
    recorded_after_pages: list[int] = []
    unfinished_work_in_order, create_batch_record = storage.unfinished_work_in_order, storage.create_batch_record

    async def counted_pages(*args: Any, **kwargs: Any) -> AsyncIterator[list[storage.WorkRow]]:
        async for rows in unfinished_work_in_order(*args, **kwargs):
            pages.append(len(rows))
            yield rows

    async def counted_record(*args: Any, **kwargs: Any) -> int:
        recorded_after_pages.append(len(pages))
        return await create_batch_record(*args, **kwargs)

    async def whole_job(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a submission must not load its prompts by id list")

    monkeypatch.setattr(storage, "unfinished_work_in_order", counted_pages)
    monkeypatch.setattr(storage, "create_batch_record", counted_record)
    monkeypatch.setattr(storage, "load_work", whole_job)
    batch_ids = await env.submit(job_id, page=4, max_requests=3)

    assert max(pages) <= 4  # rows with their requests: a page at a time
    # Each request's other prompts were found by request and batched with its first: later pages skip them.
    assert sum(pages) < 40 and await env.statuses(job_id) == {"batched": 40}
    assert len(batch_ids) == 3  # 7 lines, 3 a file
    # The first file is recorded (and sent) before the last page is read.
    assert recorded_after_pages[0] < len(pages)
    monkeypatch.undo()
    for batch_id in batch_ids:
        await env.finish(batch_id)
    assert await env.statuses(job_id) == {"succeeded": 40}

async def test_expired_batch_keeps_every_answer_and_resends_only_the_rest(env: Env) -> None:
    job_id, ids = await env.job([f"question {i}" for i in range(20)])
    env.queue_faults("expire:0.5")
    [first] = await env.submit(job_id)
    outcome = await env.finish(first)
    assert (outcome.status, outcome.succeeded, outcome.failed) == ("expired", 10, 0)
    assert outcome.resend == 10
    assert await env.statuses(job_id) == {"succeeded": 10, "pending": 10}

    rest = await storage.unfinished_prompt_ids(env.sessions, job_id=job_id, planned_route="batch")
    assert len(rest) == 10
    [second] = await env.submit(job_id, resubmission_of=first)
    record = await env.batch(second)
    assert record.request_total == 10 and record.resubmission_of == first
    await env.finish(second)
    assert await env.statuses(job_id) == {"succeeded": 20}
    # Every prompt has exactly one success: none paid twice.
    successes = [r.prompt_id for r in await env.results(job_id) if r.status == "succeeded"]
    assert sorted(successes) == sorted(ids)


async def test_expired_batch_sends_prompts_real_time_when_their_deadline_is_near(env: Env) -> None:
    now = datetime.now(UTC)
    job_id, ids = await env.job([f"q {i}" for i in range(4)], deadline=now + timedelta(hours=30))
    env.queue_faults("expire:0.5")
    [batch_id] = await env.submit(job_id)
    # Ten hours later another 24 h window would end after the deadline.
    outcome = await env.finish(batch_id, now=now + timedelta(hours=10))
    assert outcome.to_realtime == 2
    assert await storage.unfinished_prompt_ids(env.sessions, job_id=job_id, planned_route="batch") == []
    late = await storage.unfinished_prompt_ids(env.sessions, job_id=job_id, planned_route="realtime")
    assert len(late) == 2
    reasons = {p.route_reason for p in await env.prompts(job_id) if p.id in late}
    assert reasons == {"deadline no longer leaves room for another batch window; sent real-time"}


async def test_failed_validation_fails_every_member_with_the_providers_reason(env: Env) -> None:
    job_id, ids = await env.job([f"q {i}" for i in range(5)])
    env.queue_faults("fail_validation")
    [batch_id] = await env.submit(job_id)
    outcome = await env.finish(batch_id)
    assert (outcome.status, outcome.failed) == ("failed", 5)
    assert await env.statuses(job_id) == {"failed": 5}
    results = await env.results(job_id)
    assert {r.error_class for r in results} == {"BatchFailedError"}
    assert all("failed validation at the provider" in (r.error_message or "") for r in results)
    assert all(p.failed_retryable is False for p in await env.prompts(job_id))


async def test_line_errors_final_ones_fail_retryable_ones_go_again(env: Env) -> None:
    contents = ["fine", "refused [[sim:400]]", "flaky [[sim:500x1]]", "fine too"]
    job_id, ids = await env.job(contents)
    [first] = await env.submit(job_id)
    outcome = await env.finish(first)
    assert (outcome.succeeded, outcome.failed, outcome.resend) == (2, 1, 1)
    prompts = {p.custom_id: p for p in await env.prompts(job_id)}
    assert (prompts["c-1"].status, prompts["c-1"].last_error_class) == ("failed", "BadRequestError")
    assert prompts["c-2"].status == "pending"

    assert await storage.unfinished_prompt_ids(env.sessions, job_id=job_id, planned_route="batch") == [prompts["c-2"].id]
    [second] = await env.submit(job_id, resubmission_of=first)
    await env.finish(second)
    assert await env.statuses(job_id) == {"succeeded": 3, "failed": 1}
    history = [(r.status, r.http_status) for r in await env.results(job_id) if r.prompt_id == prompts["c-2"].id]
    assert history == [("failed", 500), ("succeeded", 200)]


UNANSWERED_IN_1 = "unanswered in 1 batch; sent real-time"


async def test_retryable_line_errors_go_real_time_after_max_submissions(env: Env) -> None:
    job_id, ids = await env.job(["always down [[sim:503]]", "refused [[sim:400]]"])
    [batch_id] = await env.submit(job_id)
    outcome = await env.finish(batch_id, max_submissions=1)
    assert (outcome.failed, outcome.resend, outcome.to_realtime) == (1, 1, 1)
    down, refused = await env.prompts(job_id)
    assert (down.status, down.planned_route, down.route_reason) == ("pending", "realtime", UNANSWERED_IN_1)
    assert (refused.status, refused.planned_route, refused.last_error_class) == ("failed", "batch", "BadRequestError")
    assert [(r.status, r.http_status) for r in await env.results(job_id) if r.prompt_id == down.id] == [("failed", 503)]


async def test_expired_batch_past_max_submissions_goes_real_time(env: Env) -> None:
    job_id, ids = await env.job([f"q {i}" for i in range(6)])
    env.queue_faults("expire:0.5")
    [batch_id] = await env.submit(job_id)
    outcome = await env.finish(batch_id, max_submissions=1)
    assert (outcome.status, outcome.succeeded, outcome.failed, outcome.to_realtime) == ("expired", 3, 0, 3)
    late = await storage.unfinished_prompt_ids(env.sessions, job_id=job_id, planned_route="realtime")
    assert len(late) == 3 and await storage.unfinished_prompt_ids(env.sessions, job_id=job_id, planned_route="batch") == []
    assert {p.route_reason for p in await env.prompts(job_id) if p.id in late} == {UNANSWERED_IN_1}
    # The expiry stays in the history of each, as an error row nobody paid for.
    history = [(r.prompt_id, r.error_class) for r in await env.results(job_id) if r.status == "failed"]
    assert sorted(history) == [(pid, "BatchLineError") for pid in sorted(late)]


async def test_cancel_keeps_what_completed_and_fails_the_rest(env: Env) -> None:
    env.sim.configure(batch_processing_seconds=3.0)
    job_id, ids = await env.job([f"q {i}" for i in range(400)])
    [batch_id] = await env.submit(job_id)
    record = await env.poll(batch_id, until=lambda r: r.request_completed >= 50)
    await storage.update_batch(env.sessions, batch_id=batch_id, cancel_requested=True)
    await OpenAIBatchApi(env.client).cancel(record.provider_batch_id)  # type: ignore[arg-type]
    outcome = await env.finish(batch_id)
    assert outcome.status == "cancelled"
    assert outcome.succeeded >= 50 and outcome.succeeded + outcome.failed == 400
    counts = await env.statuses(job_id)
    assert counts == {"succeeded": outcome.succeeded, "failed": outcome.failed}
    assert {r.error_class for r in await env.results(job_id) if r.status == "failed"} == {"BatchCancelledError"}


async def uploaded_batch(env: Env, job_id: str, ids: list[int]) -> storage.BatchRecord:
    """A batch recorded and uploaded, not yet created: where a process that died before the create left it."""
    from llm_dispatch.core import ChatRequest, write_batch_files

    [file] = write_batch_files(
        [(f"p{pid}", ChatRequest(model="gpt-4o-mini", messages=[{"role": "user", "content": f"q {i}"}],
                                 params={"max_tokens": 20})) for i, pid in enumerate(ids)],
        directory=env.directory)
    batch_id = await storage.create_batch_record(env.sessions, job_id=job_id, model="gpt-4o-mini",
                                                 members=[(pid, f"p{pid}") for pid in ids], file_path=str(file.path))
    uploaded = await OpenAIBatchApi(env.client).upload_file(file.path)
    await storage.update_batch(env.sessions, batch_id=batch_id, status="uploaded", input_file_id=uploaded.id)
    record = await env.batch(batch_id)
    return record


async def test_a_create_that_reached_the_provider_is_adopted_not_repeated(env: Env) -> None:
    job_id, ids = await env.job([f"q {i}" for i in range(3)])
    record = await uploaded_batch(env, job_id, ids)
    batch_id = record.id
    # The process created the batch, then died before storing its id.
    assert record.input_file_id is not None
    created = await OpenAIBatchApi(env.client).create_batch(
        input_file_id=record.input_file_id, metadata={JOB_ID_KEY: job_id, BATCH_ID_KEY: str(batch_id)})

    record = await advance_submission(sessions=env.sessions, clients=env.clients, record=record)
    assert record.provider_batch_id == created.id
    assert len(provider_batches(env.sim)) == 1
    await env.finish(batch_id)
    assert await env.statuses(job_id) == {"succeeded": 3}


@pytest.mark.parametrize("fault", ["create_lost_hang:2", "create_lost_drop", "create_lost_502"])
async def test_a_lost_create_answer_is_looked_up_not_created_again(env: Env, fault: str) -> None:
    client = LLMClient(base_url=env.sim.base_url, max_retries=2, request_timeout=0.5)
    await env.check_a_lost_create_is_adopted(fault, client=client, made=lambda: provider_batches(env.sim),
                                             counted="batches")


async def test_a_create_that_made_no_batch_is_tried_again(env: Env) -> None:
    job_id, ids = await env.job([f"q {i}" for i in range(3)])
    env.queue_faults("hang_create:0.05")  # answers 503 and makes nothing
    [batch_id] = await env.submit(job_id)
    assert env.sim.stats()["batches"] == 1
    await env.finish(batch_id)
    assert await env.statuses(job_id) == {"succeeded": 3}


async def test_a_create_given_up_says_so_and_the_next_run_creates_it_once(env: Env) -> None:
    from llm_dispatch.core import InternalServerError

    job_id, ids = await env.job([f"q {i}" for i in range(3)])
    record = await uploaded_batch(env, job_id, ids)
    env.queue_faults("hang_create:0.05", "hang_create:0.05")
    with pytest.raises(InternalServerError, match=rf"Batch {record.id} of job {job_id} was not created after 2 "
                                                  "attempts.*never made twice") as raised:
        await advance_submission(sessions=env.sessions, clients=env.clients, record=record, max_retries=1)
    assert raised.value.attempts == 2 and raised.value.status_code == 503
    assert provider_batches(env.sim) == []
    record = await env.batch(record.id)
    assert record.status == "uploaded"

    record = await advance_submission(sessions=env.sessions, clients=env.clients, record=record)
    assert [b["id"] for b in provider_batches(env.sim)] == [record.provider_batch_id]
    await env.finish(record.id)
    assert await env.statuses(job_id) == {"succeeded": 3}


async def test_a_batch_left_preparing_without_its_file_is_written_again(env: Env) -> None:
    job_id, ids = await env.job([f"q {i}" for i in range(3)])
    batch_id = await storage.create_batch_record(
        env.sessions, job_id=job_id, model="gpt-4o-mini", members=[(pid, f"p{pid}") for pid in ids],
        file_path=str(env.directory / "gone.jsonl"))
    record = await env.batch(batch_id)
    record = await advance_submission(sessions=env.sessions, clients=env.clients, record=record)
    assert record.provider_batch_id is not None and record.request_total == 3
    await env.finish(batch_id)
    assert await env.statuses(job_id) == {"succeeded": 3}


async def test_ingesting_twice_writes_each_answer_once(env: Env) -> None:
    job_id, ids = await env.job([f"q {i}" for i in range(6)])
    [batch_id] = await env.submit(job_id)
    await env.finish(batch_id)
    record = await env.batch(batch_id)
    # Say the process died after writing the results and before marking the batch ingested.
    async with env.sessions.begin() as session:
        from sqlalchemy import update

        await session.execute(update(storage.Batch).where(storage.Batch.id == batch_id).values(status="completed"))
    record = await storage.get_batch(env.sessions, batch_id=batch_id)
    async with storage.ResultWriter(env.sessions, job_id=job_id) as writer:
        outcome = await ingest_batch(sessions=env.sessions, clients=env.clients, writer=writer, record=record,  # type: ignore[arg-type]
                                     directory=env.directory, max_submissions=3)
    assert (outcome.succeeded, outcome.failed, outcome.resend) == (0, 0, 0)
    async with env.sessions() as session:
        assert (await session.execute(select(func.count()).select_from(Result))).scalar_one() == 6


async def test_each_kind_of_line_without_an_answer_is_settled_as_openai_says(env: Env) -> None:
    """Sent again: batch_expired (documented), batch_cancelled and request_timeout (seen in practice), a 429 line;
    failed: a 400 line, and a 200 line with no answer (billed, so never sent again)."""
    contents = ["late [[sim:line_expired]]", "stopped [[sim:line_cancelled]]", "slow [[sim:line_timeout]]",
                "busy [[sim:429]]", "bad [[sim:400]]", "hollow [[sim:empty_choices]]", "fine"]
    job_id, ids = await env.job(contents)
    [batch_id] = await env.submit(job_id)
    outcome = await env.finish(batch_id)
    assert (outcome.succeeded, outcome.resend) == (1, 4)
    assert outcome.failed_by_code == {"invalid_request_error": 1, "unusable_answer": 1}
    prompts = {p.custom_id: (p.status, p.failed_retryable, p.last_error_class) for p in await env.prompts(job_id)}
    assert [prompts[f"c-{i}"][0] for i in range(7)] == [
        "pending", "pending", "pending", "pending", "failed", "failed", "succeeded"]
    assert prompts["c-4"][1:] == (False, "BadRequestError")
    assert prompts["c-5"][1:] == (False, "BatchLineError")
    hollow = [r for r in await env.results(job_id) if r.prompt_id == ids[5]]
    assert hollow[0].error_message and "billed" in hollow[0].error_message


async def test_a_follow_up_batch_that_fails_leaves_each_prompt_invalid_with_its_failed_reask(env: Env) -> None:
    job_id, _ = await env.job(PEOPLE, params=STRUCTURED)
    async with env.client:
        [first] = await env.submit(job_id)
        env.queue_faults("fail_validation")  # the next batch made: the follow-up of the two invalid answers
        [follow_up] = (await env.finish(first, max_reasks=2)).reask_batches
        outcome = await env.finish(follow_up, max_reasks=2)
    assert (outcome.status, outcome.reasks_failed, outcome.failed, outcome.resend) == ("failed", 2, 0, 0)
    # Each keeps its invalid answer; its failed re-ask is a row of its own, with the batch's error.
    assert await env.statuses(job_id) == {"succeeded": 1, "invalid": 2}
    async with env.sessions() as session:
        found = (await session.execute(select(Prompt.custom_id, Result.reask, Result.status, Result.error_class)
                                       .join(Result, Result.prompt_id == Prompt.id)
                                       .where(Prompt.custom_id != "c-0").order_by(Prompt.custom_id, Result.id))).all()
    assert [tuple(row) for row in found] == [("c-1", 0, "invalid", None), ("c-1", 1, "failed", "BatchFailedError"),
                                            ("c-2", 0, "invalid", None), ("c-2", 1, "failed", "BatchFailedError")]


async def test_one_step_of_a_batch_says_what_happened_errors_kept_then_cleared_left_past_its_grace(env: Env) -> None:
    from llm_dispatch.core import PriceTable, Settings
    from llm_dispatch.jobs import JobRun, advance_batch
    from llm_dispatch.jobs._batch_trouble import BATCH_RETRY_FIRST

    env.sim.configure(batch_processing_seconds=60.0)  # open for as long as the test looks at it
    env.queue_faults("unreachable:3")  # the client tries each call three times (max_retries=2)
    job_id, _ = await env.job(["q 0", "q 1"])
    [batch_id] = await env.submit(job_id)
    run = JobRun(settings=Settings(), sessions=env.sessions, clients=env.clients, prices=PriceTable.load())
    ingests: list[int] = []

    async def ingest(*, run: JobRun, batch_id: int) -> Any:
        ingests.append(batch_id)

    now = datetime.now(UTC)
    errored = await advance_batch(run=run, record=await env.batch(batch_id), ingest=ingest, now=now,
                                  leave_after_errors=2)
    assert (errored.happened, errored.following, errored.polled) == ("errored", True, False)
    assert errored.problem is not None and errored.problem.errors_in_a_row == 1
    assert errored.problem.retry_after == now + BATCH_RETRY_FIRST and errored.record.error_count == 1

    opened = await advance_batch(run=run, record=errored.record, ingest=ingest, now=now)
    assert (opened.happened, opened.polled, opened.record.error_count) == ("open", True, 0)  # the error cleared
    assert opened.record.expires_at is not None

    grace = timedelta(hours=1)
    late = opened.record.expires_at + grace + timedelta(seconds=1)
    left = await advance_batch(run=run, record=opened.record, ingest=ingest, grace=grace, now=late)
    assert (left.happened, left.following, left.released) == ("left", False, False) and "after its expiry" in left.why
    assert ingests == []


async def test_one_step_finishes_only_a_stale_half_submitted_batch_and_loses_one_the_provider_forgot(env: Env) -> None:
    from llm_dispatch.core import PriceTable, Settings
    from llm_dispatch.jobs import JobRun, advance_batch

    env.sim.configure(batch_processing_seconds=60.0)
    job_id, ids = await env.job(["q 0", "q 1"])
    run = JobRun(settings=Settings(), sessions=env.sessions, clients=env.clients, prices=PriceTable.load())

    async def ingest(*, run: JobRun, batch_id: int) -> Any:
        raise AssertionError("nothing here has finished")

    async def finish(*, run: JobRun, batch_id: int) -> storage.BatchRecord:
        return await advance_submission(sessions=env.sessions, clients=env.clients, record=await env.batch(batch_id))

    uploaded = await uploaded_batch(env, job_id, ids)
    young = await advance_batch(run=run, record=uploaded, ingest=ingest, finish=finish,
                                stale_before=uploaded.updated_at - timedelta(minutes=10))
    assert young.happened == "left" and not young.polled and "still uploaded" in young.why
    assert provider_batches(env.sim) == []

    stale = await advance_batch(run=run, record=uploaded, ingest=ingest, finish=finish,
                                stale_before=uploaded.updated_at + timedelta(seconds=1))
    assert (stale.happened, stale.following, stale.released) == ("submitted", True, True)
    [made] = provider_batches(env.sim)
    assert stale.record.provider_batch_id == made["id"]

    httpx.post(f"{env.sim.root}/_sim/batch_trouble", json={"batch_id": made["id"], "trouble": "forget"},
               timeout=60).raise_for_status()
    lost = await advance_batch(run=run, record=stale.record, ingest=ingest)
    assert (lost.happened, lost.following, lost.released) == ("lost", False, True)
    assert lost.problem is not None and lost.problem.released == 2 and lost.record.status == "lost"
    assert await env.statuses(job_id) == {"pending": 2}


async def test_an_ingest_in_many_slices_stores_each_answer_once(any_env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """Slices stored while the next are read (two at once on PostgreSQL), committed in whatever order: each prompt
    gets one row, and the outcome counts them all."""
    from llm_dispatch.jobs import _collect

    monkeypatch.setattr(_collect, "READ_SLICE", 3)
    monkeypatch.setattr(_collect, "STORE_SLICE", 4)
    job_id, ids = await any_env.job([f"q {i}" for i in range(41)])
    [batch_id] = await any_env.submit(job_id)
    outcome = await any_env.finish(batch_id)
    assert (outcome.succeeded, outcome.failed, outcome.resend) == (41, 0, 0)
    assert await any_env.statuses(job_id) == {"succeeded": 41}
    results = await any_env.results(job_id)
    assert sorted(r.prompt_id for r in results) == sorted(ids)
    assert all(r.route == "batch" for r in results)
    # The slices' ledger deltas (one per slice) are folded as the ingest ends: one row for the job's one key,
    # counting every answer once.
    from llm_dispatch.storage._models import LedgerDelta

    async with any_env.sessions() as session:
        folded = (await session.execute(select(LedgerDelta.requests).where(LedgerDelta.job_id == job_id))).all()
    assert [tuple(row) for row in folded] == [(41,)]


async def test_an_ingest_cut_short_between_slices_then_run_again_stores_each_answer_once(
    any_env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store that fails (the process dying mid-ingest) after others committed: the batch stays to ingest, its
    stored answers stay, and the next ingest stores only the rest, each prompt once."""
    from llm_dispatch.jobs import _collect

    monkeypatch.setattr(_collect, "READ_SLICE", 3)
    monkeypatch.setattr(_collect, "STORE_SLICE", 4)
    job_id, ids = await any_env.job([f"q {i}" for i in range(41)])
    [batch_id] = await any_env.submit(job_id)
    store = storage.store_batch_answers
    calls = 0

    async def dies_on_the_third(*args: Any, **kwargs: Any) -> int:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise ConnectionResetError("the database went away")
        return await store(*args, **kwargs)

    monkeypatch.setattr(storage, "store_batch_answers", dies_on_the_third)
    with pytest.raises(ConnectionResetError):
        await any_env.finish(batch_id)
    counts = await any_env.statuses(job_id)
    assert counts["batched"] >= 4 and counts.get("succeeded", 0) >= 8 and sum(counts.values()) == 41
    assert (await any_env.batch(batch_id)).status == "completed"

    monkeypatch.setattr(storage, "store_batch_answers", store)
    outcome = await any_env.finish(batch_id)
    assert outcome.succeeded == counts["batched"]
    assert await any_env.statuses(job_id) == {"succeeded": 41}
    results = await any_env.results(job_id)
    assert sorted(r.prompt_id for r in results) == sorted(ids)
    assert (await any_env.batch(batch_id)).status == "ingested"
