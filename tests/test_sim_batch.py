"""The simulator's Batch API over real sockets, driven by the real LLMClient: files, batches, faults, cancel, list."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio

from llm_dispatch.core.batches._batch_files import BatchFile, read_batch_output, write_batch_files
from llm_dispatch.core import BatchInfo, BatchStatus, OpenAIBatchApi
from llm_dispatch.core.http._client import LLMClient
from llm_dispatch.core._exceptions import (
    APIConnectionError,
    APITimeoutError,
    BadRequestError,
    ConflictError,
    InternalServerError,
    NotFoundError,
)
from llm_dispatch.core._types import ChatRequest
from llm_dispatch.simulator import Simulator, SimulatorConfig

# Short enough for a fast suite, long enough for a poll every 10 ms to see each status.
PROCESSING_SECONDS = 0.2
POLL_SECONDS = 0.01
MODEL = "gpt-4o-mini"


@pytest.fixture(scope="module")
def sim_url() -> Iterator[str]:
    # Its own simulator, so changing batch_processing_seconds here never leaks into other modules' tests.
    with Simulator.in_thread(SimulatorConfig(batch_processing_seconds=PROCESSING_SECONDS, seed=7)) as url:
        yield url


@pytest.fixture
def admin(sim_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=sim_url.removesuffix("/v1"), timeout=60) as client:
        client.post("/_sim/reset").raise_for_status()
        client.post("/_sim/config", json={"batch_processing_seconds": PROCESSING_SECONDS}).raise_for_status()
        yield client


@pytest_asyncio.fixture(loop_scope="function")
async def client(sim_url: str, admin: httpx.Client) -> AsyncIterator[LLMClient]:
    async with LLMClient(base_url=sim_url, max_retries=0) as llm:
        yield llm


def request(text: str, *, model: str = MODEL) -> ChatRequest:
    return ChatRequest(model=model, messages=[{"role": "user", "content": text}], params={"temperature": 0.2})


def one_file(tmp_path: Path, texts: list[str]) -> BatchFile:
    files = write_batch_files(
        ((f"req-{i}", request(text)) for i, text in enumerate(texts)), directory=tmp_path / "in"
    )
    assert len(files) == 1
    return files[0]


async def submit(client: LLMClient, path: Path, *, metadata: dict[str, str] | None = None) -> BatchInfo:
    uploaded = await OpenAIBatchApi(client).upload_file(path)
    return await OpenAIBatchApi(client).create_batch(input_file_id=uploaded.id, metadata=metadata)


async def wait_until_done(client: LLMClient, batch: BatchInfo, *, timeout: float = 120.0) -> tuple[BatchInfo, list]:
    """Poll to a terminal status; returns the last BatchInfo and every (status, completed, failed) seen."""
    seen = [(batch.status, batch.request_counts.completed, batch.request_counts.failed)]
    deadline = time.monotonic() + timeout
    while not batch.status.is_terminal:
        assert time.monotonic() < deadline, f"batch stuck in {batch.status}"
        await asyncio.sleep(POLL_SECONDS)
        batch = await OpenAIBatchApi(client).retrieve(batch.id)
        seen.append((batch.status, batch.request_counts.completed, batch.request_counts.failed))
    return batch, seen


async def read_file(client: LLMClient, file_id: str | None, to: Path) -> list:
    assert file_id is not None
    return list(read_batch_output(await OpenAIBatchApi(client).download_file(file_id, to=to)))


# --- happy path -------------------------------------------------------------------------------


async def test_batch_end_to_end_matches_real_time_answers(
    client: LLMClient, admin: httpx.Client, tmp_path: Path
) -> None:
    texts = [f"Describe lighthouse number {i} in two sentences." for i in range(12)]
    batch_file = one_file(tmp_path, texts)

    uploaded = await OpenAIBatchApi(client).upload_file(batch_file.path)
    assert uploaded.id.startswith("file-") and uploaded.purpose == "batch"
    assert uploaded.bytes == batch_file.bytes == batch_file.path.stat().st_size
    assert uploaded.filename == batch_file.path.name
    created = await OpenAIBatchApi(client).create_batch(input_file_id=uploaded.id, metadata={"run": "e2e"})
    assert created.id.startswith("batch_") and created.status is BatchStatus.VALIDATING
    assert created.metadata == {"run": "e2e"} and created.input_file_id == uploaded.id
    assert created.expires_at is not None and created.created_at is not None

    done, seen = await wait_until_done(client, created)
    assert done.status is BatchStatus.COMPLETED
    statuses = [status for status, _, _ in seen]
    assert statuses.index(BatchStatus.IN_PROGRESS) < statuses.index(BatchStatus.FINALIZING)
    progress = {completed for status, completed, _ in seen if status is BatchStatus.IN_PROGRESS}
    assert len(progress) > 2, "request_counts should advance while in progress"
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (12, 12, 0)
    assert done.error_file_id is None
    assert done.created_at <= done.in_progress_at <= done.finalizing_at <= done.completed_at

    lines = await read_file(client, done.output_file_id, tmp_path / "out.jsonl")
    assert [line.custom_id for line in lines] == batch_file.custom_ids
    assert all(line.ok and line.status_code == 200 and line.result.attempts == 1 for line in lines)
    # The batch answer is the very completion a real-time call gets for the same request.
    for text, line in zip(texts[:3], lines):
        live = await client.chat(request(text))
        assert (line.result.text, line.result.completion_tokens, line.result.prompt_tokens) == (
            live.text, live.completion_tokens, live.prompt_tokens)

    raw = json.loads((tmp_path / "out.jsonl").read_text().splitlines()[0])
    assert raw["id"].startswith("batch_req_") and raw["error"] is None
    assert raw["response"]["request_id"].startswith("req_")
    assert raw["response"]["body"]["object"] == "chat.completion"

    stats = admin.get("/_sim/stats").json()
    assert (stats["batches"], stats["batch_lines"], stats["batch_outcomes"]) == (1, 12, {"completed": 1})


async def test_file_routes_get_content_and_delete(client: LLMClient, tmp_path: Path) -> None:
    source = tmp_path / "notes.jsonl"
    source.write_bytes(b'{"a": 1}\n' * 1000)
    uploaded = await OpenAIBatchApi(client).upload_file(source)
    assert (await OpenAIBatchApi(client).retrieve_file(uploaded.id)).bytes == 9000
    copy = await OpenAIBatchApi(client).download_file(uploaded.id, to=tmp_path / "sub" / "copy.jsonl")
    assert copy.read_bytes() == source.read_bytes()
    await OpenAIBatchApi(client).delete_file(uploaded.id)
    with pytest.raises(NotFoundError):
        await OpenAIBatchApi(client).retrieve_file(uploaded.id)
    await OpenAIBatchApi(client).delete_file(uploaded.id, missing_ok=True)


# --- faults -----------------------------------------------------------------------------------


async def test_expire_keeps_the_first_half_and_reports_the_rest(client: LLMClient, tmp_path: Path) -> None:
    batch_file = one_file(tmp_path, [f"question {i}" for i in range(10)])
    done, _ = await wait_until_done(client, await submit(client, batch_file.path, metadata={"sim_fault": "expire"}))

    assert done.status is BatchStatus.EXPIRED and done.expired_at is not None
    assert (done.request_counts.total, done.request_counts.completed) == (10, 5)
    answered = await read_file(client, done.output_file_id, tmp_path / "out.jsonl")
    missing = await read_file(client, done.error_file_id, tmp_path / "err.jsonl")
    assert [line.custom_id for line in answered] == batch_file.custom_ids[:5]
    assert all(line.ok for line in answered)
    assert [line.custom_id for line in missing] == batch_file.custom_ids[5:]
    assert all(line.error_code == "batch_expired" and line.retryable and line.status_code is None for line in missing)


async def test_expire_fraction_from_the_admin_queue(client: LLMClient, admin: httpx.Client, tmp_path: Path) -> None:
    assert admin.post("/_sim/batch_faults", json={"faults": ["expire:0.2"]}).json() == {"faults": ["expire:0.2"]}
    batch_file = one_file(tmp_path, [f"question {i}" for i in range(10)])
    done, _ = await wait_until_done(client, await submit(client, batch_file.path))
    assert done.status is BatchStatus.EXPIRED and done.request_counts.completed == 2
    assert admin.get("/_sim/batch_faults").json() == {"faults": []}


async def test_invalid_input_fails_validation_with_line_numbers(client: LLMClient, tmp_path: Path) -> None:
    def line(custom_id: str | None, *, model: str = MODEL, url: str = "/v1/chat/completions") -> str:
        record: dict = {"method": "POST", "url": url, "body": request("hi", model=model).body()}
        if custom_id is not None:
            record["custom_id"] = custom_id
        return json.dumps(record)

    source = tmp_path / "bad.jsonl"
    source.write_text("\n".join([
        line("a"),
        "{not json",
        line(None),
        line("a"),
        line("b", model="gpt-4o"),
        line("c", url="/v1/embeddings"),
        line("d"),
    ]) + "\n")
    done, seen = await wait_until_done(client, await submit(client, source))

    assert done.status is BatchStatus.FAILED and done.failed_at is not None
    assert {status for status, _, _ in seen} <= {BatchStatus.VALIDATING, BatchStatus.FAILED}
    assert [(error.code, error.line) for error in done.errors] == [
        ("invalid_json_line", 2),
        ("missing_required_parameter", 3),
        ("duplicate_custom_id", 4),
        ("mismatched_model", 5),
        ("invalid_url", 6),
    ]
    assert all(error.message for error in done.errors)
    assert done.output_file_id is None and done.error_file_id is None
    assert done.request_counts.total == 0


async def test_fail_validation_fault(client: LLMClient, tmp_path: Path) -> None:
    batch_file = one_file(tmp_path, ["fine", "also fine"])
    done, _ = await wait_until_done(
        client, await submit(client, batch_file.path, metadata={"sim_fault": "fail_validation"})
    )
    assert done.status is BatchStatus.FAILED
    assert [error.code for error in done.errors] == ["simulated_validation_failure"]


async def test_slow_finalizing_stays_finalizing(client: LLMClient, tmp_path: Path) -> None:
    batch_file = one_file(tmp_path, ["one", "two"])
    started = time.monotonic()
    done, seen = await wait_until_done(
        client, await submit(client, batch_file.path, metadata={"sim_fault": "slow_finalizing:0.5"})
    )
    assert done.status is BatchStatus.COMPLETED
    assert time.monotonic() - started >= 0.5 + PROCESSING_SECONDS * 0.9
    assert any(status is BatchStatus.FINALIZING for status, _, _ in seen)


@pytest.mark.parametrize(("fault", "error", "message"), [
    ("create_lost_hang:2", APITimeoutError, "No response to POST /batches"),
    ("create_lost_drop", APIConnectionError, "Could not get an answer"),
    ("create_lost_502", InternalServerError, "HTTP 502"),
])
async def test_a_lost_create_answer_still_creates_the_batch(
    sim_url: str, admin: httpx.Client, tmp_path: Path, fault: str, error: type[Exception], message: str
) -> None:
    admin.post("/_sim/batch_faults", json={"faults": [fault]}).raise_for_status()
    async with LLMClient(base_url=sim_url, max_retries=0, request_timeout=0.3) as client:
        uploaded = await OpenAIBatchApi(client).upload_file(one_file(tmp_path, ["one", "two"]).path)
        with pytest.raises(error, match=message):
            await OpenAIBatchApi(client).create_batch(input_file_id=uploaded.id, metadata={"run": "lost"})
        [created] = await OpenAIBatchApi(client).list_batches()
        assert created.metadata == {"run": "lost"} and created.input_file_id == uploaded.id
        done, _ = await wait_until_done(client, created)
    assert (done.status, done.request_counts.completed) == (BatchStatus.COMPLETED, 2)
    assert admin.get("/_sim/stats").json()["batches"] == 1


def test_create_answer_faults_take_an_argument_only_when_they_hang(admin: httpx.Client) -> None:
    assert admin.post("/_sim/batch_faults", json={"faults": ["create_lost_hang:1.5"]}).json() == {
        "faults": ["create_lost_hang:1.5"]}
    refused = admin.post("/_sim/batch_faults", json={"faults": ["create_lost_502:1"]})
    assert refused.status_code == 400 and "create_lost_502 takes no argument" in refused.text


async def test_an_unreachable_batch_answers_503_a_counted_number_of_times_then_serves_it(
    client: LLMClient, admin: httpx.Client, tmp_path: Path
) -> None:
    admin.post("/_sim/batch_faults", json={"faults": ["unreachable:2"]}).raise_for_status()
    batch = await submit(client, one_file(tmp_path, ["a", "b"]).path)
    for _ in range(2):
        with pytest.raises(InternalServerError, match="503"):
            await OpenAIBatchApi(client).retrieve(batch.id)
    assert (await OpenAIBatchApi(client).retrieve(batch.id)).id == batch.id
    # The admin route counts the same way.
    admin.post("/_sim/batch_trouble", json={"batch_id": batch.id, "trouble": 502, "times": 1}).raise_for_status()
    with pytest.raises(InternalServerError, match="502"):
        await OpenAIBatchApi(client).retrieve(batch.id)
    assert (await OpenAIBatchApi(client).retrieve(batch.id)).id == batch.id
    refused = admin.post("/_sim/batch_faults", json={"faults": ["unreachable:0.5"]})
    assert refused.status_code == 400 and "whole number" in refused.text


async def test_line_markers_give_per_line_errors(client: LLMClient, tmp_path: Path) -> None:
    texts = ["fine", "boom [[sim:500]]", "slow down [[sim:429]]", "bad [[sim:400]]", "lost [[sim:line_error]]", "ok"]
    batch_file = one_file(tmp_path, texts)
    done, _ = await wait_until_done(client, await submit(client, batch_file.path))

    assert done.status is BatchStatus.COMPLETED
    assert (done.request_counts.completed, done.request_counts.failed) == (2, 4)
    answered = await read_file(client, done.output_file_id, tmp_path / "out.jsonl")
    assert [line.custom_id for line in answered] == ["req-0", "req-5"]
    errors = {line.custom_id: line for line in await read_file(client, done.error_file_id, tmp_path / "err.jsonl")}
    assert {cid: (line.status_code, line.retryable) for cid, line in errors.items()} == {
        "req-1": (500, True),
        "req-2": (429, True),
        "req-3": (400, False),
        "req-4": (None, False),
    }
    assert errors["req-2"].error_code == "rate_limit_exceeded"
    assert errors["req-4"].error_code == "simulated_line_error"
    raw = [json.loads(text) for text in (tmp_path / "err.jsonl").read_text().splitlines()]
    assert raw[0]["response"]["body"]["error"]["type"] == "server_error" and raw[0]["error"] is None
    assert raw[3]["response"] is None and raw[3]["error"]["code"] == "simulated_line_error"


async def test_marker_with_a_count_fails_only_the_first_batches(client: LLMClient, tmp_path: Path) -> None:
    batch_file = one_file(tmp_path, ["flaky [[sim:500x1]]"])
    first, _ = await wait_until_done(client, await submit(client, batch_file.path))
    second, _ = await wait_until_done(client, await submit(client, batch_file.path))
    assert (first.request_counts.failed, second.request_counts.completed) == (1, 1)


# --- cancel and list --------------------------------------------------------------------------


async def test_cancel_keeps_partial_output(client: LLMClient, admin: httpx.Client, tmp_path: Path) -> None:
    admin.post("/_sim/config", json={"batch_processing_seconds": 1.0}).raise_for_status()
    batch_file = one_file(tmp_path, [f"question {i}" for i in range(40)])
    batch = await submit(client, batch_file.path)
    while batch.request_counts.completed < 5:
        await asyncio.sleep(POLL_SECONDS)
        batch = await OpenAIBatchApi(client).retrieve(batch.id)

    cancelling = await OpenAIBatchApi(client).cancel(batch.id)
    assert cancelling.status is BatchStatus.CANCELLING and cancelling.cancelling_at is not None
    assert (await OpenAIBatchApi(client).cancel(batch.id)).status is BatchStatus.CANCELLING  # a repeat is harmless
    done, _ = await wait_until_done(client, cancelling)

    assert done.status is BatchStatus.CANCELLED and done.cancelled_at is not None
    answered = await read_file(client, done.output_file_id, tmp_path / "out.jsonl")
    assert 5 <= len(answered) == done.request_counts.completed < 40
    assert [line.custom_id for line in answered] == batch_file.custom_ids[: len(answered)]
    assert done.error_file_id is None
    with pytest.raises(ConflictError):
        await OpenAIBatchApi(client).cancel(batch.id)


async def test_list_batches_newest_first_with_paging(client: LLMClient, tmp_path: Path) -> None:
    uploaded = await OpenAIBatchApi(client).upload_file(one_file(tmp_path, ["x"]).path)
    ids = [(await OpenAIBatchApi(client).create_batch(input_file_id=uploaded.id)).id for _ in range(3)]

    first = await OpenAIBatchApi(client).list_batches(limit=2)
    assert [batch.id for batch in first] == [ids[2], ids[1]]
    rest = await OpenAIBatchApi(client).list_batches(limit=2, after=first[-1].id)
    assert [batch.id for batch in rest] == [ids[0]]
    assert [batch.id async for batch in OpenAIBatchApi(client).iter_batches(page_size=1)] == ids[::-1]


async def test_create_rejects_bad_parameters(client: LLMClient, tmp_path: Path, sim_url: str) -> None:
    uploaded = await OpenAIBatchApi(client).upload_file(one_file(tmp_path, ["x"]).path)
    # The client refuses such an endpoint itself (it could not read its lines); the simulator's own 400, by hand:
    refused = httpx.post(f"{sim_url}/batches", json={"input_file_id": uploaded.id, "endpoint": "/v1/moderations",
                                                     "completion_window": "24h"})
    assert refused.status_code == 400 and "supports '/v1/chat/completions', '/v1/responses', '/v1/embeddings'" in refused.text
    with pytest.raises(BadRequestError, match="24h"):
        await OpenAIBatchApi(client).create_batch(input_file_id=uploaded.id, completion_window="1h")
    with pytest.raises(BadRequestError, match="Unknown batch fault"):
        await OpenAIBatchApi(client).create_batch(input_file_id=uploaded.id, metadata={"sim_fault": "explode"})
    with pytest.raises(NotFoundError):
        await OpenAIBatchApi(client).create_batch(input_file_id="file-missing")
    with pytest.raises(NotFoundError):
        await OpenAIBatchApi(client).retrieve("batch_missing")


async def test_reset_forgets_files_and_batches(client: LLMClient, admin: httpx.Client, tmp_path: Path) -> None:
    batch = await submit(client, one_file(tmp_path, ["x"]).path)
    admin.post("/_sim/reset").raise_for_status()
    with pytest.raises(NotFoundError):
        await OpenAIBatchApi(client).retrieve(batch.id)
    with pytest.raises(NotFoundError):
        await OpenAIBatchApi(client).retrieve_file(batch.input_file_id)


async def test_a_large_batch_does_not_block_the_event_loop(
    client: LLMClient, admin: httpx.Client, tmp_path: Path
) -> None:
    admin.post("/_sim/config", json={"batch_processing_seconds": 0.0}).raise_for_status()
    files = write_batch_files(
        ((f"r{i}", request(f"item {i} " * 20)) for i in range(4000)), directory=tmp_path / "in"
    )
    batch = await submit(client, files[0].path)
    worst, polls, began = 0.0, 0, time.monotonic()
    while not batch.status.is_terminal:
        started = time.monotonic()
        batch = await OpenAIBatchApi(client).retrieve(batch.id)
        worst = max(worst, time.monotonic() - started)
        polls += 1
    answering = time.monotonic() - began
    assert batch.status is BatchStatus.COMPLETED and batch.request_counts.completed == 4000
    # Answering 4,000 lines takes many polls' time; a poll waits for a chunk of them at most, never the whole batch
    # (relative to the batch's own time, so a loaded machine slows both sides alike).
    assert polls >= 3 and worst < answering / 2
