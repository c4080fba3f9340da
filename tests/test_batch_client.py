"""LLMClient's Batch API methods against respx routes, and the batch value types they return."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import respx

from llm_dispatch.core import BatchInfo, BatchLimits, BatchStatus, FileInfo, OpenAIBatchApi
from llm_dispatch.core._batch_types import batch_status_from_api
from llm_dispatch.core._exceptions import APIResponseValidationError, BadRequestError, InternalServerError, NotFoundError

from conftest import API_KEY, BASE_URL, FakeTime, make_client

CREATED = 1_711_471_533


def file_object(**overrides: Any) -> dict[str, Any]:
    body = {"id": "file-abc", "object": "file", "bytes": 120, "created_at": CREATED, "filename": "batch.jsonl",
            "purpose": "batch", "status": "processed"}
    body.update(overrides)
    return body


def batch_object(**overrides: Any) -> dict[str, Any]:
    body = {
        "id": "batch_abc", "object": "batch", "endpoint": "/v1/chat/completions", "errors": None,
        "input_file_id": "file-abc", "completion_window": "24h", "status": "validating",
        "output_file_id": None, "error_file_id": None, "created_at": CREATED, "in_progress_at": None,
        "expires_at": CREATED + 86400, "finalizing_at": None, "completed_at": None, "failed_at": None,
        "expired_at": None, "cancelling_at": None, "cancelled_at": None,
        "request_counts": {"total": 0, "completed": 0, "failed": 0}, "metadata": {"run": "r1"},
    }
    body.update(overrides)
    return body


def multipart_without_boundary(request: httpx.Request) -> bytes:
    boundary = request.headers["content-type"].split("boundary=")[1].encode()
    return request.content.replace(boundary, b"BOUNDARY")


# --- files ------------------------------------------------------------------------------------


async def test_upload_sends_multipart_and_retries_like_chat(
    router: respx.Router, fake_time: FakeTime, tmp_path: Path
) -> None:
    source = tmp_path / "batch-00001.jsonl"
    source.write_bytes(b'{"custom_id":"a"}\n{"custom_id":"b"}\n')
    route = router.post("/files", name="upload").mock(side_effect=[
        httpx.Response(503), httpx.Response(429, headers={"retry-after": "1"}), httpx.Response(200, json=file_object()),
    ])
    async with make_client(router, fake_time) as client:
        info = await OpenAIBatchApi(client).upload_file(source)

    # The second retry grows from the Retry-After: 1 s plus 5% (no jitter here).
    assert route.call_count == 3 and fake_time.sleeps == pytest.approx([0.5, 1.05])
    assert info == FileInfo(id="file-abc", bytes=120, filename="batch.jsonl", purpose="batch",
                            created_at=datetime.fromtimestamp(CREATED, tz=UTC))
    bodies = [multipart_without_boundary(call.request) for call in route.calls]
    assert bodies[0] == bodies[2]  # the whole file again on every attempt
    assert b'name="purpose"\r\n\r\nbatch\r\n' in bodies[2]
    assert b'name="file"; filename="batch-00001.jsonl"' in bodies[2]
    assert b'{"custom_id":"a"}\n{"custom_id":"b"}\n' in bodies[2]
    assert route.calls.last.request.headers["authorization"] == f"Bearer {API_KEY}"


async def test_download_streams_to_disk_with_retries(
    router: respx.Router, fake_time: FakeTime, tmp_path: Path
) -> None:
    async def chunks() -> Any:
        for i in range(50):
            yield f'{{"custom_id":"r{i}"}}\n'.encode()

    route = router.get("/files/file-out/content", name="content").mock(
        side_effect=[httpx.Response(500), httpx.Response(200, content=chunks())]
    )
    target = tmp_path / "nested" / "out.jsonl"  # the directory is made on the way
    async with make_client(router, fake_time) as client:
        saved = await OpenAIBatchApi(client).download_file("file-out", to=target)
    assert saved == target and route.call_count == 2
    assert target.read_text().count("\n") == 50
    assert list(target.parent.iterdir()) == [target]  # no .part file left behind


async def test_delete_file_and_missing_ok(router: respx.Router, fake_time: FakeTime) -> None:
    route = router.delete("/files/file-abc", name="delete").mock(side_effect=[
        httpx.Response(200, json={"id": "file-abc", "object": "file", "deleted": True}),
        httpx.Response(404, json={"error": {"message": "No such File object: file-abc"}}),
        httpx.Response(404, json={"error": {"message": "No such File object: file-abc"}}),
    ])
    async with make_client(router, fake_time) as client:
        await OpenAIBatchApi(client).delete_file("file-abc")
        await OpenAIBatchApi(client).delete_file("file-abc", missing_ok=True)
        with pytest.raises(NotFoundError):
            await OpenAIBatchApi(client).delete_file("file-abc")
    assert route.call_count == 3


async def test_ids_are_one_path_segment(router: respx.Router, fake_time: FakeTime) -> None:
    route = router.get("/files/file%2F..%2Fx", name="odd").respond(200, json=file_object(id="file/../x"))
    async with make_client(router, fake_time) as client:
        assert (await OpenAIBatchApi(client).retrieve_file("file/../x")).id == "file/../x"
        with pytest.raises(ValueError):
            await OpenAIBatchApi(client).retrieve("")
    assert route.call_count == 1


# --- batches ----------------------------------------------------------------------------------


async def test_create_batch_sends_openai_body_and_retries(router: respx.Router, fake_time: FakeTime) -> None:
    route = router.post("/batches", name="create").mock(side_effect=[
        httpx.Response(500, json={"error": {"message": "oops"}}), httpx.Response(200, json=batch_object()),
    ])
    async with make_client(router, fake_time) as client:
        batch = await OpenAIBatchApi(client).create_batch(input_file_id="file-abc", metadata={"run": "r1"})
    assert route.call_count == 2
    assert json.loads(route.calls.last.request.content) == {
        "input_file_id": "file-abc", "endpoint": "/v1/chat/completions", "completion_window": "24h",
        "metadata": {"run": "r1"},
    }
    assert batch.id == "batch_abc" and batch.status is BatchStatus.VALIDATING
    assert batch.created_at == datetime.fromtimestamp(CREATED, tz=UTC)
    assert batch.metadata == {"run": "r1"} and batch.in_progress_at is None


async def test_create_batch_with_max_retries_0_makes_one_attempt(router: respx.Router, fake_time: FakeTime) -> None:
    route = router.post("/batches", name="create").mock(side_effect=[httpx.Response(502, json={"error": {}})])
    async with make_client(router, fake_time) as client:
        with pytest.raises(InternalServerError, match="after 1 attempt"):
            await OpenAIBatchApi(client).create_batch(input_file_id="file-abc", max_retries=0)
    assert route.call_count == 1 and fake_time.sleeps == []


async def test_create_batch_without_metadata_and_a_400_is_final(router: respx.Router, fake_time: FakeTime) -> None:
    route = router.post("/batches", name="create").respond(400, json={"error": {"message": "bad window"}})
    async with make_client(router, fake_time) as client:
        with pytest.raises(BadRequestError, match="bad window"):
            await OpenAIBatchApi(client).create_batch(input_file_id="file-abc", completion_window="1h")
    assert route.call_count == 1 and fake_time.sleeps == []
    assert "metadata" not in json.loads(route.calls.last.request.content)


async def test_a_lost_create_is_looked_up_after_the_servers_wait_on_the_clients_clock(
    router: respx.Router, fake_time: FakeTime
) -> None:
    """One retry loop for chat and creates: a 503 asking for 7 s is waited out on the client's clock, then the batch
    is looked for; the second attempt's 502 made the batch, so the look-up finds it and no third attempt is sent."""
    route = router.post("/batches", name="create").mock(side_effect=[
        httpx.Response(503, headers={"retry-after": "7"}, json={"error": {}}), httpx.Response(502, json={"error": {}}),
    ])
    made = BatchInfo.from_api(batch_object(id="batch_made"))
    looked: list[float] = []

    async def find_lost() -> BatchInfo | None:
        looked.append(fake_time.now)
        return made if len(looked) == 2 else None

    async with make_client(router, fake_time) as client:
        batch = await OpenAIBatchApi(client).create_batch(input_file_id="file-abc", find_lost=find_lost)
    assert batch is made and route.call_count == 2
    # The second wait is the house rule's after a server's wait: the last one plus 5% (no jitter here).
    assert fake_time.sleeps == pytest.approx([7.0, 7.35]) and looked == pytest.approx([1007.0, 1014.35])


