"""The shared limits and the token estimate that feeds the TPM bucket; all on a fake clock, no real waiting."""

from __future__ import annotations

import asyncio

import pytest

from llm_dispatch.core.http._limits import AdaptiveLimiter, Pace, RateLimiter, SharedPause
from llm_dispatch.core.pricing._tokens import (
    DEFAULT_COMPLETION_TOKENS,
    TOKENS_PER_IMAGE,
    estimate_prompt_tokens,
    estimate_request_tokens,
    estimate_text_tokens,
)
from llm_dispatch.core._types import ChatRequest

from conftest import FakeTime


# --- adaptive concurrency ---------------------------------------------------------------------


def test_multiplicative_decrease_halves_down_to_the_floor() -> None:
    limiter = AdaptiveLimiter(ceiling=16)
    assert limiter.limit == 16
    seen = []
    for _ in range(6):
        limiter.record_rate_limit()
        seen.append(limiter.limit)
    assert seen == [8, 4, 2, 1, 1, 1]


async def test_a_burst_of_429s_from_one_window_halves_once() -> None:
    limiter = AdaptiveLimiter(ceiling=8)
    permits = [await limiter.acquire() for _ in range(8)]
    lowered = [limiter.record_rate_limit(permit) for permit in permits]
    assert lowered == [True] + [False] * 7
    assert limiter.limit == 4
    for _ in permits:
        limiter.release()
    # A request sent after the cut sees the new window, so its 429 cuts again.
    permit = await limiter.acquire()
    assert limiter.record_rate_limit(permit)
    limiter.release()
    assert limiter.limit == 2


def test_additive_increase_climbs_one_slot_per_window_and_stops_at_the_ceiling() -> None:
    limiter = AdaptiveLimiter(ceiling=4, initial=1)
    successes_per_step = []
    count = 0
    while limiter.limit < limiter.ceiling:
        before = limiter.limit
        limiter.record_success()
        count += 1
        if limiter.limit > before:
            successes_per_step.append(count)
            count = 0
    # About ``limit`` successes buy one more slot (1 -> 2 after 1, 2 -> 3 after 2, 3 -> 4 after 3).
    assert successes_per_step == [1, 2, 3]
    for _ in range(100):
        limiter.record_success()
    assert limiter.limit == 4


async def test_limit_is_never_exceeded_by_many_concurrent_callers() -> None:
    limiter = AdaptiveLimiter(ceiling=5)
    inside = 0
    peak = 0

    async def caller(i: int) -> None:
        nonlocal inside, peak
        permit = await limiter.acquire()
        try:
            inside += 1
            peak = max(peak, inside)
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            if i % 17 == 3:
                limiter.record_rate_limit(permit)
            else:
                limiter.record_success(permit)
            inside -= 1
        finally:
            limiter.release()

    await asyncio.gather(*(caller(i) for i in range(300)))
    assert peak == 5
    assert limiter.in_flight == 0
    assert limiter.waiting == 0


async def test_lowered_limit_holds_back_newcomers_until_enough_slots_free() -> None:
    limiter = AdaptiveLimiter(ceiling=4)
    permits = [await limiter.acquire() for _ in range(4)]
    limiter.record_rate_limit(permits[0])  # 4 -> 2 with 4 still in flight
    newcomer = asyncio.create_task(limiter.acquire())
    for _ in range(2):
        limiter.release()
        await asyncio.sleep(0)
    assert not newcomer.done()  # 2 in flight = the new limit
    limiter.release()
    await asyncio.sleep(0)
    assert newcomer.done()
    assert limiter.in_flight == 2


async def test_a_cancelled_waiter_leaks_no_slot() -> None:
    limiter = AdaptiveLimiter(ceiling=1)
    await limiter.acquire()
    waiter = asyncio.create_task(limiter.acquire())
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    limiter.release()
    assert limiter.in_flight == 0
    await limiter.acquire()
    assert limiter.in_flight == 1


