"""Embeddings texts packed many to a batch line (issue 27, item 4, batch lane): lines within the Batch API's cap on
embedding inputs per batch, filled evenly; the simulator's cap; a run that packs in both lanes, embeds each distinct
text once, and stores each text's vector and share of the cost, under a budget."""

from __future__ import annotations

import asyncio
import json
import struct
import time
from pathlib import Path
from typing import Any

import pytest

from llm_dispatch.core import BatchLimits, BatchLine, ChatResult, LLMClient, OpenAIBatchApi, unpack_line
from llm_dispatch.jobs._batch_build import BatchBuilder, Group
from llm_dispatch.simulator import embedding_vector

from conftest import cli, rows, write_prompts

MODEL = "text-embedding-3-small"


def vector_bytes_of(text: str, *, dimensions: int) -> bytes:
    return struct.pack(f"<{dimensions}f", *embedding_vector(text, model=MODEL, dimensions=dimensions))


# --- batch files ------------------------------------------------------------------------------------------------


class _Row:
    """A prompt row as the batch builder reads it (``storage.WorkRow``'s fields it uses)."""

    def __init__(self, prompt_id: int, text: str) -> None:
        self.id, self.model, self.endpoint, self.params = prompt_id, MODEL, "embeddings", {}
        self.messages = [{"role": "user", "content": text}]


def test_a_batch_packs_texts_into_lines_filled_evenly_to_its_cap_on_inputs(tmp_path: Path) -> None:
    builder = BatchBuilder(directory=tmp_path, provider_of=lambda model: "openai")
    builder.use("openai", limits=BatchLimits(max_embedding_inputs=5000))
    groups = [Group(first=_Row(i, f"text {i}"), prompt_ids=(i,)) for i in range(1, 12_001)]  # type: ignore[arg-type]
    groups[5] = Group(first=groups[5].first, prompt_ids=(6, 20_000))  # an identical prompt rides on its line

    built = builder.add(groups) + builder.close()

    # 5,000 inputs a batch: 3 lines of 1,666 (ceil(5000 / 2048) lines, filled evenly), not 2,048 + 2,048 + 904.
    lines = [[json.loads(line) for line in item.file.path.read_text().splitlines()] for item in built]
    assert [[len(line["body"]["input"]) for line in file] for file in lines] == [
        [1666, 1666, 1666], [1666, 1666, 1666], [1666, 338]]
    first = built[0]
    assert first.file.requests == 3 and lines[0][0]["custom_id"] == "p1"
    assert lines[0][0]["body"]["input"][:2] == ["text 1", "text 2"]
    members = dict(first.members)
    assert members[1] == "p1.0" and members[6] == members[20_000] == "p1.5" and members[1667] == "p1667.0"


def test_a_packed_lines_error_goes_to_each_text_and_a_wrong_vector_count_fails_them_as_billed() -> None:
    members = [(0, "p1.0"), (1, "p1.1"), (2, "p1.2")]
    error = BatchLine(custom_id="p1", result=None, error_code="server_error", error_message="boom", status_code=500,
                      retryable=True, line=3)

    split = unpack_line(error, texts=["a", "b", "c"], members=members)

    assert [(name, line.custom_id, line.error_code, line.retryable) for name, line in split] == [
        (name, name, "server_error", True) for _, name in members]
    answer = ChatResult(text=None, finish_reason=None, prompt_tokens=9, completion_tokens=0, cached_tokens=0,
                        model=MODEL, response_id=None, latency_s=0.0, embeddings=(b"\0" * 8, b"\0" * 8))
    short = BatchLine(custom_id="p1", result=answer, error_code=None, error_message=None, status_code=200,
                      retryable=False, line=3)

    split = unpack_line(short, texts=["a", "b", "c"], members=members)

    assert {(line.error_code, line.billed, line.retryable) for _, line in split} == {("unusable_answer", True, False)}
    assert "2 vectors for the 3 texts" in str(split[0][1].error_message)
    # The request's usage is priced once, with its first text.
    assert [line.usage is not None for _, line in split] == [True, False, False]


