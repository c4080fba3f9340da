"""The cache plan: prompts grouped by the prefix each provider caches on, a plan per group and provider chosen by
cost, the warm-up order, and a planned send against the simulator's documented caches."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Any

import pytest

from llm_dispatch.core import (
    ChatRequest,
    ChatResult,
    LLMClient,
    PriceTable,
    Warmth,
    WarmUpQueue,
    WorkItem,
    find_prefix_groups,
    plan_caches,
    provider_lookup,
    send_all,
)
from llm_dispatch.simulator import anthropic_base_url

from conftest import StartSim

RUBRIC = "Grade the answer by the rubric below, point by point. " * 300  # ~3,300 tokens
PROVIDER = provider_lookup()


def ask(model: str, item: str, *, system: Any = RUBRIC, **params: Any) -> ChatRequest:
    messages = [{"role": "system", "content": system}] if system is not None else []
    return ChatRequest(model=model, messages=[*messages, {"role": "user", "content": item}],
                       params={"max_tokens": 16, **params})


def groups_of(requests: list[ChatRequest]) -> Any:
    return find_prefix_groups(enumerate(requests), provider_of=PROVIDER)


@pytest.fixture(scope="module")
def prices() -> PriceTable:
    return PriceTable.load()


# --- grouping ------------------------------------------------------------------------------------


def test_prompts_are_grouped_by_their_whole_prefix_in_wire_order() -> None:
    tool = {"type": "function", "function": {"name": "grade", "parameters": {"type": "object"}}}
    requests = [ask("gpt-5.4-mini", f"item {n}") for n in range(5)]
    requests += [ask("gpt-5.4-mini", f"item {n}", tools=[tool]) for n in range(3)]  # tools come first: another
    requests += [ask("claude-sonnet-4-5", f"item {n}") for n in range(2)]  # another model: another
    requests += [ask("gpt-5.4-mini", "alone", system="Another instruction.")]  # one prompt: no group
    requests += [ask("gpt-5.4-mini", "no system", system=None)]  # nothing before its one message
    found = groups_of(requests)
    assert [(group.model, group.prompts, group.provider) for group in found] == [
        ("gpt-5.4-mini", 5, "openai"), ("gpt-5.4-mini", 3, "openai"), ("claude-sonnet-4-5", 2, "anthropic")]
    assert found[0].first_ids == [0, 1, 2] and found[1].first_ids == [5, 6, 7]
    assert 3000 < found[0].prefix_tokens < found[1].prefix_tokens < 4000
    assert found[0].key != found[1].key != found[2].key


def test_a_group_whose_prompts_set_breakpoints_is_left_as_given(prices: PriceTable) -> None:
    marked = [{"type": "text", "text": RUBRIC, "cache_control": {"type": "ephemeral"}}]
    requests = [ask("claude-sonnet-4-5", f"item {n}", system=marked) for n in range(10)]
    plan = plan_caches(groups_of(requests), total_prompts=10, concurrency=10, prices=prices)
    # Sent as written, warmed first so that the file's own breakpoint is read by the rest.
    assert [(group.action, group.warm_up) for group in plan.groups] == [("as-given", True)]
    assert plan.prepare(requests[0]) == (requests[0], plan.groups[0].group.key)
    batch = plan_caches(groups_of(requests), total_prompts=10, concurrency=10, prices=prices, lane="batch")
    assert batch.prepare(requests[0]) == (requests[0], None)


# --- each provider's plan ------------------------------------------------------------------------


def test_openai_starts_a_group_on_one_key_and_prices_the_spread_as_its_worst_case(prices: PriceTable) -> None:
    fast = [ask("gpt-5.4-mini", f"item {n}") for n in range(10_000)]
    plan = plan_caches(groups_of(fast), total_prompts=10_000, concurrency=400, latency_s=1.0, prices=prices)
    (group,) = plan.groups
    # 24,000 requests a minute over ~25 s: were the provider to overflow, a key's warm-up against 15 a minute each.
    assert group.action == "keys" and 1000 < group.keys < 2000 and "spread to ~" in group.reason
    assert group.planned_cost is not None and group.worst_cost is not None and group.uncached_cost is not None
    assert group.planned_cost < group.worst_cost < group.uncached_cost
    # The key is not set when planned but as each request leaves; the group waits on its first key's warm-up.
    assert plan.prepare(fast[1]) == (fast[1], group.group.key)
    slow = [ask("gpt-5.4-mini", f"item {n}") for n in range(200)]
    plan = plan_caches(groups_of(slow), total_prompts=10_000, concurrency=10, latency_s=5.0, prices=prices)
    assert plan.groups[0].keys == 1 and "spread" not in plan.groups[0].reason  # ~2 a minute: one key at most
    assert plan.groups[0].planned_cost == plan.groups[0].worst_cost and plan.groups[0].saved
    assert plan.groups[0].saved > 0


def answer(cached: int) -> ChatResult:
    return ChatResult(text="ok", prompt_tokens=3500, completion_tokens=1, cached_tokens=cached, finish_reason="stop",
                      model="gpt-5.4-mini", response_id="r", latency_s=1.0)


async def test_openai_keys_stay_one_while_answers_read_the_prefix_and_spread_once_they_overflow(
    prices: PriceTable,
) -> None:
    requests = [ask("gpt-5.4-mini", f"item {n}") for n in range(2_000)]
    plan = plan_caches(groups_of(requests), total_prompts=2_000, concurrency=100, latency_s=1.0, prices=prices)
    group = plan.groups[0].group.key

    async def send(count: int, *, cached: int) -> list[str]:
        """Deal ``count`` requests one at a time, each answered before the next leaves."""
        names = []
        for request in requests[:count]:
            sent, ticket = await plan.deal(request, plan.group_key(request))
            names.append(sent.params["prompt_cache_key"])
            plan.answered(group, answer(0 if ticket and ticket.writer else cached), model="gpt-5.4-mini",
                          ticket=ticket)
        return names

    # The first request writes key 0; every later one reads it: no spread, however many are sent.
    assert set(await send(200, cached=3456)) == {f"llmd-{group}-0"} and plan.keys_used(group) == 1
    # Answers of the warm key reading nothing: the provider overflows; 5 in a window of 20 spread the group over
    # the keys its rate needs (100 in flight at 1 s: ~6,000 requests a minute, 15 a minute each).
    await send(5, cached=0)
    spread = plan.keys_used(group)
    assert spread is not None and spread > 100
    names = await send(spread + 5, cached=3456)
    # Each new key's writer goes first, one each; then the warm keys in turn.
    assert len(set(names[:spread - 1])) == spread - 1 and f"llmd-{group}-0" not in names[:spread - 1]
    assert set(names) <= {f"llmd-{group}-{index}" for index in range(spread)}
    # The probe after the spread: a quarter still cold, as if the provider took less than the guide's rate; the
    # group spreads again by what its keys fall short by.
    await send(10, cached=3456)
    await send(5, cached=0)
    again = plan.keys_used(group)
    assert again is not None and again >= math.ceil(spread / 0.75)


async def test_a_probe_holds_the_rest_of_the_group_for_one_round_of_answers(prices: PriceTable) -> None:
    requests = [ask("gpt-5.4-mini", f"item {n}") for n in range(100)]
    plan = plan_caches(groups_of(requests), total_prompts=100, concurrency=50, latency_s=1.0, prices=prices)
    group = plan.groups[0].group.key
    writer = await plan.deal(requests[0], plan.group_key(requests[0]))
    plan.answered(group, answer(0), model="gpt-5.4-mini", ticket=writer[1])
    probe = [await plan.deal(request, plan.group_key(request)) for request in requests[1:21]]
    waiting = asyncio.ensure_future(plan.deal(requests[21], plan.group_key(requests[21])))
    await asyncio.sleep(0)
    assert not waiting.done()  # 20 out on the warm key: the rest wait for their answers
    for _, ticket in probe[:-1]:
        plan.answered(group, answer(3456), model="gpt-5.4-mini", ticket=ticket)
    await asyncio.sleep(0)
    assert not waiting.done()
    plan.unanswered(probe[-1][1])  # a failed probe request counts as settled, not as evidence
    sent, _ = await waiting
    assert sent.params["prompt_cache_key"] == f"llmd-{group}-0" and plan.keys_used(group) == 1


async def test_a_failed_writer_leaves_its_key_to_the_next_request(prices: PriceTable) -> None:
    requests = [ask("gpt-5.4-mini", f"item {n}") for n in range(50)]
    plan = plan_caches(groups_of(requests), total_prompts=50, concurrency=10, prices=prices)
    first, ticket = await plan.deal(requests[0], plan.group_key(requests[0]))
    assert ticket is not None and ticket.writer
    plan.unanswered(ticket)
    again, retry = await plan.deal(requests[1], plan.group_key(requests[1]))
    assert retry is not None and retry.writer and again.params["prompt_cache_key"] == first.params[
        "prompt_cache_key"]
    other = ask("claude-sonnet-4-5", "x")
    assert await plan.deal(other, plan.group_key(other)) == (other, None)


@pytest.mark.parametrize("overflow", [None, 15])
async def test_a_planned_openai_send_keeps_one_key_unless_the_provider_overflows(
    start_sim: StartSim, prices: PriceTable, overflow: int | None,
) -> None:
    url = await start_sim(latency=0.02, cache_overflow_rpm=overflow)
    requests = [ask("gpt-5.4-mini", f"item {n}") for n in range(300)]
    plan = plan_caches(groups_of(requests), total_prompts=300, concurrency=20, latency_s=0.02, prices=prices)
    sink = Sink()
    async with LLMClient(base_url=url, api_key="k") as client:
        await send_all(client=client, items=[WorkItem(prompt_ids=(n,), request=r) for n, r in enumerate(requests)],
                       sink=sink, concurrency=20, cache_plan=plan)
    cold = sum(1 for result in sink.results if not result.cached_tokens)
    keys = plan.keys_used(plan.groups[0].group.key)
    assert keys is not None
    if overflow is None:  # one warm-up, every other request read it
        assert (keys, cold) == (1, 1)
    else:  # the home machine took 15 a minute and the rest went cold until the group spread
        assert keys > 1


def test_anthropic_gets_one_breakpoint_at_the_prefix_end_with_the_ttl_its_pace_needs(prices: PriceTable) -> None:
    requests = [ask("claude-sonnet-4-5", f"item {n}") for n in range(200)]
    plan = plan_caches(groups_of(requests), total_prompts=200, concurrency=50, latency_s=2.0, prices=prices)
    (group,) = plan.groups
    assert (group.action, group.ttl) == ("breakpoint", "5m")
    sent, warm_key = plan.prepare(requests[3])
    assert warm_key == group.group.key
    assert sent.messages[0]["content"] == [{"type": "text", "text": RUBRIC, "cache_control": {"type": "ephemeral"}}]
    assert sent.messages[1] == requests[3].messages[1] and requests[3].messages[0]["content"] == RUBRIC
    # One request every ~10 minutes (a share of 1 of 20,000 in flight, 10 min each): 1 hour, at 2x to write.
    slow = plan_caches(groups_of(requests), total_prompts=20_000, concurrency=1, latency_s=600, prices=prices)
    assert (slow.groups[0].action, slow.groups[0].ttl) == ("breakpoint", "1h")
    assert plan.prepare(requests[0])[0].messages[0]["content"][0]["cache_control"] == {"type": "ephemeral"}
    assert slow.prepare(requests[0])[0].messages[0]["content"][0]["cache_control"] == {"type": "ephemeral",
                                                                                         "ttl": "1h"}
    # Write 1.25x + 199 reads at 0.1x, against 200 at 1x.
    assert group.planned_cost is not None and group.uncached_cost is not None
    assert group.planned_cost == pytest.approx(group.uncached_cost * (1.25 + 199 * 0.1) / 200, rel=1e-6)


def test_anthropic_plans_nothing_below_the_models_minimum_or_where_the_premium_does_not_pay(
    prices: PriceTable,
) -> None:
    short = [ask("claude-haiku-4-5", f"item {n}") for n in range(20)]  # ~3,300 tokens, below Haiku 4.5's 4,096
    plan = plan_caches(groups_of(short), total_prompts=20, concurrency=5, prices=prices)
    assert plan.groups[0].action == "none" and "minimum of 4,096" in plan.groups[0].reason
    assert plan.prepare(short[0]) == (short[0], None)
    apart = [ask("claude-sonnet-4-5", f"item {n}") for n in range(2)]  # an hour apart: no TTL outlives it
    plan = plan_caches(groups_of(apart), total_prompts=100_000, concurrency=1, latency_s=3600, prices=prices)
    assert plan.groups[0].action == "none"


def test_gemini_is_implicit_with_a_warm_up(prices: PriceTable) -> None:
    # A group this short: an explicit cache's create and storage would cost more than implicit caching's misses
    # (tests/test_gemini_caches.py has the group that gets one).
    requests = [ask("gemini-2.5-flash", f"item {n}") for n in range(3)]
    plan = plan_caches(groups_of(requests), total_prompts=3, concurrency=10, prices=prices)
    assert (plan.groups[0].action, plan.groups[0].warm_up) == ("implicit", True)
    assert plan.prepare(requests[1]) == (requests[1], plan.groups[0].group.key)


# --- the warm-up order ---------------------------------------------------------------------------


async def test_a_keys_rest_waits_for_its_warm_up_while_other_keys_go() -> None:
    items = ["a1", "a2", "a3", "b1", "x", "b2"]
    queue = WarmUpQueue(items, key=lambda item: None if item == "x" else item[0])
    handed = [await queue.next() for _ in range(3)]
    assert handed == ["a1", "b1", "x"]  # a2, a3 and b2 are held behind their warm-ups
    waiting = asyncio.ensure_future(queue.next())
    await asyncio.sleep(0)
    assert not waiting.done()
    queue.done("a1", answered=False)  # a failed warm-up: the next of its key warms instead
    assert await waiting == "a2"
    queue.done("a2", answered=True)
    queue.done("b1", answered=True)
    assert [await queue.next() for _ in range(3)] == ["a3", "b2", None]
    assert queue.warm_ups == 3


async def test_queues_sharing_a_runs_warmth_warm_each_key_once() -> None:
    warmth = Warmth()
    first = WarmUpQueue(["k1", "k2"], key=lambda item: item[0], warmth=warmth)
    second = WarmUpQueue(["k3", "k4"], key=lambda item: item[0], warmth=warmth)
    assert await first.next() == "k1"
    waiting = asyncio.ensure_future(second.next())  # k3 and k4 wait on the first queue's warm-up
    await asyncio.sleep(0)
    assert not waiting.done()
    first.done("k1", answered=True)
    assert await waiting == "k3" and await second.next() == "k4" and await second.next() is None
    assert (first.warm_ups, second.warm_ups) == (1, 0)


# --- a planned send against the simulator --------------------------------------------------------


class Sink:
    def __init__(self) -> None:
        self.results: list[ChatResult] = []

    async def success(self, *, prompt_ids: Sequence[int], result: ChatResult, **_: Any) -> None:
        self.results.append(result)

    async def failure(self, *, prompt_ids: Sequence[int], error: BaseException, **_: Any) -> None:
        raise AssertionError(error)

    async def release(self, *, prompt_ids: Sequence[int]) -> int:
        return 0


@pytest.mark.parametrize("planned", [True, False])
async def test_a_planned_anthropic_send_writes_once_and_reads_the_rest(start_sim: StartSim, planned: bool,
                                                                       prices: PriceTable) -> None:
    url = anthropic_base_url(await start_sim(latency=0.05))
    requests = [ask("claude-sonnet-4-5", f"item {n}") for n in range(30)]
    plan = plan_caches(groups_of(requests), total_prompts=30, concurrency=10, prices=prices) if planned else None
    sink = Sink()
    async with LLMClient(provider="anthropic", base_url=url, api_key="k") as client:
        await send_all(client=client, items=[WorkItem(prompt_ids=(n,), request=r) for n, r in enumerate(requests)],
                       sink=sink, concurrency=10, cache_plan=plan)
    written = sum(result.cache_creation_tokens for result in sink.results)
    read = sum(result.cached_tokens for result in sink.results)
    if planned:  # the warm-up wrote it once; every other request read it, however many were in flight
        assert sum(1 for result in sink.results if result.cache_creation_tokens) == 1
        assert read == written * 29
    else:  # no breakpoint in the file: Anthropic caches nothing
        assert (written, read) == (0, 0)


def test_a_groups_money_is_priced_a_request_at_a_time(prices: PriceTable) -> None:
    """A long-prompt tier applies per request, never to a group's tokens summed."""
    requests = [ask("gpt-6.2-sol", f"item {n}") for n in range(1000)]
    (group,) = plan_caches(groups_of(requests), total_prompts=1000, concurrency=10, prices=prices).groups
    one = prices.price(model="gpt-6.2-sol", route="realtime", prompt_tokens=group.group.prefix_tokens,
                       completion_tokens=0)
    assert one is not None and group.uncached_cost == 1000 * one.cost


