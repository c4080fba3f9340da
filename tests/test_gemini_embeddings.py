"""Gemini embeddings, real-time (issue 37, item 4): ``models/{model}:batchEmbedContents`` as Google's SDK and REST
reference write it (respx), texts packed up to 100 a request, vectors and usage read back, over real sockets against
the simulator, and a whole ``run --simulate`` of a Gemini embeddings file with its vectors exported."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import httpx
import pytest
import respx

from llm_dispatch.core import ChatRequest, LLMClient, WorkItem, send_all
from llm_dispatch.core.pricing._tokens import estimate_text_tokens
from llm_dispatch.core.wire._gemini_embeddings import gemini_embedding_param_problem
from llm_dispatch.simulator import anthropic_base_url, embedding_vector

from conftest import StartSim, cli, rows
from test_embedding_packing import Sink

BASE = "https://generativelanguage.googleapis.test"
HOST = "generativelanguage.googleapis.test"
KEY = "AIza-gemini-embed-test"
MODEL = "gemini-embedding-001"
PATH = f"/v1beta/models/{MODEL}:batchEmbedContents"
ROOT = Path(__file__).resolve().parent.parent


def embedding(text: str, *, model: str = MODEL, **params: Any) -> ChatRequest:
    return ChatRequest(model=model, messages=[{"role": "user", "content": text}], params=params, endpoint="embeddings")


def floats(raw: bytes) -> list[float]:
    return list(struct.unpack(f"<{len(raw) // 4}f", raw))


def respx_client() -> LLMClient:
    # httpx's own transport, which respx intercepts (the default aiohttp one goes past it).
    return LLMClient(provider="gemini", base_url=BASE, api_key=KEY, transport=httpx.AsyncHTTPTransport())


# --- the request, as Google's SDK sends it ----------------------------------------------------------------------


@respx.mock
async def test_one_text_goes_to_batch_embed_contents_as_the_sdk_sends_it() -> None:
    route = respx.post(host=HOST, path=PATH).mock(return_value=httpx.Response(200, json={
        "embeddings": [{"values": [0.5, -0.25, 0.125]}], "usageMetadata": {"promptTokenCount": 7}}))
    async with respx_client() as llm:
        result = await llm.chat(embedding("What is the meaning of life?", dimensions=3, taskType="RETRIEVAL_QUERY"))
    sent = route.calls.last.request
    assert sent.headers["x-goog-api-key"] == KEY and "authorization" not in sent.headers
    assert json.loads(sent.content) == {"requests": [{
        "model": f"models/{MODEL}", "content": {"parts": [{"text": "What is the meaning of life?"}]},
        "outputDimensionality": 3, "taskType": "RETRIEVAL_QUERY"}]}
    assert result.embedding is not None and floats(result.embedding) == [0.5, -0.25, 0.125]
    assert (result.prompt_tokens, result.completion_tokens, result.embeddings) == (7, 0, None)


@respx.mock
async def test_texts_that_share_their_parameters_go_100_to_a_request_and_each_gets_its_own_vector() -> None:
    seen: list[list[str]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        texts = [item["content"]["parts"][0]["text"] for item in json.loads(request.content)["requests"]]
        seen.append(texts)
        return httpx.Response(200, json={"embeddings": [{"values": [float(text.split()[-1]), 1.0]} for text in texts],
                                         "usageMetadata": {"promptTokenCount": 10 * len(texts)}})

    route = respx.post(host=HOST, path=PATH).mock(side_effect=answer)
    items = [WorkItem(prompt_ids=(i,), request=embedding(f"text {i}", title="t", taskType="RETRIEVAL_DOCUMENT"))
             for i in range(250)]
    sink = Sink()
    async with respx_client() as llm:
        await send_all(client=llm, items=items, sink=sink, concurrency=4)  # type: ignore[arg-type]
    # Gemini's 100 a request (OpenAI's 2,048 would have made one).
    assert route.call_count == 3 and sorted(len(texts) for texts in seen) == [50, 100, 100]
    assert sorted(sink.answers) == list(range(250)) and not sink.failures
    assert all(floats(sink.answers[i].embedding or b"") == [float(i), 1.0] for i in range(250))
    # Each text's share of what Google reported for its request, adding up to it.
    assert sum(answer.prompt_tokens for answer in sink.answers.values()) == 10 * 250


@respx.mock
async def test_an_answer_without_usage_is_counted_by_the_estimate_of_the_texts_sent() -> None:
    texts = ["a short text", "a rather longer text about the embeddings of several documents"]
    respx.post(host=HOST, path=PATH).mock(return_value=httpx.Response(200, json={
        "embeddings": [{"values": [1.0]}, {"values": [2.0]}]}))
    sink = Sink()
    items = [WorkItem(prompt_ids=(i,), request=embedding(text)) for i, text in enumerate(texts)]
    async with respx_client() as llm:
        await send_all(client=llm, items=items, sink=sink, concurrency=1)  # type: ignore[arg-type]
    assert [sink.answers[i].prompt_tokens for i in range(2)] == [estimate_text_tokens(text) for text in texts]


def test_parameters_gemini_has_no_equivalent_for_are_refused_in_one_line() -> None:
    assert "floats only" in (gemini_embedding_param_problem("encoding_format", "base64") or "")
    assert "no Gemini equivalent" in (gemini_embedding_param_problem("user", "u1") or "")
    assert "taskType must be one of" in (gemini_embedding_param_problem("taskType", "SEARCH") or "")
    assert gemini_embedding_param_problem("dimensions", 0) is not None
    assert gemini_embedding_param_problem("outputDimensionality", 768) is None


# --- over real sockets, against the simulator ----------------------------------------------------------------------


async def test_the_simulator_answers_packed_texts_with_their_vectors_and_usage(start_sim: StartSim) -> None:
    url = anthropic_base_url(await start_sim(api_key=KEY))
    texts = [f"document number {i}" for i in range(230)]
    items = [WorkItem(prompt_ids=(i,), request=embedding(text, dimensions=8)) for i, text in enumerate(texts)]
    sink = Sink()
    async with LLMClient(provider="gemini", base_url=url, api_key=KEY) as llm:
        await send_all(client=llm, items=items, sink=sink, concurrency=4)  # type: ignore[arg-type]
    async with httpx.AsyncClient() as http:
        counted = (await http.get(f"{url}/_sim/stats")).json()
    assert counted["by_status"]["embeddings"] == 3 and counted["embedding_inputs"] == 230  # 100 + 100 + 30
    assert sorted(sink.answers) == list(range(230)) and not sink.failures
    for i, text in enumerate(texts):
        assert floats(sink.answers[i].embedding or b"") == pytest.approx(
            embedding_vector(text, model=MODEL, dimensions=8))
    assert sum(answer.prompt_tokens for answer in sink.answers.values()) == counted["prompt_tokens"] > 0


async def test_the_simulator_refuses_what_google_refuses(start_sim: StartSim) -> None:
    url = anthropic_base_url(await start_sim(api_key=KEY))
    one = {"model": f"models/{MODEL}", "content": {"parts": [{"text": "hi"}]}}
    async with httpx.AsyncClient(headers={"x-goog-api-key": KEY}) as http:
        too_many = await http.post(f"{url}{PATH}", json={"requests": [one] * 101})
        other_model = await http.post(f"{url}{PATH}", json={"requests": [{**one, "model": "models/other"}]})
        no_key = await http.post(f"{url}{PATH}", json={"requests": [one]}, headers={"x-goog-api-key": ""})
        ok = await http.post(f"{url}{PATH}", json={"requests": [one]})
    assert too_many.status_code == 400 and "at most 100 requests" in too_many.json()["error"]["message"]
    assert too_many.json()["error"]["status"] == "INVALID_ARGUMENT"
    assert other_model.status_code == 400 and "must match" in other_model.json()["error"]["message"]
    assert no_key.status_code == 400  # an empty key is a wrong key: API_KEY_INVALID
    assert ok.status_code == 200 and len(ok.json()["embeddings"][0]["values"]) == 3072


async def test_a_bad_text_fails_alone_and_a_quota_429_is_waited_out(start_sim: StartSim) -> None:
    url = anthropic_base_url(await start_sim(api_key=KEY, retry_after=0.05))
    texts = [f"text {i}" for i in range(108)]
    texts[1] = "text 1 [[sim:429x1]]"  # the first request of 100 answers 429 once (a request says one marker)
    texts[105] = "text 105 [[sim:400]]"  # the second, of 8, is halved down to it
    items = [WorkItem(prompt_ids=(i,), request=embedding(text, dimensions=4)) for i, text in enumerate(texts)]
    sink = Sink()
    async with LLMClient(provider="gemini", base_url=url, api_key=KEY) as llm:
        await send_all(client=llm, items=items, sink=sink, concurrency=2)  # type: ignore[arg-type]
    assert sorted(sink.failures) == [105] and "INVALID_ARGUMENT" in str(sink.failures[105])
    assert sorted(sink.answers) == [i for i in range(108) if i != 105] and sink.answers[1].attempts == 2
    async with httpx.AsyncClient() as http:
        counted = (await http.get(f"{url}/_sim/stats")).json()
    # 100 twice, then 8, 4 + 4, 2 + 2, 1 + 1: no text answered twice.
    assert counted["markers"] == {"429": 2, "400": 4} and counted["requests_total"] == 9


# --- a whole run ----------------------------------------------------------------------------------------------------


@pytest.mark.prefect
def test_a_gemini_embeddings_file_runs_simulated_priced_and_its_vectors_export(
    cli_env: dict[str, str], db_url: str, tmp_path: Path
) -> None:
    example = ROOT / "examples" / "gemini-embeddings.jsonl"
    records = [json.loads(line) for line in example.read_text().splitlines() if line.strip()]
    done = cli("run", str(example), "--simulate", "--json", env=cli_env, cwd=tmp_path)
    check_stored_and_exported(done, records, db_url=db_url, cli_env=cli_env, cwd=tmp_path, route="realtime")


def check_stored_and_exported(done: Any, records: list[dict[str, Any]], *, db_url: str, cli_env: dict[str, str],
                              cwd: Path, route: str) -> None:
    """A finished run of ``records`` stored each text's vector through ``route``, priced at the model's input price
    (half of it through the Batch API), and exports them."""
    assert done.returncode == 0, done.stderr[-3000:]
    stored = rows(db_url, "SELECT p.custom_id, p.model, r.route, r.embedding, r.prompt_tokens, r.cost_pico_usd "
                          "FROM results r JOIN prompts p ON p.id = r.prompt_id ORDER BY p.position")
    assert [row[0] for row in stored] == [record["id"] for record in records]
    # The catalog's input prices per 1M tokens, in picodollars per token.
    price = {"gemini-embedding-001": 150_000, "gemini-embedding-2": 200_000}
    share = 2 if route == "batch" else 1
    for (_, model, taken, vector, tokens, cost), record in zip(stored, records):
        dimensions = record["params"].get("dimensions", 3072)
        assert taken == route and len(vector) == 4 * dimensions
        assert floats(vector) == pytest.approx(embedding_vector(record["input"], model=model, dimensions=dimensions))
        assert tokens > 0 and cost * share == tokens * price[model]
    exported = cli("export", json.loads(done.stdout)["job_id"], env=cli_env, cwd=cwd)
    assert exported.returncode == 0, exported.stderr[-3000:]
    lines = [json.loads(line) for line in exported.stdout.splitlines()]
    assert [len(line["embedding"]) for line in lines] == [len(row[3]) // 4 for row in stored]