async def test_an_increase_wakes_a_waiter() -> None:
    limiter = AdaptiveLimiter(ceiling=2, initial=1)
    await limiter.acquire()
    waiter = asyncio.create_task(limiter.acquire())
    await asyncio.sleep(0)
    assert not waiter.done()
    limiter.record_success()  # 1 -> 2
    await asyncio.sleep(0)
    assert waiter.done()
    assert limiter.in_flight == 2


def test_limiter_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        AdaptiveLimiter(ceiling=0)
    with pytest.raises(RuntimeError):
        AdaptiveLimiter(ceiling=1).release()


# --- shared pause -----------------------------------------------------------------------------


async def test_shared_pause_holds_every_caller_until_it_ends() -> None:
    clock = FakeTime()
    pause = SharedPause(clock=clock.monotonic, sleep=clock.sleep)
    pause.pause_for(5)
    released_at = []

    async def caller() -> None:
        await pause.wait()
        released_at.append(clock.now)

    await asyncio.gather(*(caller() for _ in range(3)))
    assert released_at == [1005.0, 1005.0, 1005.0]
    assert pause.remaining == 0


async def test_shared_pause_is_extended_never_shortened() -> None:
    clock = FakeTime()
    pause = SharedPause(clock=clock.monotonic, sleep=clock.sleep)
    pause.pause_for(10)
    pause.pause_for(2)
    assert pause.remaining == 10
    assert await pause.wait() == 10
    assert await pause.wait() == 0  # over: no more waiting


async def test_shared_pause_extended_while_waiting_waits_again() -> None:
    clock = FakeTime()

    async def sleep_and_extend(seconds: float) -> None:
        await clock.sleep(seconds)
        if len(clock.sleeps) == 1:
            pause.pause_for(3)  # another caller's 429 arrives during our wait

    pause = SharedPause(clock=clock.monotonic, sleep=sleep_and_extend)
    pause.pause_for(2)
    await pause.wait()
    assert clock.sleeps == [2, 3]
    assert clock.now == 1005.0


# --- RPM / TPM --------------------------------------------------------------------------------


async def test_rpm_spends_a_minute_of_budget_then_paces_at_the_rate() -> None:
    clock = FakeTime()
    rpm = RateLimiter(per_minute=60, clock=clock.monotonic, sleep=clock.sleep)
    started = []
    for _ in range(63):
        await rpm.acquire()
        started.append(clock.now)
    assert started[:60] == [1000.0] * 60
    assert started[60:] == pytest.approx([1001.0, 1002.0, 1003.0])


async def test_rpm_paces_concurrent_callers_in_order() -> None:
    clock = FakeTime()
    rpm = RateLimiter(per_minute=120, burst=1, clock=clock.monotonic, sleep=clock.sleep)
    started: list[tuple[int, float]] = []

    async def caller(i: int) -> None:
        await rpm.acquire()
        started.append((i, clock.now))

    await asyncio.gather(*(caller(i) for i in range(5)))
    assert [i for i, _ in started] == [0, 1, 2, 3, 4]
    assert [t for _, t in started] == pytest.approx([1000.0, 1000.5, 1001.0, 1001.5, 1002.0])


async def test_tpm_waits_for_the_estimate_and_is_corrected_by_actual_usage() -> None:
    clock = FakeTime()
    tpm = RateLimiter(per_minute=600, clock=clock.monotonic, sleep=clock.sleep)  # 10 tokens a second
    assert await tpm.acquire(500) == 0
    # 100 left; 200 more needs 10 s of refill.
    assert await tpm.acquire(200) == pytest.approx(10.0)
    assert tpm.available == pytest.approx(0.0)
    # Both calls really used 50 tokens: the refund makes room without waiting.
    tpm.adjust(50 - 500)
    tpm.adjust(50 - 200)
    assert tpm.available == pytest.approx(600.0)  # never above one minute's worth
    assert await tpm.acquire(600) == 0
    # A call that used more than estimated leaves a debt the next caller waits out.
    tpm.adjust(300)
    assert tpm.available == pytest.approx(-300.0)
    assert await tpm.acquire(100) == pytest.approx(40.0)