def test_the_batch_lane_marks_anthropics_prefix_for_an_hour_and_warms_nothing(prices: PriceTable) -> None:
    claude = [ask("claude-sonnet-4-5", f"item {n}") for n in range(1000)]
    gpt = [ask("gpt-5.4-mini", f"item {n}") for n in range(100)]
    plan = plan_caches(groups_of(claude + gpt), total_prompts=1100, concurrency=1, prices=prices, lane="batch")
    assert [(group.action, group.ttl, group.warm_up) for group in plan.groups] == [
        ("breakpoint", "1h", False), ("none", None, False)]
    marked, warm_key = plan.prepare(claude[5])
    assert warm_key is None
    assert marked.messages[0]["content"][0]["cache_control"] == {"type": "ephemeral", "ttl": "1h"}
    assert plan.prepare(gpt[5]) == (gpt[5], None)
    # At the batch price: the first 100 requests run together, each a 2x write, and 900 reads, against 1,000 plain.
    group = plan.groups[0]
    assert group.planned_cost is not None and group.uncached_cost is not None
    assert group.planned_cost == pytest.approx(group.uncached_cost * (100 * 2 + 900 * 0.1) / 1000, rel=1e-6)
    # 100 requests would all be writes: the premium does not pay.
    small = plan_caches(groups_of(claude[:100]), total_prompts=100, concurrency=1, prices=prices, lane="batch")
    assert small.groups[0].action == "none" and "write premium" in small.groups[0].reason


