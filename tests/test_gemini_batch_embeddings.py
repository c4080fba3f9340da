"""Gemini embeddings through Gemini Batch Mode (issue 37, item 4, batch half): ``models/{model}:asyncBatchEmbedContent``
with EmbedContentRequests as google-genai's ``batches.create_embeddings`` sends them (respx), an EmbedContentBatch's
inlined and file results read into float32 vectors, the batch steps against the simulator over real sockets, and a
whole ``run --simulate --wait --route all-batch`` of a Gemini embeddings file with its vectors exported."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import respx

from llm_dispatch import storage
from llm_dispatch.core import GeminiBatchApi, LLMClient, dedupe_key, write_batch_files
from llm_dispatch.core.batches._gemini_batch_results import read_gemini_batch_results
from llm_dispatch.simulator import embedding_vector

from conftest import FakeTime, cli
from test_gemini_batch_wire import BASE, KEY, Record, noop, operation
from test_gemini_batches import Env, env  # noqa: F401  (the fixture)
from test_gemini_embeddings import check_stored_and_exported, embedding, floats

MODEL = "gemini-embedding-001"
ROOT = Path(__file__).resolve().parent.parent


def embed_file(tmp_path: Path) -> Path:
    requests = [("p1", embedding("The cat sat.", model=MODEL, taskType="RETRIEVAL_DOCUMENT", dimensions=8)),
                ("p2", embedding("A dog barked.", model=MODEL))]
    [file] = write_batch_files(requests, directory=tmp_path)
    return file.path


def backend(fake_time: FakeTime, router: respx.Router, **options: Any) -> GeminiBatchApi:
    client = LLMClient(provider="gemini", base_url=BASE, api_key=KEY, transport=httpx.MockTransport(router.async_handler),
                       sleep=fake_time.sleep, clock=fake_time.monotonic, random=lambda: 0.0)
    return GeminiBatchApi(client, **options)


# --- the wire, as google-genai sends and reads it -------------------------------------------------------------------


async def test_embeddings_lines_go_to_async_batch_embed_content_as_embed_content_requests(
    fake_time: FakeTime, tmp_path: Path
) -> None:
    router = respx.Router(base_url=BASE, assert_all_mocked=True)
    route = router.post(f"/v1beta/models/{MODEL}:asyncBatchEmbedContent").respond(200, json=operation())
    path = embed_file(tmp_path)
    api = backend(fake_time, router)
    assert await api.upload(path) is None
    await api.create(record=Record(model=MODEL, endpoint="embeddings"), path=path, input_file_id=None, metadata={},
                     max_retries=0, find_lost=noop)
    # No model in a request (the path names it), no encoding_format (Gemini answers floats), dimensions renamed.
    assert json.loads(route.calls.last.request.content) == {"batch": {
        "displayName": "llm-dispatch:jjjjjjjj:7", "inputConfig": {"requests": {"requests": [
            {"request": {"content": {"parts": [{"text": "The cat sat."}]}, "taskType": "RETRIEVAL_DOCUMENT",
                         "outputDimensionality": 8}, "metadata": {"key": "p1"}},
            {"request": {"content": {"parts": [{"text": "A dog barked."}]}}, "metadata": {"key": "p2"}}]}}}}
    # A file's lines are {"key", "request"}, the same requests.
    converted = tmp_path / "converted.jsonl"
    api._write_input(path, converted)
    assert [json.loads(line) for line in converted.read_text().splitlines()] == [
        {"key": "p1", "request": {"content": {"parts": [{"text": "The cat sat."}]}, "taskType": "RETRIEVAL_DOCUMENT",
                                  "outputDimensionality": 8}},
        {"key": "p2", "request": {"content": {"parts": [{"text": "A dog barked."}]}}}]


async def test_inlined_embed_content_responses_are_read_into_float32_vectors(fake_time: FakeTime,
                                                                             tmp_path: Path) -> None:
    router = respx.Router(base_url=BASE, assert_all_mocked=True)
    inlined = {"inlinedEmbedContentResponses": {"inlinedResponses": [
        {"response": {"embedding": {"values": [0.5, -1.0]}, "tokenCount": "4"}, "metadata": {"key": "p2"}},
        {"error": {"code": 8, "message": "busy", "status": "RESOURCE_EXHAUSTED"}, "metadata": {"key": "p1"}},
        {"response": {"embedding": {}}, "metadata": {"key": "p3"}}]}}
    router.get("/v1beta/batches/b1").respond(200, json=operation("BATCH_STATE_SUCCEEDED", output=inlined))
    api = backend(fake_time, router)
    info = await api.retrieve("batches/b1")
    assert info.output_file_id == "inlinedResponses"
    record = Record(model=MODEL, endpoint="embeddings", provider_batch_id=info.id, output_file_id=info.output_file_id)
    [results] = api.result_files(record)
    read = list(results.read(await results.download(to=tmp_path / "inline.jsonl")))
    assert [(line.custom_id, line.ok, line.error_code, line.retryable) for line in read] == [
        ("p2", True, None, False), ("p1", False, "RESOURCE_EXHAUSTED", True), ("p3", False, "unusable_answer", False)]
    assert read[0].result is not None and floats(read[0].result.embedding or b"") == [0.5, -1.0]
    assert read[0].result.prompt_tokens == 4
    # A chat batch's reader does not take an embedding for an answer.
    assert not list(read_gemini_batch_results(tmp_path / "inline.jsonl"))[0].ok


def test_a_packed_line_is_refused_before_it_is_sent(tmp_path: Path) -> None:
    path = tmp_path / "packed.jsonl"
    path.write_text(json.dumps({"custom_id": "p1", "method": "POST", "url": "/v1/embeddings",
                                "body": {"model": MODEL, "input": ["a", "b"]}}) + "\n")
    api = GeminiBatchApi(LLMClient(provider="gemini", base_url=BASE, api_key=KEY))
    with pytest.raises(ValueError, match="one text, not 2"):
        api._write_input(path, tmp_path / "out.jsonl")


# --- the batch steps against the simulator ----------------------------------------------------------------------


@pytest.mark.parametrize("inline", [True, False], ids=["inline", "file"])
async def test_an_embeddings_batch_stores_each_texts_vector_priced_at_half(env: Env, inline: bool) -> None:
    env.inline_max_bytes = None if inline else 100
    texts = ["alpha text", "beta text", "gamma text", "alpha text"]  # the last repeats the first
    job_id = await storage.create_job(env.sessions, name="t", fingerprint="e" * 64, input_path=None, model=MODEL,
                                      settings={})
    prompts = []
    for i, text in enumerate(texts):
        messages = [{"role": "user", "content": text}]
        params = {"dimensions": 16}
        prompts.append(storage.NewPrompt(
            custom_id=f"e-{i}", position=i, model=MODEL, messages=messages, params=params, endpoint="embeddings",
            dedupe_key=dedupe_key(model=MODEL, messages=messages, params=params, endpoint="embeddings"),
            planned_route="batch", route_reason="test"))
    await storage.add_prompts(env.sessions, job_id=job_id, prompts=prompts)
    [batch_id] = await env.submit(job_id)
    record = await env.batch(batch_id)
    assert record.endpoint == "embeddings" and record.request_total == 3  # one text a request, each text once
    outcome = await env.finish(batch_id)
    assert (outcome.status, outcome.succeeded, outcome.failed) == ("completed", 4, 0)
    by_prompt = {row.prompt_id: row for row in await env.results(job_id)}
    ids = sorted(by_prompt)  # prompts are numbered in input order
    stored = [(i, by_prompt[i].route, by_prompt[i].embedding, by_prompt[i].prompt_tokens, by_prompt[i].cost_pico_usd,
               by_prompt[i].list_cost_pico_usd) for i in ids]
    assert len(stored) == 4
    for (_, route, vector, tokens, cost, list_cost), text in zip(stored, texts):
        assert floats(vector) == pytest.approx(embedding_vector(text, model=MODEL, dimensions=16))
        if route == "batch":
            assert tokens > 0 and list_cost == tokens * 150_000 and cost * 2 == list_cost
    assert sorted(row[1] for row in stored) == ["batch", "batch", "batch", "reused"]
    made = httpx.get(f"{env.sim.root}/v1beta/batches", params={"pageSize": 100}, timeout=5).json()["operations"]
    assert [op["metadata"]["@type"].rsplit(".", 1)[1] for op in made] == ["EmbedContentBatch"]


# --- a whole run ----------------------------------------------------------------------------------------------------


@pytest.mark.prefect
def test_a_gemini_embeddings_file_routed_all_batch_stores_vectors_that_export(
    cli_env: dict[str, str], db_url: str, tmp_path: Path
) -> None:
    # The example's prompts, their urgency left to the route policy (an urgent prompt goes real-time whatever it is).
    example = ROOT / "examples" / "gemini-embeddings.jsonl"
    records = [json.loads(line) for line in example.read_text().splitlines() if line.strip()]
    for record in records:
        record.pop("urgency", None)
    path = tmp_path / "embeddings.jsonl"
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    done = cli("run", str(path), "--simulate", "--wait", "--route", "all-batch", "--json", env=cli_env,
               cwd=tmp_path)
    check_stored_and_exported(done, records, db_url=db_url, cli_env=cli_env, cwd=tmp_path, route="batch")
