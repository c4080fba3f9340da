"""Gemini Batch Mode's wire against respx routes: each call's path, headers and body exactly as Google's REST
reference (ai.google.dev/api/batch-mode, ai.google.dev/api/files) and google-genai write them, and the answers read."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
import respx

from conftest import FakeTime
from llm_dispatch.core import BatchStatus, GeminiBatchApi, LLMClient, write_batch_files, ChatRequest
from llm_dispatch.core.batches import _gemini_batches
from llm_dispatch.core.batches._gemini_batch_results import read_gemini_batch_results

BASE = "https://gemini.test"
KEY = "AIza-test-key"
MODEL = "gemini-2.5-flash"


@dataclass(frozen=True)
class Record:
    id: int = 7
    job_id: str = "j" * 8
    model: str = MODEL
    endpoint: str = "chat"
    created_at: datetime = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
    request_total: int = 2
    provider_batch_id: str | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None


def operation(state: str = "BATCH_STATE_PENDING", *, name: str = "batches/b1", display: str = "llm-dispatch:jjjjjjjj:7",
              created: str = "2026-11-28T12:00:01.123456789Z", **extra: object) -> dict:
    batch = {"@type": "type.googleapis.com/google.ai.generativelanguage.v1beta.GenerateContentBatch",
             "model": f"models/{MODEL}", "displayName": display, "createTime": created, "state": state,
             "batchStats": {"requestCount": "2", "successfulRequestCount": "1", "failedRequestCount": "1"}, **extra}
    return {"name": name, "metadata": batch}


@pytest.fixture
def gemini() -> respx.Router:
    router = respx.Router(base_url=BASE, assert_all_called=True, assert_all_mocked=True)
    yield router
    router.assert_all_called()


def api(router: respx.Router, fake_time: FakeTime, **options: object) -> GeminiBatchApi:
    client = LLMClient(provider="gemini", base_url=BASE, api_key=KEY, transport=httpx.MockTransport(router.async_handler),
                       sleep=fake_time.sleep, clock=fake_time.monotonic, random=lambda: 0.0)
    return GeminiBatchApi(client, **options)  # type: ignore[arg-type]


def input_file(tmp_path: Path) -> Path:
    requests = [("p1", ChatRequest(model=MODEL, messages=[{"role": "system", "content": "Be brief."},
                                                          {"role": "user", "content": "Hi"}], params={"max_tokens": 5})),
                ("p2", ChatRequest(model=MODEL, messages=[{"role": "user", "content": "Yo"}], params={"temperature": 0}))]
    [file] = write_batch_files(requests, directory=tmp_path)
    return file.path


async def noop() -> None:
    return None


async def test_inline_create_sends_the_rest_envelope(gemini: respx.Router, fake_time: FakeTime, tmp_path: Path) -> None:
    path = input_file(tmp_path)
    route = gemini.post(f"/v1beta/models/{MODEL}:batchGenerateContent").respond(200, json=operation())
    backend = api(gemini, fake_time)
    assert await backend.upload(path) is None  # under 20 MB: nothing uploaded
    info = await backend.create(record=Record(), path=path, input_file_id=None, metadata={"team": "x"}, max_retries=0,
                                find_lost=noop)
    sent = route.calls.last.request
    assert sent.headers["x-goog-api-key"] == KEY and sent.headers["content-type"] == "application/json"
    assert json.loads(sent.content) == {"batch": {"displayName": "llm-dispatch:jjjjjjjj:7", "inputConfig": {"requests": {
        "requests": [
            {"request": {"contents": [{"role": "user", "parts": [{"text": "Hi"}]}],
                         "systemInstruction": {"parts": [{"text": "Be brief."}], "role": "user"},
                         "generationConfig": {"maxOutputTokens": 5}}, "metadata": {"key": "p1"}},
            {"request": {"contents": [{"role": "user", "parts": [{"text": "Yo"}]}],
                         "generationConfig": {"temperature": 0}}, "metadata": {"key": "p2"}},
        ]}}}}
    assert (info.id, info.status, info.request_counts.total) == ("batches/b1", BatchStatus.VALIDATING, 2)
    assert info.created_at == datetime(2026, 11, 28, 12, 0, 1, 123456, tzinfo=UTC)
    assert info.expires_at == datetime(2026, 11, 30, 12, 0, 1, 123456, tzinfo=UTC)  # 48 hours


async def test_a_large_batch_is_uploaded_by_the_resumable_protocol_then_named(
    gemini: respx.Router, fake_time: FakeTime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = input_file(tmp_path)
    monkeypatch.setattr(_gemini_batches, "UPLOAD_CHUNK", 100)  # several chunks of a small file
    received: list[tuple[str, str, bytes]] = []
    starts: list[httpx.Request] = []

    def upload(request: httpx.Request) -> httpx.Response:
        if "upload_id" not in request.url.params:
            starts.append(request)
            # The session's URL names Google's host; the chunks go to the client's own (as google-genai sends them).
            return httpx.Response(200, headers={"X-Goog-Upload-URL": "https://elsewhere.test/upload/v1beta/files?"
                                                                     "upload_id=U1&upload_protocol=resumable"})
        assert request.url.params["upload_id"] == "U1" and request.url.params["upload_protocol"] == "resumable"
        received.append((request.headers["X-Goog-Upload-Command"], request.headers["X-Goog-Upload-Offset"],
                         request.content))
        if request.headers["X-Goog-Upload-Command"] == "upload, finalize":
            return httpx.Response(200, headers={"X-Goog-Upload-Status": "final"},
                                  json={"file": {"name": "files/abc", "mimeType": "jsonl"}})
        return httpx.Response(200, headers={"X-Goog-Upload-Status": "active"})

    gemini.post("/upload/v1beta/files").mock(side_effect=upload)
    create = gemini.post(f"/v1beta/models/{MODEL}:batchGenerateContent").respond(200, json=operation())
    backend = api(gemini, fake_time, inline_max_bytes=10)
    name = await backend.upload(path)
    assert name == "files/abc"
    [sent] = starts
    assert sent.headers["X-Goog-Upload-Protocol"] == "resumable" and sent.headers["X-Goog-Upload-Command"] == "start"
    assert sent.headers["X-Goog-Upload-Header-Content-Type"] == "jsonl"
    uploaded = b"".join(part for _, _, part in received)
    assert int(sent.headers["X-Goog-Upload-Header-Content-Length"]) == len(uploaded)
    assert json.loads(sent.content)["file"]["sizeBytes"] == str(len(uploaded))
    assert [command for command, _, _ in received] == ["upload"] * (len(received) - 1) + ["upload, finalize"]
    offsets = [int(offset) for _, offset, _ in received]
    assert offsets == [sum(len(part) for _, _, part in received[:i]) for i in range(len(received))]
    lines = [json.loads(line) for line in uploaded.splitlines()]
    assert [line["key"] for line in lines] == ["p1", "p2"]
    assert lines[1] == {"key": "p2", "request": {"contents": [{"role": "user", "parts": [{"text": "Yo"}]}],
                                                  "generationConfig": {"temperature": 0}}}
    await backend.create(record=Record(), path=None, input_file_id=name, metadata={}, max_retries=0, find_lost=noop)
    assert json.loads(create.calls.last.request.content) == {
        "batch": {"displayName": "llm-dispatch:jjjjjjjj:7", "inputConfig": {"fileName": "files/abc"}}}


async def test_retrieve_cancel_and_the_responses_file(gemini: respx.Router, fake_time: FakeTime, tmp_path: Path) -> None:
    done = operation("BATCH_STATE_SUCCEEDED", endTime="2026-11-28T13:00:00Z", output={"responsesFile": "files/out1"})
    gemini.get("/v1beta/batches/b1").mock(side_effect=[httpx.Response(200, json=operation("BATCH_STATE_RUNNING")),
                                                       httpx.Response(200, json=done)])
    cancel = gemini.post("/v1beta/batches/b1:cancel").respond(200, json={})
    lines = [{"key": "p1", "response": {"candidates": [{"content": {"role": "model", "parts": [{"text": "Hello"}]},
                                                        "finishReason": "STOP"}],
                                        "usageMetadata": {"promptTokenCount": 4, "candidatesTokenCount": 1}}},
             {"key": "p2", "error": {"code": 8, "message": "Quota", "status": "RESOURCE_EXHAUSTED"}},
             {"key": "p3", "error": {"code": 3, "message": "Bad"}}]
    download = gemini.get("/download/v1beta/files/out1:download", params={"alt": "media"}).respond(
        200, content=b"".join(json.dumps(line).encode() + b"\n" for line in lines))
    backend = api(gemini, fake_time)
    running = await backend.cancel("batches/b1")
    assert cancel.called and running.status is BatchStatus.IN_PROGRESS
    info = await backend.retrieve("batches/b1")
    assert (info.status, info.output_file_id, info.request_counts.completed) == (BatchStatus.COMPLETED, "files/out1", 1)
    assert info.completed_at == datetime(2026, 11, 28, 13, tzinfo=UTC)
    [results] = backend.result_files(Record(provider_batch_id=info.id, output_file_id=info.output_file_id))
    path = await results.download(to=tmp_path / "out.jsonl")
    assert download.called
    read = list(results.read(path))
    assert [(line.custom_id, line.ok, line.error_code, line.retryable) for line in read] == [
        ("p1", True, None, False), ("p2", False, "RESOURCE_EXHAUSTED", True), ("p3", False, "INVALID_ARGUMENT", False)]
    assert read[0].result is not None and read[0].result.text == "Hello" and read[0].result.prompt_tokens == 4


async def test_inlined_responses_are_read_by_their_key(gemini: respx.Router, fake_time: FakeTime, tmp_path: Path) -> None:
    inlined = {"inlinedResponses": {"inlinedResponses": [
        {"response": {"candidates": [{"content": {"parts": [{"text": "A"}]}, "finishReason": "STOP"}]},
         "metadata": {"key": "p2"}},
        {"error": {"code": 14, "message": "busy"}, "metadata": {"key": "p1"}}]}}
    gemini.get("/v1beta/batches/b1").respond(200, json=operation("BATCH_STATE_SUCCEEDED", output=inlined))
    backend = api(gemini, fake_time)
    info = await backend.retrieve("batches/b1")
    [results] = backend.result_files(Record(provider_batch_id=info.id, output_file_id=info.output_file_id))
    read = list(results.read(await results.download(to=tmp_path / "inline.jsonl")))
    assert [(line.custom_id, line.ok, line.error_code, line.retryable) for line in read] == [
        ("p2", True, None, False), ("p1", False, "UNAVAILABLE", True)]


async def test_a_lost_create_is_found_by_display_name_across_pages(gemini: respx.Router, fake_time: FakeTime) -> None:
    other = operation("BATCH_STATE_RUNNING", name="batches/other", display="llm-dispatch:jjjjjjjj:8")
    ours = operation("BATCH_STATE_RUNNING", name="batches/ours")
    pages = gemini.get("/v1beta/batches").mock(side_effect=[
        httpx.Response(200, json={"operations": [other], "nextPageToken": "t2"}),
        httpx.Response(200, json={"operations": [ours]})])

    async def adopted(name: str) -> bool:
        return False

    found = await api(gemini, fake_time).find(record=Record(), adopted=adopted)
    assert found is not None and found.id == "batches/ours"
    assert [call.request.url.params.get("pageToken") for call in pages.calls] == [None, "t2"]
    assert pages.calls[0].request.url.params["pageSize"] == "100"


async def test_a_list_that_comes_oldest_first_is_read_past_a_page_of_old_batches(
        gemini: respx.Router, fake_time: FakeTime) -> None:
    # The list's order is not documented: a page of batches older than ours ends the look only when the list has
    # come newest first. Here it comes oldest first, and ours is on the last page.
    old = [operation("BATCH_STATE_SUCCEEDED", name=f"batches/old{i}", display=f"llm-dispatch:older:{i}",
                     created=f"2026-11-{20 + i}T12:00:00Z") for i in range(2)]
    ours = operation("BATCH_STATE_RUNNING", name="batches/ours")
    pages = gemini.get("/v1beta/batches").mock(side_effect=[
        httpx.Response(200, json={"operations": old, "nextPageToken": "t2"}),
        httpx.Response(200, json={"operations": [ours]})])

    async def adopted(name: str) -> bool:
        return False

    found = await api(gemini, fake_time).find(record=Record(), adopted=adopted)
    assert found is not None and found.id == "batches/ours"
    assert len(pages.calls) == 2


def test_a_responses_line_without_key_or_answer_is_garbled(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text('{"response": {}}\n{"key": "p1"}\nnot json\n{"key": "p2", "response": {"candidates": []}}\n')
    read = list(read_gemini_batch_results(path))
    assert [(line.custom_id, line.error_code) for line in read] == [
        (None, "invalid_output_line"), ("p1", "invalid_output_line"), (None, "invalid_output_line"),
        ("p2", "unusable_answer")]
