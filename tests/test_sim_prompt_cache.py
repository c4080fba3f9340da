"""The simulator's prompt caches against each provider's documented rules (``core.cache_rules``): minimum lengths,
increments, warm only once answered, TTLs, prompt_cache_key and OpenAI's overflow, Anthropic's breakpoints and
write durations, Gemini's implicit hits; and each reported where the provider reports it."""

from __future__ import annotations

from typing import Any

import httpx

from llm_dispatch.core import ChatRequest, LLMClient, cache_rules
from llm_dispatch.simulator import SimulatorConfig, anthropic_base_url
from llm_dispatch.simulator._completions import cache_use, plan_completion
from llm_dispatch.simulator._messages import plan_message, render_message
from llm_dispatch.simulator._prompt_cache import PromptCache
from llm_dispatch.simulator._state import SimState

from conftest import StartSim

RULES = "Grade the answer by the rubric below, point by point. " * 400  # ~4,400 tokens


def state(**fields: Any) -> SimState:
    return SimState(config=SimulatorConfig(**fields))


def chat_body(item: str, *, model: str = "gpt-5.4-mini", **params: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "system", "content": RULES}, {"role": "user", "content": item}],
            **params}


def use(sim: SimState, body: dict[str, Any], *, provider: str = "openai") -> tuple[int, int]:
    return cache_use(plan_completion(body, digest=b"\0" * 8), state=sim, provider=provider)


# --- the cache's clock ---------------------------------------------------------------------------


def test_an_entry_is_warm_from_its_answer_until_its_ttl_after_the_last_hit() -> None:
    cache = PromptCache()
    cache.write(b"p", answered_at=10.0, ttl_s=300.0)
    assert not cache.warm(b"p", now=9.9)  # its writer is still being served
    assert cache.warm(b"p", now=10.0)
    assert cache.warm(b"p", now=309.0)  # a hit refreshes the time to live...
    assert cache.warm(b"p", now=608.0)
    assert not cache.warm(b"p", now=908.5)  # ...and unused it expires


def test_a_route_overflows_past_its_rate_and_recovers_a_minute_later() -> None:
    cache = PromptCache()
    served = [not cache.overflows(b"r", now=float(second), per_minute=15) for second in range(20)]
    assert served == [True] * 15 + [False] * 5
    assert not cache.overflows(b"r", now=60.5, per_minute=15)  # the first request left the window
    assert not cache.overflows(b"other", now=1.0, per_minute=15)  # each route on its own
    assert not any(cache.overflows(b"r", now=1.0, per_minute=None) for _ in range(100))


# --- OpenAI --------------------------------------------------------------------------------------


def test_openai_reads_in_128_token_steps_only_once_the_writer_is_answered() -> None:
    sim = state()
    sim.answer_due = 1e12  # the writer is answered far in the future
    read, written = use(sim, chat_body("one"))
    assert read == 0 and written >= 1024 and written % 128 == 0
    sim.answer_due = None
    assert use(sim, chat_body("two"))[0] == 0  # concurrent with the writer: nothing to read yet
    read, _ = use(sim, chat_body("three"))  # "two" wrote it too, answered at once: the earlier answer counts
    assert read >= 1024 and read % 128 == 0


def test_openai_caches_nothing_below_1024_tokens() -> None:
    sim = state()
    short = {"model": "gpt-5.4-mini", "messages": [{"role": "system", "content": "Be brief. " * 50},
                                                    {"role": "user", "content": "x"}]}
    use(sim, short)
    assert use(sim, short) == (0, 0)


def test_a_prompt_cache_key_routes_to_its_own_cache() -> None:
    sim = state()
    use(sim, chat_body("one", prompt_cache_key="a"))
    assert use(sim, chat_body("two", prompt_cache_key="a"))[0] > 0
    assert use(sim, chat_body("three", prompt_cache_key="b"))[0] == 0
    assert use(sim, chat_body("four"))[0] == 0


def test_past_the_overflow_rate_requests_go_to_cold_machines() -> None:
    sim = state(cache_overflow_rpm=3)
    reads = [use(sim, chat_body(f"item {n}", prompt_cache_key="k"))[0] for n in range(6)]
    assert reads[0] == 0 and all(read > 0 for read in reads[1:3])
    assert reads[3:] == [0, 0, 0]
    assert sim.stats.cache_overflows == 3
    assert use(sim, chat_body("other key", prompt_cache_key="k2"))[0] == 0  # cold, but its own route: not overflowed
    assert use(sim, chat_body("other key 2", prompt_cache_key="k2"))[0] > 0


async def test_openai_reports_cached_tokens_where_the_api_does(start_sim: StartSim) -> None:
    url = await start_sim()
    async with httpx.AsyncClient(timeout=10) as http:
        answers = [(await http.post(f"{url}/chat/completions", json=chat_body(item, prompt_cache_key="g1")))
                   .json() for item in ("one", "two")]
    details = [answer["usage"]["prompt_tokens_details"]["cached_tokens"] for answer in answers]
    assert details[0] == 0 and details[1] >= 1024