async def test_a_create_that_gives_up_looks_once_more_after_its_last_attempt(
    router: respx.Router, fake_time: FakeTime
) -> None:
    route = router.post("/batches", name="create").mock(side_effect=[httpx.Response(500, json={"error": {}})] * 2)
    looked: list[int] = []

    async def find_lost() -> BatchInfo | None:
        looked.append(route.call_count)
        return None

    async with make_client(router, fake_time, max_retries=5) as client:
        with pytest.raises(InternalServerError, match="after 2 attempts") as caught:
            await OpenAIBatchApi(client).create_batch(input_file_id="file-abc", max_retries=1, find_lost=find_lost)
    assert looked == [1, 2] and fake_time.sleeps == [0.5, 1.0] and caught.value.retryable


async def test_a_400_is_final_and_nothing_is_looked_up(router: respx.Router, fake_time: FakeTime) -> None:
    router.post("/batches", name="create").respond(400, json={"error": {"message": "bad file"}})

    async def find_lost() -> BatchInfo | None:
        raise AssertionError("a refused create made nothing to look for")

    async with make_client(router, fake_time) as client:
        with pytest.raises(BadRequestError, match="bad file"):
            await OpenAIBatchApi(client).create_batch(input_file_id="file-abc", find_lost=find_lost)
    assert fake_time.sleeps == []


