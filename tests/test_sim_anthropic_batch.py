"""The simulator's Message Batches over real sockets, driven by the Anthropic LLMClient: create, poll, results,
expiry, cancel, lost creates and listing; raw HTTP for the exact shapes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from llm_dispatch.core import (
    APIConnectionError,
    APIError,
    APITimeoutError,
    BatchInfo,
    BatchLine,
    BatchStatus,
    InternalServerError,
    LLMClient,
    MessageBatchApi,
    read_message_batch_results,
)
from llm_dispatch.simulator import Simulator, SimulatorConfig, anthropic_base_url

PROCESSING_SECONDS = 0.2
POLL_SECONDS = 0.01
MODEL = "claude-haiku-4-5"
HEADERS = {"anthropic-version": "2023-06-01", "x-api-key": "k"}


@pytest.fixture(scope="module")
def sim_url() -> Iterator[str]:
    # Its own simulator, so batch_processing_seconds here never leaks into other modules' tests.
    with Simulator.in_thread(SimulatorConfig(batch_processing_seconds=PROCESSING_SECONDS, seed=3)) as url:
        yield anthropic_base_url(url)


@pytest.fixture
def admin(sim_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=sim_url, headers=HEADERS, timeout=60) as client:
        client.post("/_sim/reset").raise_for_status()
        client.post("/_sim/config", json={"batch_processing_seconds": PROCESSING_SECONDS}).raise_for_status()
        yield client


@pytest_asyncio.fixture(loop_scope="function")
async def client(sim_url: str, admin: httpx.Client) -> AsyncIterator[LLMClient]:
    async with LLMClient(provider="anthropic", base_url=sim_url, api_key="k", max_retries=0) as llm:
        yield llm


def params(text: str, *, max_tokens: int = 64) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": max_tokens, "messages": [{"role": "user", "content": text}]}


def requests(texts: list[str]) -> list[dict[str, Any]]:
    return [{"custom_id": f"req-{i}", "params": params(text)} for i, text in enumerate(texts)]


async def wait_until_ended(client: LLMClient, batch: BatchInfo, *, timeout: float = 120.0) -> tuple[BatchInfo, list]:
    """Poll until ended; returns the last BatchInfo and every (status, completed) seen."""
    seen = [(batch.status, batch.request_counts.completed)]
    deadline = time.monotonic() + timeout
    while batch.status is not BatchStatus.COMPLETED:
        assert time.monotonic() < deadline, f"batch stuck in {batch.status}"
        await asyncio.sleep(POLL_SECONDS)
        batch = await MessageBatchApi(client).retrieve(batch.id)
        seen.append((batch.status, batch.request_counts.completed))
    return batch, seen


async def results(client: LLMClient, batch: BatchInfo, tmp_path: Path) -> dict[str, BatchLine]:
    path = await MessageBatchApi(client).download_message_batch_results(batch.id, to=tmp_path / f"{batch.id}.jsonl")
    return {line.custom_id: line for line in read_message_batch_results(path)}


async def test_a_batch_runs_to_ended_with_succeeded_and_errored_lines(
    client: LLMClient, admin: httpx.Client, tmp_path: Path
) -> None:
    texts = ["Name a river.", "[[sim:400]] bad", "[[sim:500]] broken", "[[sim:529]] busy", "[[sim:429]] slow",
             "Name a lake."]
    created = await MessageBatchApi(client).create_message_batch(requests=requests(texts))
    assert created.status is BatchStatus.IN_PROGRESS and created.request_counts.total == 6
    ended, seen = await wait_until_ended(client, created)
    assert (ended.request_counts.completed, ended.request_counts.failed) == (2, 4)
    assert ended.completed_at is not None and ended.output_file_id is not None
    assert any(status is BatchStatus.IN_PROGRESS and 0 < done for status, done in seen)  # counts advance

    lines = await results(client, ended, tmp_path)
    assert {cid: (line.ok, line.error_code, line.retryable) for cid, line in lines.items()} == {
        "req-0": (True, None, False), "req-1": (False, "invalid_request_error", False),
        "req-2": (False, "api_error", True), "req-3": (False, "overloaded_error", True),
        "req-4": (False, "rate_limit_error", True), "req-5": (True, None, False),
    }
    # Each request is answered exactly as POST /v1/messages answers its params.
    real_time = admin.post("/v1/messages", json=params("Name a river.")).json()
    river = lines["req-0"].result
    assert river is not None and river.text == real_time["content"][0]["text"]
    assert (river.prompt_tokens, river.completion_tokens, river.finish_reason) == (
        real_time["usage"]["input_tokens"], real_time["usage"]["output_tokens"], real_time["stop_reason"])
    stats = admin.get("/_sim/stats").json()
    assert (stats["message_batches"], stats["message_batch_lines"], stats["messages"], stats["batches"]) == (1, 6, 1, 0)


async def test_an_expired_batch_answers_a_fraction_and_expires_the_rest(
    client: LLMClient, admin: httpx.Client, tmp_path: Path
) -> None:
    admin.post("/_sim/batch_faults", json={"faults": ["expire:0.5"]}).raise_for_status()
    created = await MessageBatchApi(client).create_message_batch(
        requests=requests([f"Question {i}" for i in range(4)]))
    ended, _ = await wait_until_ended(client, created)
    lines = await results(client, ended, tmp_path)
    assert [(line.custom_id, line.error_code) for line in lines.values()] == [
        ("req-0", None), ("req-1", None), ("req-2", "expired"), ("req-3", "expired")]
    assert all(line.retryable for line in lines.values() if not line.ok)
    raw = admin.get(f"/v1/messages/batches/{ended.id}").json()
    assert raw["request_counts"] == {"processing": 0, "succeeded": 2, "errored": 0, "canceled": 0, "expired": 2}


async def test_a_cancelled_batch_ends_with_the_unanswered_canceled(
    client: LLMClient, admin: httpx.Client, tmp_path: Path
) -> None:
    admin.post("/_sim/config", json={"batch_processing_seconds": 2.0}).raise_for_status()
    batches = MessageBatchApi(client)
    created = await batches.create_message_batch(requests=requests([f"Question {i}" for i in range(40)]))
    cancelling = await batches.cancel(created.id)
    assert cancelling.status is BatchStatus.CANCELLING and cancelling.cancelling_at is not None
    ended, _ = await wait_until_ended(client, cancelling)
    lines = await results(client, ended, tmp_path)
    canceled = [line for line in lines.values() if line.error_code == "canceled"]
    assert len(lines) == 40 and 0 < len(canceled) < 40
    assert all(line.ok for line in lines.values() if line.error_code != "canceled")
    raw = admin.get(f"/v1/messages/batches/{ended.id}").json()
    assert raw["processing_status"] == "ended" and raw["request_counts"]["canceled"] == len(canceled)
    again = admin.post(f"/v1/messages/batches/{ended.id}/cancel")
    assert again.status_code == 400 and again.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(("fault", "exception"), [
    ("create_lost_drop", APIConnectionError), ("create_lost_502", InternalServerError),
    ("create_lost_hang:5", APITimeoutError),
])
async def test_a_lost_create_answer_still_creates_exactly_one_batch(
    sim_url: str, admin: httpx.Client, fault: str, exception: type[APIError]
) -> None:
    admin.post("/_sim/batch_faults", json={"faults": [fault]}).raise_for_status()
    async with LLMClient(provider="anthropic", base_url=sim_url, api_key="k", max_retries=0,
                         request_timeout=0.5, file_timeout=0.5) as llm:
        with pytest.raises(exception):
            await MessageBatchApi(llm).create_message_batch(requests=requests(["Name a river."]))
        listed = [batch async for batch in MessageBatchApi(llm).iter_message_batches()]
    assert len(listed) == 1 and admin.get("/_sim/stats").json()["message_batches"] == 1


async def test_a_hung_create_creates_nothing(sim_url: str, admin: httpx.Client) -> None:
    admin.post("/_sim/batch_faults", json={"faults": ["hang_create:5"]}).raise_for_status()
    async with LLMClient(provider="anthropic", base_url=sim_url, api_key="k", max_retries=0,
                         request_timeout=0.3, file_timeout=0.3) as llm:
        with pytest.raises(APITimeoutError):
            await MessageBatchApi(llm).create_message_batch(requests=requests(["Name a river."]))
    assert admin.get("/_sim/stats").json()["message_batches"] == 0


async def test_batches_are_listed_newest_first_a_page_at_a_time(client: LLMClient, admin: httpx.Client) -> None:
    batches = MessageBatchApi(client)
    created = [(await batches.create_message_batch(requests=requests([f"Batch {i}"]))).id for i in range(3)]
    listed = [batch.id async for batch in batches.iter_message_batches(page_size=2)]
    assert listed == created[::-1]
    first = admin.get("/v1/messages/batches", params={"limit": 2}).json()
    second = admin.get("/v1/messages/batches", params={"limit": 2, "after_id": first["last_id"]}).json()
    assert ([b["id"] for b in first["data"]], first["has_more"], first["first_id"]) == (
        created[:0:-1], True, created[2])
    assert ([b["id"] for b in second["data"]], second["has_more"]) == ([created[0]], False)
    assert admin.get("/v1/messages/batches", params={"limit": 0}).status_code == 400


def test_the_batch_object_and_its_results_have_anthropics_shape(sim_url: str, admin: httpx.Client) -> None:
    created = admin.post("/v1/messages/batches", json={"requests": requests(["Name a river."])})
    batch = created.json()
    assert created.status_code == 200 and batch["id"].startswith("msgbatch_")
    assert set(batch) == {"id", "type", "processing_status", "request_counts", "ended_at", "created_at",
                          "expires_at", "cancel_initiated_at", "archived_at", "results_url"}
    assert (batch["type"], batch["processing_status"], batch["results_url"], batch["ended_at"]) == (
        "message_batch", "in_progress", None, None)
    assert batch["created_at"].endswith("Z") and batch["expires_at"] > batch["created_at"]
    early = admin.get(f"/v1/messages/batches/{batch['id']}/results")
    assert early.status_code == 404 and early.json()["error"]["type"] == "not_found_error"
    deadline = time.monotonic() + 5
    while batch["processing_status"] != "ended":
        assert time.monotonic() < deadline
        time.sleep(POLL_SECONDS)
        batch = admin.get(f"/v1/messages/batches/{batch['id']}").json()
    assert batch["results_url"] == f"{sim_url}/v1/messages/batches/{batch['id']}/results"
    line = httpx.get(batch["results_url"], headers=HEADERS).json()
    assert line["custom_id"] == "req-0" and line["result"]["type"] == "succeeded"
    assert line["result"]["message"]["type"] == "message"


@pytest.mark.parametrize(("batch_requests", "message"), [
    ([{"custom_id": "a", "params": params("x")}, {"custom_id": "a", "params": params("y")}], "requests.1.custom_id"),
    ([{"custom_id": "has space", "params": params("x")}], "requests.0.custom_id"),
    ([{"custom_id": "a", "params": {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}}],
     "requests.0.params.max_tokens: Field required"),
    ([], "requests: List should have at least 1 item"),
])
def test_an_invalid_request_refuses_the_whole_create(
    admin: httpx.Client, batch_requests: list[dict[str, Any]], message: str
) -> None:
    refused = admin.post("/v1/messages/batches", json={"requests": batch_requests})
    assert refused.status_code == 400 and refused.json()["type"] == "error"
    assert refused.json()["error"]["type"] == "invalid_request_error" and message in refused.json()["error"]["message"]
    assert admin.get("/_sim/stats").json()["message_batches"] == 0


def test_an_unknown_batch_is_a_404(admin: httpx.Client) -> None:
    missing = admin.get("/v1/messages/batches/msgbatch_nope")
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"


async def test_a_message_batch_create_has_the_upload_deadline_not_a_chats(sim_url: str, admin: httpx.Client) -> None:
    """The body is the whole batch (up to 256 MB): a create slower than a chat's deadline is waited for."""
    admin.post("/_sim/batch_faults", json={"faults": ["create_lost_hang:0.6"]}).raise_for_status()
    async with LLMClient(provider="anthropic", base_url=sim_url, api_key="k", max_retries=0,
                         request_timeout=0.2, file_timeout=5) as llm:
        created = await MessageBatchApi(llm).create_message_batch(requests=requests(["Name a river."]))
    assert created.id and admin.get("/_sim/stats").json()["message_batches"] == 1