async def test_the_simulator_fails_an_embeddings_batch_of_more_than_50000_inputs(start_sim: Any,
                                                                                  tmp_path: Path) -> None:
    base_url = await start_sim(latency=0.0, batch_processing_seconds=0.2)
    source = tmp_path / "big.jsonl"
    with source.open("w") as out:
        for line in range(26):  # 26 x 2,000 = 52,000 inputs
            body = {"model": MODEL, "input": [f"t{line}-{i}" for i in range(2000)], "dimensions": 4}
            out.write(json.dumps({"custom_id": f"p{line}", "method": "POST", "url": "/v1/embeddings",
                                  "body": body}) + "\n")
    async with LLMClient(base_url=base_url, api_key="sk-test", max_retries=0) as client:
        uploaded = await OpenAIBatchApi(client).upload_file(source)
        batch = await OpenAIBatchApi(client).create_batch(input_file_id=uploaded.id, endpoint="/v1/embeddings")
        deadline = time.monotonic() + 30
        while not batch.status.is_terminal:
            assert time.monotonic() < deadline, f"batch stuck in {batch.status}"
            await asyncio.sleep(0.05)
            batch = await OpenAIBatchApi(client).retrieve(batch.id)
    assert batch.status.value == "failed"
    assert [error.code for error in batch.errors] == ["too_many_embedding_inputs"]
    assert "52000" in batch.errors[0].message


# --- a run in both lanes ------------------------------------------------------------------------------


@pytest.mark.prefect
def test_a_run_packs_texts_in_both_lanes_embeds_each_text_once_and_stores_a_vector_and_cost_each(
    cli_env: dict[str, str], sim: Any, db_url: str, tmp_path: Path
) -> None:
    # 3,000 prompts, 1,250 distinct texts: even ones real-time, odd ones through the Batch API (a text's copies
    # all in its own lane).
    texts = [f"text {i % 1250}" for i in range(3000)]
    path = write_prompts(tmp_path / "e.jsonl", [
        {"id": f"e{i}", "input": text, "urgency": "urgent" if i % 2 == 0 else "bulk", "params": {"dimensions": 4}}
        for i, text in enumerate(texts)])

    done = cli("run", str(path), "--endpoint", "embeddings", "--model", MODEL, "--budget", "1", "--json",
               env=cli_env, cwd=tmp_path)

    assert done.returncode == 0, done.stderr[-3000:]
    counted = sim.stats()
    assert counted["embedding_inputs"] == 1250
    assert counted["by_status"]["embeddings"] == 1 and counted["batch_lines"] == 1  # 625 texts a lane, one request
    stored = rows(db_url, "SELECT p.custom_id, r.route, r.embedding, r.prompt_tokens, r.cost_pico_usd, "
                          "r.list_cost_pico_usd FROM results r JOIN prompts p ON p.id = r.prompt_id "
                          "WHERE r.status = 'succeeded' ORDER BY p.position")
    assert [custom_id for custom_id, *_ in stored] == [f"e{i}" for i in range(3000)]
    for (_, route, vector, tokens, cost, list_cost), text in zip(stored, texts):
        assert vector == vector_bytes_of(text, dimensions=4)
        if route == "reused":
            assert cost == 0
        else:
            # Each text's share of its request's tokens, at $0.02 per 1M; half of it through the Batch API.
            assert tokens > 0 and list_cost == tokens * 20_000
            assert cost == (list_cost if route == "realtime" else list_cost // 2)
    paid = [row for row in stored if row[1] != "reused"]
    assert sorted(route for _, route, *_ in paid) == ["batch"] * 625 + ["realtime"] * 625
    assert sum(tokens for _, _, _, tokens, *_ in paid) == counted["prompt_tokens"]
    # The budget counted what each text's row cost.
    job_id = json.loads(done.stdout)["job_id"]
    assert rows(db_url, "SELECT spent_pico_usd FROM budget_periods WHERE budget = ?", f"job:{job_id}") == [
        (sum(cost for *_, cost, _ in paid),)]