async def test_retrieve_and_cancel(router: respx.Router, fake_time: FakeTime) -> None:
    done = batch_object(
        status="completed", output_file_id="file-out", error_file_id="file-err", in_progress_at=CREATED + 5,
        finalizing_at=CREATED + 60, completed_at=CREATED + 61,
        request_counts={"total": 100, "completed": 95, "failed": 5},
    )
    router.get("/batches/batch_abc", name="retrieve").respond(200, json=done)
    cancel = router.post("/batches/batch_abc/cancel", name="cancel").respond(
        200, json=batch_object(status="cancelling", cancelling_at=CREATED + 9)
    )
    async with make_client(router, fake_time) as client:
        batch = await OpenAIBatchApi(client).retrieve("batch_abc")
        cancelling = await OpenAIBatchApi(client).cancel("batch_abc")
    assert batch.status.is_terminal and (batch.output_file_id, batch.error_file_id) == ("file-out", "file-err")
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (100, 95, 5)
    assert batch.completed_at == datetime.fromtimestamp(CREATED + 61, tz=UTC)
    assert cancelling.status is BatchStatus.CANCELLING and not cancelling.status.is_terminal
    assert cancel.call_count == 1


async def test_unknown_status_is_a_validation_error_not_asked_again(router: respx.Router, fake_time: FakeTime) -> None:
    # A 2xx that was read is never sent again (as openai-python): the same body would come back.
    route = router.get("/batches/batch_abc", name="retrieve").respond(200, json=batch_object(status="paused"))
    async with make_client(router, fake_time, max_retries=1) as client:
        with pytest.raises(APIResponseValidationError, match="'paused'"):
            await OpenAIBatchApi(client).retrieve("batch_abc")
    assert route.call_count == 1


async def test_list_batches_pages_and_keeps_the_base_query(router: respx.Router, fake_time: FakeTime) -> None:
    def page(ids: list[str], has_more: bool) -> httpx.Response:
        data = [batch_object(id=i) for i in ids]
        return httpx.Response(200, json={"object": "list", "data": data, "first_id": ids[0], "last_id": ids[-1],
                                         "has_more": has_more})

    route = router.get("/batches", name="list").mock(
        side_effect=[page(["b3", "b2"], True), page(["b3", "b2"], True), page(["b1"], False)]
    )
    async with make_client(router, fake_time, base_url=f"{BASE_URL}?api-version=2024-10-21") as client:
        first = await OpenAIBatchApi(client).list_batches(limit=2)
        every = [batch.id async for batch in OpenAIBatchApi(client).iter_batches(page_size=2)]
    assert [batch.id for batch in first] == ["b3", "b2"]
    assert every == ["b3", "b2", "b1"]
    params = [dict(call.request.url.params) for call in route.calls]
    assert params == [
        {"api-version": "2024-10-21", "limit": "2"},
        {"api-version": "2024-10-21", "limit": "2"},
        {"api-version": "2024-10-21", "limit": "2", "after": "b2"},
    ]


# --- the value types --------------------------------------------------------------------------


def test_status_mapping_and_terminal_states() -> None:
    assert {s for s in BatchStatus if s.is_terminal} == {
        BatchStatus.COMPLETED, BatchStatus.FAILED, BatchStatus.EXPIRED, BatchStatus.CANCELLED}
    assert batch_status_from_api("in_progress") is BatchStatus.IN_PROGRESS
    ended = {"ended": BatchStatus.COMPLETED}  # another provider's words, through its own table
    assert batch_status_from_api("ended", statuses=ended) is BatchStatus.COMPLETED
    for bad in ("paused", None, 3):
        with pytest.raises(APIResponseValidationError, match="status"):
            batch_status_from_api(bad)


def test_batch_info_reads_validation_errors() -> None:
    errors = {"object": "list", "data": [
        {"code": "duplicate_custom_id", "message": "dup", "param": "custom_id", "line": 4},
        {"code": "empty_file", "message": "empty", "param": None, "line": None},
    ]}
    info = BatchInfo.from_api(batch_object(status="failed", errors=errors, metadata=None))
    assert [(e.code, e.line, e.param) for e in info.errors] == [
        ("duplicate_custom_id", 4, "custom_id"), ("empty_file", None, None)]
    assert info.metadata == {}


@pytest.mark.parametrize("broken", [
    {"id": None}, {"created_at": "yesterday"}, {"request_counts": [1, 2]}, {"errors": {"data": "x"}},
])
def test_batch_info_rejects_unusable_bodies(broken: dict[str, Any]) -> None:
    with pytest.raises(APIResponseValidationError):
        BatchInfo.from_api(batch_object(**broken))


def test_batch_limits_default_to_openai_and_must_be_positive() -> None:
    assert (BatchLimits().max_requests, BatchLimits().max_bytes) == (50_000, 200 * 1024 * 1024)
    with pytest.raises(ValueError):
        BatchLimits(max_requests=0)