async def test_tpm_request_larger_than_the_bucket_waits_for_a_full_bucket_not_forever() -> None:
    clock = FakeTime()
    tpm = RateLimiter(per_minute=600, clock=clock.monotonic, sleep=clock.sleep)
    await tpm.acquire(600)
    assert await tpm.acquire(1500) == pytest.approx(60.0)
    assert tpm.available == pytest.approx(-900.0)


# --- token estimate ---------------------------------------------------------------------------

ENGLISH = (
    "The committee met on Tuesday to review the proposal for a new public library. After a long "
    "discussion about costs, location and opening hours, the members agreed to ask the city for "
    "additional funding and to publish a detailed plan before the end of the year."
)


def test_text_estimate_is_near_the_real_count_on_english() -> None:
    # 50: ENGLISH in o200k_base (gpt-4o's tokenizer), counted with bpe-openai; more in test_tokens.py.
    assert abs(estimate_text_tokens(ENGLISH) - 50) <= 4
    assert estimate_text_tokens("") == 0


def test_prompt_estimate_counts_the_chat_framing() -> None:
    assert estimate_prompt_tokens([]) == 3
    one = estimate_prompt_tokens([{"role": "user", "content": ENGLISH}])
    # 3 to prime the reply, then per message 3 of framing and 1 for the role.
    assert one == 3 + 3 + 1 + estimate_text_tokens(ENGLISH)
    two = estimate_prompt_tokens([{"role": "system", "content": "Be brief."}, {"role": "user", "content": ENGLISH}])
    assert two == one + 3 + 1 + estimate_text_tokens("Be brief.")


def test_prompt_estimate_reads_content_parts_and_counts_images() -> None:
    parts = [
        {"type": "text", "text": ENGLISH},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
    ]
    assert estimate_prompt_tokens([{"role": "user", "content": parts}]) == (
        7 + estimate_text_tokens(ENGLISH) + TOKENS_PER_IMAGE
    )


def test_request_estimate_adds_the_reply_allowance() -> None:
    messages = [{"role": "user", "content": ENGLISH}]
    prompt = estimate_prompt_tokens(messages)
    assert estimate_request_tokens(ChatRequest(model="m", messages=messages)) == prompt + DEFAULT_COMPLETION_TOKENS
    assert estimate_request_tokens(ChatRequest(model="m", messages=messages, params={"max_tokens": 50})) == prompt + 50
    with_both = ChatRequest(model="m", messages=messages, params={"max_completion_tokens": 80, "max_tokens": 50})
    assert estimate_request_tokens(with_both) == prompt + 80
    several = ChatRequest(model="m", messages=messages, params={"max_tokens": 50, "n": 3})
    assert estimate_request_tokens(several) == prompt + 150
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    with_tools = ChatRequest(model="m", messages=messages, params={"max_tokens": 50, "tools": tools})
    assert estimate_request_tokens(with_tools) > prompt + 50


# --- the pace the provider's headers set ---------------------------------------------------------


async def test_a_pace_spaces_requests_evenly_under_the_stated_limit() -> None:
    clock = FakeTime()
    started = clock.now
    pace = Pace(per_minute=600, clock=clock.monotonic, sleep=clock.sleep)
    for _ in range(20):
        await pace.acquire()
    # 0.95 x 600 a minute: one every 60 / 570 s; starting empty, the 20th goes at 20 of those.
    assert clock.now - started == pytest.approx(20 * 60 / 570, rel=0.01)