async def test_each_groups_hit_rate_and_saving_are_counted_from_its_answers(start_sim: StartSim,
                                                                          prices: PriceTable) -> None:
    url = anthropic_base_url(await start_sim(latency=0.05))
    requests = [ask("claude-sonnet-4-5", f"item {n}") for n in range(20)]
    requests += [ask("claude-sonnet-4-5", f"item {n}", system="A short instruction.") for n in range(5)]
    plan = plan_caches(groups_of(requests), total_prompts=25, concurrency=5, prices=prices)
    async with LLMClient(provider="anthropic", base_url=url, api_key="k") as client:
        await send_all(client=client, items=[WorkItem(prompt_ids=(n,), request=r) for n, r in enumerate(requests)],
                       sink=Sink(), concurrency=5, cache_plan=plan)
    long, short = plan.groups
    tally = plan.tallies[long.group.key]
    assert tally.answers == 20 and tally.written_tokens > 0
    # 19 of 20 answers read the prefix: the simulator's count of it is within the estimate's reach.
    assert tally.hit_rate(long.group.prefix_tokens) == pytest.approx(19 / 20)
    assert 0 < tally.cost < tally.uncached_cost
    # A group the plan leaves alone is counted too: what it paid, nothing saved.
    unplanned = plan.tallies[short.group.key]
    assert short.action == "none" and (unplanned.answers, unplanned.cached_tokens) == (5, 0)
    assert unplanned.cost == unplanned.uncached_cost


async def test_a_group_whose_answers_stay_cold_after_a_spread_stops_spreading(prices: PriceTable) -> None:
    """A host that ignores prompt_cache_key (or a prefix shorter than estimated) answers cold however many keys:
    one spread shows it, and the group goes on over the keys it has instead of doubling them again and again."""
    requests = [ask("gpt-5.4-mini", f"item {n}") for n in range(5_000)]
    plan = plan_caches(groups_of(requests), total_prompts=5_000, concurrency=200, latency_s=1.0, prices=prices)
    group = plan.groups[0].group.key
    for request in requests:
        _, ticket = await plan.deal(request, plan.group_key(request))
        plan.answered(group, answer(0), model="gpt-5.4-mini", ticket=ticket)
    keys = plan.keys_used(group)
    assert keys is not None and 1 < keys < 1_000
    assert plan._dealers[group].spreads == 1 and plan._dealers[group].gave_up
