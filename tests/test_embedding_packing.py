"""Embeddings texts packed many to a real-time request (issue 27, item 4), within OpenAI's per-request limits: each
text still gets its own vector and share of the usage; a packed request is reserved on a budget once, retried whole,
halved on a 400, and never sent again for texts answered before a kill. The batch lane: test_embedding_batches.py."""

from __future__ import annotations

import asyncio
import struct
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from llm_dispatch.core import (
    ChatRequest,
    ChatResult,
    LLMClient,
    PackLimits,
    WorkItem,
    send_all,
)
from llm_dispatch.core.sending._dispatch import pack_work
from llm_dispatch.core.wire._packing import token_shares, unpack_embeddings
from llm_dispatch.core.pricing._tokens import estimate_text_tokens
from llm_dispatch.simulator import embedding_vector

from conftest import cli, rows, write_prompts

MODEL = "text-embedding-3-small"


def embedding(text: str, **params: Any) -> ChatRequest:
    return ChatRequest(model=MODEL, messages=[{"role": "user", "content": text}], params=params, endpoint="embeddings")


def vector_bytes_of(text: str, *, dimensions: int = 1536) -> bytes:
    return struct.pack(f"<{dimensions}f", *embedding_vector(text, model=MODEL, dimensions=dimensions))


class Sink:
    """Answers and failures as the ResultWriter would get them, by prompt id."""

    def __init__(self) -> None:
        self.answers: dict[int, ChatResult] = {}
        self.failures: dict[int, BaseException] = {}

    async def success(self, *, prompt_ids: Sequence[int], result: ChatResult, **_: Any) -> None:
        for pid in prompt_ids:
            assert pid not in self.answers, f"prompt {pid} answered twice"
            self.answers[pid] = result

    async def failure(self, *, prompt_ids: Sequence[int], error: BaseException, **_: Any) -> None:
        for pid in prompt_ids:
            self.failures[pid] = error

    async def release(self, *, prompt_ids: Sequence[int]) -> int:
        return len(prompt_ids)


class Gate:
    """A budget that holds whatever is asked, keeping what each reservation was for."""

    exhausted = False

    def __init__(self) -> None:
        self.reserved: list[ChatRequest] = []
        self.out = 0

    async def reserve(self, request: ChatRequest) -> int | None:
        self.reserved.append(request)
        self.out += 1
        return 1

    def landed(self, amount: int) -> None:
        self.out -= amount


# --- which texts share a request ----------------------------------------------------------------------------------


def test_texts_that_differ_only_in_their_text_share_a_request_up_to_its_input_limit() -> None:
    items = [WorkItem(prompt_ids=(i,), request=embedding(f"text {i}")) for i in range(5)]
    items.insert(2, WorkItem(prompt_ids=(90,), request=ChatRequest(model="gpt-4.1-mini",
                                                                     messages=[{"role": "user", "content": "hi"}])))
    items.append(WorkItem(prompt_ids=(91,), request=embedding("short", dimensions=8)))
    items.append(WorkItem(prompt_ids=(92, 93), request=embedding("twice said", dimensions=8)))

    work = pack_work(items, limits=PackLimits(max_inputs=2))

    sent = [(item.prompt_ids, item.request.endpoint, [m["content"] for m in item.request.messages]) for item in work]
    assert sent == [
        ((0, 1), "embeddings", ["text 0", "text 1"]),
        ((90,), "chat", ["hi"]),
        ((2, 3), "embeddings", ["text 2", "text 3"]),
        ((4,), "embeddings", ["text 4"]),  # a pack of one goes as it was: one text, not a list
        ((91, 92, 93), "embeddings", ["short", "twice said"]),  # same dimensions: one request, identical prompts one text
    ]
    assert [len(item.parts) for item in work] == [2, 0, 2, 0, 2]
    assert work[-1].request.params == {"dimensions": 8}


