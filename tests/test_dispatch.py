"""The dispatcher core: bounded concurrency, every outcome to the sink as it lands, sink errors stop it."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from llm_dispatch.core import BadRequestError, ChatRequest, ChatResult
from llm_dispatch.core.sending._dispatch import Progress, WorkItem, send_all


def result(text: str) -> ChatResult:
    return ChatResult(text=text, finish_reason="stop", prompt_tokens=3, completion_tokens=2, cached_tokens=0,
                      model="m", response_id="r", latency_s=0.01)


class FakeClient:
    def __init__(self, *, delay: float = 0.01) -> None:
        self.delay = delay
        self.in_flight = 0
        self.peak = 0
        self.calls: list[str] = []

    async def chat(self, request: ChatRequest) -> ChatResult:
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            await asyncio.sleep(self.delay)
            content = request.messages[0]["content"]
            self.calls.append(content)
            if content.startswith("bad"):
                raise BadRequestError("bad prompt", status_code=400)
            return result(content.upper())
        finally:
            self.in_flight -= 1


class RecordingSink:
    def __init__(self, *, fail_after: int | None = None) -> None:
        self.successes: list[tuple[tuple[int, ...], str]] = []
        self.failures: list[tuple[tuple[int, ...], str]] = []
        self.fail_after = fail_after

    async def success(
        self, *, prompt_ids: Sequence[int], result: ChatResult, route: str = "realtime", model: str | None = None
    ) -> None:
        if self.fail_after is not None and len(self.successes) >= self.fail_after:
            raise OSError("disk full")
        self.successes.append((tuple(prompt_ids), result.text or ""))

    async def failure(
        self, *, prompt_ids: Sequence[int], error: BaseException, final: bool = True, model: str | None = None
    ) -> None:
        self.failures.append((tuple(prompt_ids), type(error).__name__))


def items(*contents: str) -> list[WorkItem]:
    return [WorkItem(prompt_ids=(i,), request=ChatRequest(model="m", messages=[{"role": "user", "content": c}]))
            for i, c in enumerate(contents)]


async def test_every_outcome_reaches_the_sink_within_the_bound() -> None:
    client, sink, progress = FakeClient(), RecordingSink(), Progress()
    work = items(*(f"p{i}" for i in range(50)), "bad one")
    outcome = await send_all(client=client, items=work, sink=sink, concurrency=7, progress=progress)

    assert client.peak == 7
    assert outcome.succeeded == 50 and outcome.failed == 1
    assert dict(outcome.failed_by_class) == {"BadRequestError": 1}
    assert sorted(ids[0] for ids, _ in sink.successes) == list(range(50))
    assert sink.failures == [((50,), "BadRequestError")]
    assert (progress.succeeded, progress.failed, progress.in_flight) == (50, 1, 0)


async def test_results_are_persisted_as_they_complete_not_at_the_end() -> None:
    client, sink = FakeClient(delay=0.05), RecordingSink()
    task = asyncio.create_task(send_all(client=client, items=items(*(f"p{i}" for i in range(20))), sink=sink, concurrency=2))
    while not sink.successes:  # the first answer, handed to the sink...
        await asyncio.sleep(0.01)
    assert len(sink.successes) < 20 and not task.done()  # ...while the rest are still being sent
    await task


async def test_one_request_answers_a_group_of_identical_prompts() -> None:
    sink = RecordingSink()
    group = WorkItem(prompt_ids=(4, 9, 11), request=ChatRequest(model="m", messages=[{"role": "user", "content": "q"}]))
    outcome = await send_all(client=FakeClient(), items=[group], sink=sink, concurrency=3)
    assert sink.successes == [((4, 9, 11), "Q")] and outcome.succeeded == 3


async def test_a_sink_error_stops_the_run_loudly() -> None:
    with pytest.raises(ExceptionGroup) as info:
        await send_all(client=FakeClient(), items=items(*(f"p{i}" for i in range(20))), sink=RecordingSink(fail_after=3),
                       concurrency=2)
    assert info.group_contains(OSError, match="disk full")


async def test_items_waiting_for_the_clients_shared_limit_are_not_dispatched() -> None:
    # Another call holds every slot of the client's limit: this call's workers hold items but have
    # sent none, so its caller must not be told to start more work (else every chunk of a run starts).
    slots = asyncio.Semaphore(0)

    class SharedLimitClient(FakeClient):
        async def chat(self, request: ChatRequest) -> ChatResult:
            async with slots:
                return await super().chat(request)

    sink, dispatched = RecordingSink(), asyncio.Event()
    task = asyncio.create_task(send_all(client=SharedLimitClient(), items=items(*(f"p{i}" for i in range(10))),
                                        sink=sink, concurrency=4, on_dispatched=dispatched.set))
    await asyncio.sleep(0.05)
    assert not dispatched.is_set()

    for _ in range(2):  # the other call finishes: slots free up, answers come, two rounds are left
        slots.release()
    await asyncio.wait_for(dispatched.wait(), timeout=60)
    assert len(sink.successes) >= 2
    outcome = await task
    assert outcome.succeeded == 10