# --- Anthropic -----------------------------------------------------------------------------------


def message_body(item: str, *, model: str = "claude-sonnet-4-5", marks: int = 1, ttl: str | None = None,
                 rules: str = RULES) -> dict[str, Any]:
    mark: dict[str, Any] = {"type": "ephemeral", **({"ttl": ttl} if ttl else {})}
    system = [{"type": "text", "text": rules, "cache_control": mark}] if marks else rules
    messages: list[dict[str, Any]] = [{"role": "user", "content": [
        {"type": "text", "text": f"example {n} " * 300, "cache_control": {"type": "ephemeral"}}
        for n in range(max(0, marks - 1))] + [{"type": "text", "text": item}]}]
    return {"model": model, "max_tokens": 64, "system": system, "messages": messages}


def usage(sim: SimState, body: dict[str, Any]) -> dict[str, int]:
    _, reported = render_message(plan_message(body, digest=b"\1" * 8), state=sim)
    return {"read": reported.cache_read_input_tokens, "written": reported.cache_creation_input_tokens,
            "input": reported.input_tokens}


def test_anthropic_caches_only_at_a_breakpoint() -> None:
    sim = state()
    for item in ("one", "two"):
        assert usage(sim, message_body(item, marks=0))["read"] == 0
    first, second = usage(sim, message_body("one")), usage(sim, message_body("two"))
    assert first["written"] > 4000 and first["read"] == 0
    assert second == {"read": first["written"], "written": 0, "input": second["input"]}


def test_anthropic_never_caches_below_the_models_minimum() -> None:
    short = "A short rubric. " * 300  # ~1,500 tokens: above Sonnet 4.5's 1,024, below Haiku 4.5's 4,096
    assert cache_rules("anthropic", "claude-haiku-4-5").minimum_tokens == 4096
    sim = state()
    assert usage(sim, message_body("one", model="claude-haiku-4-5", rules=short))["written"] == 0
    assert usage(sim, message_body("one", model="claude-sonnet-4-5", rules=short))["written"] > 1024


def test_anthropic_reads_the_longest_warm_breakpoint_and_writes_the_rest() -> None:
    sim = state()
    usage(sim, message_body("one"))  # writes the system prompt only
    two = usage(sim, message_body("two", marks=2))
    assert two["read"] > 4000 and two["written"] > 0  # the system read, the example written
    three = usage(sim, message_body("three", marks=2))
    assert three["read"] == two["read"] + two["written"] and three["written"] == 0


def test_a_one_hour_breakpoint_writes_one_hour_tokens() -> None:
    sim = state()
    body, reported = render_message(plan_message(message_body("one", ttl="1h"), digest=b"\1" * 8), state=sim)
    assert b'"ephemeral_1h_input_tokens":' + str(reported.cache_creation_input_tokens).encode() in body
    assert reported.cache_creation_input_tokens > 4000


async def test_more_than_four_breakpoints_is_anthropics_400(start_sim: StartSim) -> None:
    url = anthropic_base_url(await start_sim())
    headers = {"anthropic-version": "2023-06-01", "x-api-key": "k"}
    async with httpx.AsyncClient(timeout=10, headers=headers) as http:
        refused = await http.post(f"{url}/v1/messages", json=message_body("one", marks=5))
        allowed = await http.post(f"{url}/v1/messages", json=message_body("one", marks=4))
    assert refused.status_code == 400
    assert "A maximum of 4 blocks with cache_control may be provided. Found 5." in refused.text
    assert allowed.status_code == 200 and allowed.json()["usage"]["cache_creation_input_tokens"] > 4000


# --- Gemini --------------------------------------------------------------------------------------


def test_gemini_caches_implicitly_from_its_minimum() -> None:
    assert cache_rules("gemini", "gemini-2.5-flash").minimum_tokens == 2048
    assert cache_rules("gemini", "gemini-3.8-flash").minimum_tokens == 4096
    sim = state()
    use(sim, chat_body("one", model="gemini-2.5-flash"), provider="gemini")
    read, _ = use(sim, chat_body("two", model="gemini-2.5-flash"), provider="gemini")
    assert read > 4000
    # No key in Gemini's routing: a prompt_cache_key changes nothing.
    assert use(sim, chat_body("three", model="gemini-2.5-flash", prompt_cache_key="x"), provider="gemini")[0] == read


async def test_gemini_reports_cached_content_tokens(start_sim: StartSim) -> None:
    url = await start_sim()
    host = anthropic_base_url(url)
    async with LLMClient(provider="gemini", base_url=host, api_key="k") as llm:
        first = await llm.chat(ChatRequest(model="gemini-2.5-flash", messages=chat_body("one")["messages"]))
        second = await llm.chat(ChatRequest(model="gemini-2.5-flash", messages=chat_body("two")["messages"]))
    assert first.cached_tokens == 0 and second.cached_tokens > 4000