async def test_a_pace_follows_what_the_account_has_left_when_another_run_spends_it() -> None:
    clock = FakeTime()
    pace = Pace(per_minute=6000, clock=clock.monotonic, sleep=clock.sleep)
    await clock.sleep(1.0)
    mark = await pace.acquire()
    # Our pace had 23 to spend; the account says 3 remain after this request: someone else spent the rest.
    pace.observe(limit=6000, remaining=3, mark=mark, amount=1)
    started = clock.now
    for _ in range(3):
        await pace.acquire()
    assert clock.now == started  # the three the account had
    await pace.acquire()
    assert clock.now > started  # and no more, until the pace refills


async def test_a_quota_429_lowers_the_pace_once_per_burst_and_it_grows_back() -> None:
    clock = FakeTime()
    pace = Pace(per_minute=600, clock=clock.monotonic, sleep=clock.sleep)
    marks = [await pace.acquire() for _ in range(3)]
    assert pace.back_off(marks[0])
    assert not pace.back_off(marks[1])  # let through before the decrease: the same overload
    assert pace.per_minute == pytest.approx(570 * 0.8)
    await clock.sleep(10.0)
    await pace.acquire()
    assert pace.per_minute == pytest.approx(570)


class _SteppedTime:
    """A clock a driver moves in small steps, so that several tasks sleeping on it wait at once (not in turn)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        until = self.now + seconds
        while self.now < until - 1e-9:
            await asyncio.sleep(0)


async def test_two_paces_on_one_account_converge_to_sharing_it() -> None:
    clock = _SteppedTime()
    window: list[float] = []  # when the account admitted each request of its last second (100 a second)
    sent: dict[str, list[float]] = {"a": [], "b": []}
    refused: dict[str, list[float]] = {"a": [], "b": []}
    paces = {name: Pace(per_minute=6000, clock=clock.monotonic, sleep=clock.sleep) for name in sent}
    end = clock.now + 12.0

    async def run(name: str) -> None:
        pace = paces[name]
        while clock.now < end:
            mark = await pace.acquire()
            window[:] = [at for at in window if at > clock.now - 1.0]
            admitted = len(window) < 100
            if admitted:
                window.append(clock.now)
            (sent if admitted else refused)[name].append(clock.now)
            pace.observe(limit=6000, remaining=100 - len(window), mark=mark, amount=1 if admitted else 0)
            if not admitted:
                pace.back_off(mark)

    runs = [asyncio.create_task(run(name)) for name in sent]
    while not all(task.done() for task in runs):
        clock.now += 0.002
        for _ in range(3):
            await asyncio.sleep(0)
    await asyncio.gather(*runs)
    last = {name: sum(at >= end - 4.0 for at in times) / 4.0 for name, times in sent.items()}
    # Each takes about half of the 95 a second a lone pace would, and together they stop running into 429s.
    assert all(40 <= rate <= 55 for rate in last.values()), last
    assert 88 <= sum(last.values()) <= 100, last
    late_refused = sum(at >= end - 6.0 for times in refused.values() for at in times)
    late_sent = sum(at >= end - 6.0 for times in sent.values() for at in times)
    assert late_refused <= 0.01 * late_sent, (late_refused, late_sent)
    assert paces["a"].others_per_minute / 60 == pytest.approx(last["b"], rel=0.15)
    assert paces["b"].others_per_minute / 60 == pytest.approx(last["a"], rel=0.15)


async def test_a_lone_pace_sees_no_others_and_keeps_its_full_pace() -> None:
    clock = FakeTime()
    pace = Pace(per_minute=6000, clock=clock.monotonic, sleep=clock.sleep)
    window: list[float] = []
    for _ in range(500):
        mark = await pace.acquire()
        window[:] = [at for at in window if at > clock.now - 1.0]
        window.append(clock.now)
        pace.observe(limit=6000, remaining=100 - len(window), mark=mark, amount=1)
    assert pace.others_per_minute < 60
    assert pace.per_minute == pytest.approx(5700)
