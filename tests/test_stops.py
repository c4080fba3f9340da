"""Failures that cannot get better stop early (issue 24, item 6): a refused key, an account out of credit, an unknown
model. The client's reading of each (respx, on its production path), the run's stop (send_all with fakes), and real
flow runs against the simulator over real sockets: a few requests, the rest left pending, one line saying what to
fix, and the same command continues. A 200 that reported usage has its cost stored, usable or not."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
import respx

from llm_dispatch.core import to_json
from llm_dispatch.core import (
    AuthenticationError,
    ChatRequest,
    ChatResult,
    LLMClient,
    NotFoundError,
    RateLimitError,
    RunStop,
    WorkItem,
    send_all,
)
from llm_dispatch.core.http._stops import STOP_AFTER
from llm_dispatch.core._exceptions import APIStatusError, PermissionDeniedError

from conftest import FakeTime, Sim, make_client, rows, write_prompts

REQUEST = ChatRequest(model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], params={"max_tokens": 5})
QUOTA = {"error": {"message": "You exceeded your current quota, please check your plan and billing details.",
                   "type": "insufficient_quota", "param": None, "code": "insufficient_quota"}}


# --- the client reads each lasting failure -------------------------------------------------------


async def test_insufficient_quota_is_not_retried_and_says_to_add_credit(router: respx.Router, fake_time: FakeTime) -> None:
    route = router.post("/chat/completions", name="chat").respond(429, json=QUOTA)
    async with make_client(router, fake_time, max_retries=5) as client:
        with pytest.raises(RateLimitError) as caught:
            await client.chat(REQUEST)
    error = caught.value
    assert route.call_count == 1 and fake_time.sleeps == []
    assert (error.code, error.lasting) == ("insufficient_quota", "credit")
    assert "add credit" in str(error) and "LLM_DISPATCH_CONCURRENCY" not in str(error)
    assert error.retryable, "a later run sends it again, once the account has credit"
    assert client.limiter.limit == client.limiter.ceiling, "an account out of credit slows no one"


@pytest.mark.parametrize(("status", "body", "lasting", "says"), [
    (429, {"type": "error", "error": {"type": "rate_limit_error", "message": "You have reached your specified API "
                                      "usage limits.", "details": {"error_code": "enforced_spend_limit_reached"}}},
     "credit", "monthly spend limit"),
    (402, {"type": "error", "error": {"type": "billing_error", "message": "Your credit balance is too low."}},
     "credit", "credit balance"),
    (401, {"type": "error", "error": {"type": "authentication_error", "message": "invalid x-api-key"}},
     "key", "ANTHROPIC_API_KEY"),
])
async def test_anthropics_account_failures_are_read_as_lasting(status: int, body: dict, lasting: str, says: str) -> None:
    calls: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return httpx.Response(status, json=body)

    async with LLMClient(provider="anthropic", base_url="https://anthropic.test", api_key="k", max_retries=5,
                         transport=httpx.MockTransport(answer), sleep=_no_sleep) as client:
        with pytest.raises(APIStatusError) as caught:
            await client.chat(ChatRequest(model="claude-haiku-4-5", messages=[{"role": "user", "content": "hi"}]))
    assert len(calls) == 1 and caught.value.lasting == lasting and says in str(caught.value)


async def _no_sleep(seconds: float) -> None:
    return None


# --- the run's stop, with fakes ------------------------------------------------------------------


class _Refusing:
    """A client whose answer depends on the model: ``bad`` models answer ``error``, the others succeed."""

    def __init__(self, error: APIStatusError, *, bad: set[str]) -> None:
        self.error, self.bad, self.sent = error, bad, 0

    async def chat(self, request: ChatRequest) -> ChatResult:
        self.sent += 1
        await asyncio.sleep(0.001)
        if request.model in self.bad:
            raise self.error
        return ChatResult(text="ok", finish_reason="stop", prompt_tokens=1, completion_tokens=1, cached_tokens=0,
                          model=request.model, response_id="r", latency_s=0.0)


class _Sink:
    def __init__(self) -> None:
        self.answered: list[int] = []
        self.failed: list[int] = []
        self.released: list[int] = []

    async def success(self, *, prompt_ids: Sequence[int], result: ChatResult, route: str = "realtime",
                      model: str | None = None) -> None:
        self.answered += prompt_ids

    async def failure(self, *, prompt_ids: Sequence[int], error: BaseException, final: bool = True,
                      model: str | None = None) -> None:
        self.failed += prompt_ids

    async def release(self, *, prompt_ids: Sequence[int]) -> int:
        self.released += prompt_ids
        return len(prompt_ids)


def _lasting(cls: type[APIStatusError], status: int, lasting: str) -> APIStatusError:
    error = cls(f"HTTP {status}: no. Fix it.", status_code=status)
    error.lasting = lasting
    return error


def _work(models: list[str]) -> list[WorkItem]:
    return [WorkItem(prompt_ids=(i,), request=ChatRequest(model=model, messages=[{"role": "user", "content": f"{i}"}]))
            for i, model in enumerate(models)]


async def test_a_refused_key_is_tried_a_few_times_then_the_rest_is_left_pending() -> None:
    client = _Refusing(_lasting(AuthenticationError, 401, "key"), bad={"m"})
    sink, stop = _Sink(), RunStop(provider_of=lambda model: "openai")
    outcome = await send_all(client=client, items=_work(["m"] * 300), sink=sink, concurrency=64, stop=stop)
    # At most STOP_AFTER in flight before the first answer: a concurrency of 64 does not send 64 first.
    assert client.sent == STOP_AFTER and outcome.failed == STOP_AFTER
    assert outcome.left == 300 - STOP_AFTER and sorted(sink.released) == list(range(STOP_AFTER, 300))
    [found] = stop.stopped.values()
    assert (found.scope, found.answers, found.left) == ("openai", STOP_AFTER, 300 - STOP_AFTER)
    assert "Fix it." in found.describe()


async def test_an_unknown_model_stops_only_that_models_prompts() -> None:
    client = _Refusing(_lasting(NotFoundError, 404, "model"), bad={"typo"})
    sink, stop = _Sink(), RunStop(provider_of=lambda model: "openai")
    outcome = await send_all(client=client, items=_work(["good", "typo"] * 50), sink=sink, concurrency=16, stop=stop)
    assert outcome.succeeded == 50 and outcome.failed == STOP_AFTER and outcome.left == 50 - STOP_AFTER
    assert [found.scope for found in stop.stopped.values()] == ["openai typo"]


async def test_a_model_that_answers_goes_at_full_speed_and_a_passing_failure_stops_nothing() -> None:
    error = _lasting(PermissionDeniedError, 403, "access")
    client = _Refusing(error, bad=set())
    sink, stop = _Sink(), RunStop(provider_of=lambda model: "openai")
    outcome = await send_all(client=client, items=_work(["m"] * 40), sink=sink, concurrency=8, stop=stop)
    assert outcome.succeeded == 40 and not stop.stopped
    await stop.failed("m", error)  # one lasting answer after successes: not enough to stop
    assert not stop.blocked("m")


# --- real runs over real sockets -----------------------------------------------------------------


@pytest.mark.prefect
async def test_a_revoked_key_stops_the_run_and_the_same_command_continues(
    prefect_api: str, sim: Sim, db_url: str, tmp_path: Path
) -> None:
    from llm_dispatch.flows.realtime import realtime_dispatch

    path = write_prompts(tmp_path / "p.jsonl", [{"id": i, "prompt": f"question {i}"} for i in range(300)])
    sim.configure(always_fault="401")
    first = to_json(await realtime_dispatch(prompts=str(path), base_url=sim.base_url, database_url=db_url, concurrency=64,
                                            chunk_size=50, fail_above=1.0))
    assert sim.stats()["requests_total"] == STOP_AFTER
    assert first["counts"] == {"failed": STOP_AFTER, "pending": 300 - STOP_AFTER}
    [stopped] = first["stopped"]
    assert stopped["scope"] == "openai" and stopped["error_class"] == "AuthenticationError"
    assert "Check the API key" in stopped["message"] and first["left"] == 300 - STOP_AFTER
    # What the run says is what is stored with the failure: the provider's words and the hint.
    stored = {message for (message,) in rows(db_url, "SELECT error_message FROM results")}
    assert stopped["message"].split(" answers: ", 1)[1] in stored

    sim.configure(always_fault=None)  # the key is fixed: the same input sends what is left, and the 3 failed
    again = to_json(await realtime_dispatch(prompts=str(path), base_url=sim.base_url, database_url=db_url, concurrency=64))
    assert again["counts"] == {"succeeded": 300} and again["stopped"] == []
    assert sim.stats()["requests_total"] == STOP_AFTER + 300


@pytest.mark.prefect
def test_the_cli_says_in_one_line_what_to_fix_and_that_the_same_command_continues(
    prefect_api: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from llm_dispatch.cli.main import app

    monkeypatch.chdir(tmp_path)
    # An account out of credit: every request of the provider would answer the same.
    write_prompts(tmp_path / "p.jsonl", [{"id": i, "prompt": f"[[sim:insufficient_quota]] q {i}"} for i in range(40)]
                  + [{"id": "fine", "prompt": "hello"}])
    result = CliRunner().invoke(app, ["run", "p.jsonl", "--simulate", "--sim-latency", "0.01"],
                                env={"COLUMNS": "400"})
    assert result.exit_code == 3  # the provider's failure, as the CLI's other exit codes say
    [line] = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert "stopped sending to openai after 3 identical answers: HTTP 429" in line
    assert "You exceeded your current quota" in line and "add credit" in line
    assert "38 prompts are left pending" in line and "run the same command" in line
    # The table's failure lines say what was stored, not just the error class: its status and the provider's words.
    assert "RateLimitError (HTTP 429): You exceeded your current quota" in result.output


@pytest.mark.prefect
async def test_a_200_that_reported_usage_is_paid_for_and_sent_once(
    prefect_api: str, sim: Sim, db_url: str, tmp_path: Path
) -> None:
    from llm_dispatch.flows.realtime import realtime_dispatch

    path = write_prompts(tmp_path / "p.jsonl", [
        {"id": "empty", "prompt": "[[sim:empty_choices]] a"},
        {"id": "error", "prompt": "[[sim:error200]] b"},
        {"id": "garbled", "prompt": "[[sim:malformed]] c"},
    ])
    summary = to_json(await realtime_dispatch(prompts=str(path), base_url=sim.base_url, database_url=db_url, fail_above=1.0))
    await realtime_dispatch(prompts=str(path), base_url=sim.base_url, database_url=db_url, fail_above=1.0)  # nothing to resend
    assert summary["counts"] == {"failed": 3}
    assert sim.stats()["markers"] == {"empty_choices": 1, "error200": 1, "malformed": 1}
    stored = {cid: (status, http, tokens, cost) for cid, status, http, tokens, cost in rows(db_url, """
        SELECT p.custom_id, r.status, r.http_status, r.prompt_tokens, r.cost_pico_usd
        FROM results r JOIN prompts p ON p.id = r.prompt_id""")}
    for cid in ("empty", "error"):
        status, http, tokens, cost = stored[cid]
        assert (status, http) == ("failed", None) and tokens and cost and cost > 0, cid
    assert stored["garbled"][2:] == (None, 0), "a body that says nothing of its usage costs what is known: 0"
    # The report's cost counts what those 200s said they used.
    assert summary["stats"]["prompt_tokens"] == stored["empty"][2] + stored["error"][2]


@pytest.mark.prefect
async def test_each_attempt_that_may_have_been_billed_is_stored_and_a_lost_generation_sent_twice_at_most(
    prefect_api: str, sim: Sim, db_url: str, tmp_path: Path
) -> None:
    from llm_dispatch.flows.realtime import realtime_dispatch

    path = write_prompts(tmp_path / "p.jsonl", [
        {"id": "cut-once", "prompt": "[[sim:cutx1]] a"},  # cut off after its headers once, then answered
        {"id": "cut", "prompt": "[[sim:cut]] b"},  # cut off every time
        {"id": "garbled", "prompt": "[[sim:malformed]] c"},
        {"id": "fine", "prompt": "d"},
    ])
    summary = to_json(await realtime_dispatch(prompts=str(path), base_url=sim.base_url, database_url=db_url, fail_above=1.0))
    await realtime_dispatch(prompts=str(path), base_url=sim.base_url, database_url=db_url, fail_above=1.0)  # nothing sent again
    assert sim.stats()["markers"] == {"cut": 4, "malformed": 1}  # 2 for cut-once, 2 for cut: each sent twice at most
    stored = {cid: (status, attempts, billed, raw) for cid, status, attempts, billed, raw in rows(db_url, """
        SELECT p.custom_id, r.status, r.attempts, r.maybe_billed, r.raw_body
        FROM results r JOIN prompts p ON p.id = r.prompt_id""")}
    assert stored["cut-once"][:3] == ("succeeded", 2, 2)
    assert stored["cut"][:3] == ("failed", 2, 2)
    assert stored["garbled"][:3] == ("failed", 1, 1) and stored["garbled"][3].startswith('{"id":"chatcmpl-')
    assert stored["fine"][:3] == ("succeeded", 1, 1)
    # Attempts that may have been billed with no answer kept: cut-once's first, cut's two, the garbled 200.
    assert summary["stats"]["billed_unanswered"] == 4