def test_a_request_holds_texts_up_to_three_quarters_of_its_token_cap_by_estimate() -> None:
    text = "word " * 1000  # about 1,100 tokens by our estimate
    items = [WorkItem(prompt_ids=(i,), request=embedding(f"{i} {text}")) for i in range(10)]
    per_text = estimate_text_tokens(f"0 {text}")

    work = pack_work(items, limits=PackLimits(max_tokens=4 * per_text + per_text // 2))

    # 4.5 texts' worth of cap, filled to 3/4 of it: three texts a request.
    assert [len(item.parts) or 1 for item in work] == [3, 3, 3, 1]


def test_a_packed_answers_usage_is_split_by_each_texts_estimated_tokens_and_sums_to_what_was_reported() -> None:
    assert token_shares(10, [1, 1, 1]) == [4, 3, 3]
    assert token_shares(7, [5, 0, 2]) == [5, 0, 2]
    texts = ["a", "a much longer text than the first one, with many more words in it", "middling text here"]
    vectors = tuple(struct.pack("<2f", i, -i) for i in range(3))
    answer = ChatResult(text=None, finish_reason=None, prompt_tokens=101, completion_tokens=0, cached_tokens=0,
                        model=MODEL, response_id=None, latency_s=0.5, attempts=2, embeddings=vectors)

    parts = unpack_embeddings(answer, texts)

    assert [part.embedding for part in parts] == list(vectors)
    assert sum(part.prompt_tokens for part in parts) == 101
    assert parts[0].prompt_tokens < parts[2].prompt_tokens < parts[1].prompt_tokens
    assert {(part.attempts, part.latency_s) for part in parts} == {(2, 0.5)}


# --- real-time over a real socket -----------------------------------------------------------------------------------


async def send_texts(base_url: str, texts: Sequence[str], *, budget: Gate | None = None,
                     **params: Any) -> tuple[Sink, list[WorkItem]]:
    items = [WorkItem(prompt_ids=(i,), request=embedding(text, **params)) for i, text in enumerate(texts)]
    sink = Sink()
    async with LLMClient(base_url=base_url, api_key="sk-test") as client:
        await send_all(client=client, items=items, sink=sink, concurrency=4, budget=budget)  # type: ignore[arg-type]
    return sink, items


async def stats(base_url: str) -> dict[str, Any]:
    import httpx

    async with httpx.AsyncClient() as http:
        return (await http.get(base_url.removesuffix("/v1") + "/_sim/stats")).json()


async def test_texts_sent_together_each_get_the_simulators_vector_and_a_share_of_its_usage(start_sim: Any) -> None:
    base_url = await start_sim(latency=0.0)
    texts = [f"document number {i}" for i in range(5000)]
    gate = Gate()

    sink, _ = await send_texts(base_url, texts, budget=gate, dimensions=16)

    counted = await stats(base_url)
    assert counted["by_status"]["embeddings"] == 3 and counted["embedding_inputs"] == 5000  # 2,048 + 2,048 + 904
    # The budget held each packed request once, for all its texts.
    assert sorted(len(request.messages) for request in gate.reserved) == [904, 2048, 2048] and gate.out == 0
    assert sorted(sink.answers) == list(range(5000)) and not sink.failures
    for i, text in enumerate(texts):
        assert sink.answers[i].embedding == vector_bytes_of(text, dimensions=16)
    assert sum(answer.prompt_tokens for answer in sink.answers.values()) == counted["prompt_tokens"]
    assert all(answer.prompt_tokens > 0 for answer in sink.answers.values())


async def test_a_packed_request_that_fails_is_retried_whole_and_each_text_answered_once(start_sim: Any) -> None:
    base_url = await start_sim(latency=0.0)
    texts = [f"text {i}" for i in range(3000)]
    texts[10] = "text 10 [[sim:500x1]]"  # the first pack's first send answers 500
    texts[2500] = "text 2500 [[sim:429x1]]"  # the second pack's, 429

    sink, _ = await send_texts(base_url, texts, dimensions=4)

    counted = await stats(base_url)
    assert counted["markers"] == {"500": 2, "429": 2}  # each pack sent twice, whole
    assert counted["requests_total"] == 4 and counted["embedding_inputs"] == 3000
    assert len(sink.answers) == 3000 and not sink.failures
    assert all(sink.answers[i].embedding == vector_bytes_of(text, dimensions=4) for i, text in enumerate(texts))
    assert {sink.answers[10].attempts, sink.answers[2500].attempts, sink.answers[0].attempts} == {2}


async def test_a_packed_request_refused_with_a_400_is_halved_until_the_bad_text_fails_alone(start_sim: Any) -> None:
    base_url = await start_sim(latency=0.0)
    texts = [f"text {i}" for i in range(8)]
    texts[5] = "text 5 [[sim:400]]"

    sink, _ = await send_texts(base_url, texts, dimensions=4)

    assert sorted(sink.failures) == [5] and "400" in str(sink.failures[5])
    assert sorted(sink.answers) == [0, 1, 2, 3, 4, 6, 7]
    assert all(sink.answers[i].embedding == vector_bytes_of(texts[i], dimensions=4) for i in sink.answers)
    # 8 texts, then 4 + 4, then the bad half's 2 + 2, then 1 + 1: never a text answered twice.
    assert (await stats(base_url))["requests_total"] == 7


# --- a run killed while packed requests are out ----------------------------------------------------------------


@pytest.mark.prefect
def test_a_run_killed_while_packed_requests_are_out_never_sends_an_answered_text_again(
    cli_env: dict[str, str], sim: Any, db_url: str, tmp_path: Path
) -> None:
    sim.configure(latency=0.3)
    total = 30_000
    path = write_prompts(tmp_path / "e.jsonl", [
        {"id": f"e{i}", "input": f"text {i}", "urgency": "urgent", "params": {"dimensions": 4}} for i in range(total)])
    command = [str(Path(sys.executable).with_name("llm-dispatch")), "run", str(path), "--endpoint", "embeddings",
               "--model", MODEL, "--chunk-size", "1000", "--concurrency", "2", "--json"]
    first = subprocess.Popen(command, env=cli_env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while answered(db_url) < 3000:
            assert time.monotonic() < deadline and first.poll() is None, "no packed request was answered"
            time.sleep(0.1)
    finally:
        first.kill()  # SIGKILL: nothing of the run's own clean-up happens
        first.wait()
    kept = answered(db_url)
    assert 3000 <= kept < total
    # What the killed run had out is answered (to no one) before the second run is counted.
    deadline = time.monotonic() + 30
    while sim.stats()["in_flight"]:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    before = sim.stats()["embedding_inputs"]

    again = subprocess.run(command, env=cli_env, cwd=tmp_path, capture_output=True, text=True, timeout=300)

    assert again.returncode == 0, again.stderr[-3000:]
    # The second run sent exactly the texts with no stored answer: none answered before the kill went again.
    assert sim.stats()["embedding_inputs"] - before == total - kept
    assert rows(db_url, "SELECT count(*), count(DISTINCT prompt_id) FROM results WHERE status = 'succeeded'") == [
        (total, total)]


def answered(db_url: str) -> int:
    try:
        return rows(db_url, "SELECT count(*) FROM results")[0][0]
    except Exception:  # noqa: BLE001 - no database, or no tables yet
        return 0