@pytest.mark.parametrize("wave", [4, None])
async def test_a_batchs_cache_hits_are_best_effort_a_wave_at_a_time(
    client: LLMClient, admin: httpx.Client, tmp_path: Path, wave: int | None
) -> None:
    # Anthropic answers a batch's requests concurrently, its cache hits inside a batch best-effort: what a wave of
    # requests writes is read only by the waves after it (None: one at a time, each warm at once).
    admin.post("/_sim/config", json={"batch_cache_wave": wave}).raise_for_status()
    rubric = [{"type": "text", "text": "Grade the answer by the rubric, point by point. " * 600,
               "cache_control": {"type": "ephemeral", "ttl": "1h"}}]
    created = await MessageBatchApi(client).create_message_batch(requests=[
        {"custom_id": f"req-{i}", "params": {**params(f"Answer {i}"), "system": rubric}} for i in range(10)])
    ended, _ = await wait_until_ended(client, created)
    lines = await results(client, ended, tmp_path)
    read = [line.result.cached_tokens > 0 for line in lines.values() if line.result is not None]
    wrote = [line.result.cache_creation_tokens > 0 for line in lines.values() if line.result is not None]
    first = 1 if wave is None else wave
    assert read == [False] * first + [True] * (10 - first)
    assert wrote == [True] * first + [False] * (10 - first)
