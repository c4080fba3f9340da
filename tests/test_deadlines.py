"""The client's attempt deadlines: one timer for all attempts, behaving as asyncio.timeout does."""

from __future__ import annotations

import asyncio
import time

import pytest

from llm_dispatch.core.http._deadlines import Deadlines


async def test_an_attempt_past_its_deadline_ends_in_timeout_error_soon_after() -> None:
    deadlines = Deadlines()
    started = time.perf_counter()
    with pytest.raises(TimeoutError, match="0.2s deadline"):
        async with deadlines.within(0.2) as deadline:
            looks_every = deadlines.resolution
            await asyncio.sleep(10)
    assert deadline.expired()
    assert time.perf_counter() - started >= 0.2  # never early
    # Never more than a tenth of the deadline late (plus scheduling): the timer looks every 0.02 s while it is in flight.
    assert looks_every == pytest.approx(0.02)


async def test_attempts_that_end_in_time_are_not_cancelled_and_leave_no_timer_behind() -> None:
    deadlines = Deadlines()

    async def attempt(i: int) -> int:
        async with deadlines.within(5) as deadline:
            await asyncio.sleep(0.01)
        assert not deadline.expired()
        return i

    assert await asyncio.gather(*(attempt(i) for i in range(200))) == list(range(200))
    assert not deadlines._open
    await asyncio.sleep(deadlines.resolution * 1.5)  # the next look finds nothing to watch and stops
    assert deadlines._timer is None


async def test_a_cancellation_from_outside_stays_a_cancellation() -> None:
    deadlines = Deadlines()
    entered = asyncio.Event()

    async def attempt() -> None:
        async with deadlines.within(5):
            entered.set()
            await asyncio.sleep(10)

    task = asyncio.create_task(attempt())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not deadlines._open


async def test_only_the_late_attempt_is_cut_the_others_go_on() -> None:
    deadlines = Deadlines()

    async def attempt(seconds: float, within: float) -> str:
        try:
            async with deadlines.within(within):
                await asyncio.sleep(seconds)
        except TimeoutError:
            return "timed out"
        return "done"

    assert await asyncio.gather(attempt(1.0, 0.2), attempt(0.3, 2.0), attempt(0.05, 0.2)) == [
        "timed out", "done", "done"]


def test_deadlines_hold_in_each_new_event_loop() -> None:
    """A client kept across event loops (one per test, say) still cuts attempts in the second loop."""
    deadlines = Deadlines()

    async def hang() -> None:
        async with deadlines.within(0.1):
            await asyncio.sleep(5)

    for _ in range(2):
        with pytest.raises(TimeoutError):  # the 5 s sleep was cut: it would have ended without an error
            asyncio.run(hang())


async def test_the_timer_slows_again_once_a_short_deadline_is_no_longer_in_flight() -> None:
    """One call with a short timeout makes the looks frequent only while that call is in flight."""
    deadlines = Deadlines()
    release = asyncio.Event()

    async def long_attempt() -> None:
        async with deadlines.within(30):
            await release.wait()

    task = asyncio.create_task(long_attempt())
    await asyncio.sleep(0)
    assert deadlines.resolution == 1.0
    async with deadlines.within(0.05):
        await asyncio.sleep(0.01)
    assert deadlines.resolution == pytest.approx(0.005)
    await asyncio.sleep(0.03)  # a look finds only the 30 s attempt in flight
    assert deadlines.resolution == 1.0
    release.set()
    await task


def test_an_attempts_deadline_grows_with_its_maximum_output_at_anthropics_pace() -> None:
    from llm_dispatch.core.http._deadlines import attempt_deadline

    # 1 h per 128,000 output tokens, never under the request timeout.
    assert attempt_deadline(max_output=None, floor=600) == 600
    assert attempt_deadline(max_output=16_000, floor=600) == 600  # 450 s of generation fits the floor
    assert attempt_deadline(max_output=64_000, floor=600) == 1800
    assert attempt_deadline(max_output=128_000, floor=600) == 3600
    assert attempt_deadline(max_output=16_000, floor=120) == 450


async def test_a_slow_long_generation_is_waited_for_as_long_as_its_cap_says(start_sim) -> None:  # noqa: ANN001
    """Over real sockets: a generation slower than the request timeout is answered once, because its cap gives it
    the time; the same generation without a cap is cut at the request timeout."""
    import httpx

    from llm_dispatch.core import APITimeoutError, ChatRequest, LLMClient

    url = await start_sim(slow_tokens_per_second=2000.0)  # 1,000 tokens: 0.5 s
    ask = [{"role": "user", "content": "[[sim:slow]] prove it"}]
    async with LLMClient(base_url=url, request_timeout=0.2, max_retries=0) as client:
        answer = await client.chat(ChatRequest(model="gpt-5.4", messages=ask, params={"max_completion_tokens": 1000}))
        assert answer.completion_tokens == 1000 and answer.attempts == 1
        with pytest.raises(APITimeoutError):
            await client.chat(ChatRequest(model="gpt-5.4", messages=ask))  # uncapped: 16,000 tokens, 8 s
    async with httpx.AsyncClient(timeout=60) as raw:  # the simulator runs in this loop: ask it without blocking
        stats = (await raw.get(url.removesuffix("/v1") + "/_sim/stats")).json()
    assert stats["markers"] == {"slow": 2}
