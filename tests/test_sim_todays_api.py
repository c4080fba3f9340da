"""The simulator misbehaves as real providers do, over real sockets and raw HTTP: 200s that carry no answer, a body
cut off after its headers, a slow long generation, accounts that cannot be used, and a count of each marker's
requests (issue 24, item 9)."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from conftest import StartSim

CHAT = "/chat/completions"


def chat(text: str, **fields: Any) -> dict[str, Any]:
    return {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": text}], **fields}


def message(text: str, **fields: Any) -> dict[str, Any]:
    return {"model": "claude-haiku-4-5", "max_tokens": 200, "messages": [{"role": "user", "content": text}], **fields}


ANTHROPIC = {"anthropic-version": "2023-06-01", "x-api-key": "k"}


async def test_200s_without_an_answer_still_report_usage(start_sim: StartSim) -> None:
    url = await start_sim()
    root = url.removesuffix("/v1")
    async with httpx.AsyncClient(timeout=60) as raw:
        empty = await raw.post(url + CHAT, json=chat("[[sim:empty_choices]] hi"))
        error = await raw.post(url + CHAT, json=chat("[[sim:error200]] hi"))
        hollow = await raw.post(f"{root}/v1/messages", json=message("[[sim:empty_choices]] hi"), headers=ANTHROPIC)
        broken = await raw.post(f"{root}/v1/messages", json=message("[[sim:error200]] hi"), headers=ANTHROPIC)
    assert empty.status_code == error.status_code == hollow.status_code == broken.status_code == 200
    assert empty.json()["choices"] == [] and empty.json()["usage"]["prompt_tokens"] > 0
    assert error.json()["error"]["type"] == "server_error" and error.json()["usage"]["completion_tokens"] > 0
    assert "content" not in hollow.json() and hollow.json()["usage"]["input_tokens"] > 0
    assert broken.json()["type"] == "error" and broken.json()["usage"]["output_tokens"] > 0


async def test_a_cut_body_has_its_status_line_and_half_its_bytes(start_sim: StartSim) -> None:
    url = await start_sim()
    async with httpx.AsyncClient(timeout=60) as raw:
        async with raw.stream("POST", url + CHAT, json=chat("[[sim:cut]] hi")) as response:
            assert response.status_code == 200
            promised = int(response.headers["content-length"])
            with pytest.raises(httpx.RemoteProtocolError):
                await response.aread()
    assert promised > 0


async def test_a_slow_generation_spends_its_cap_at_the_configured_pace(start_sim: StartSim) -> None:
    url = await start_sim(slow_tokens_per_second=2000.0)
    async with httpx.AsyncClient(timeout=60) as raw:
        started = time.monotonic()
        answer = (await raw.post(url + CHAT, json=chat("[[sim:slow]] prove it", model="gpt-5.4",
                                                       max_completion_tokens=1000))).json()
        took = time.monotonic() - started
    usage = answer["usage"]
    assert usage["completion_tokens"] == 1000 and usage["completion_tokens_details"]["reasoning_tokens"] > 800
    assert took >= 0.49  # 1,000 tokens at 2,000 a second: never sooner (a wait is not cut short; load only adds)


async def test_accounts_that_cannot_be_used_answer_as_each_provider_does(start_sim: StartSim) -> None:
    url = await start_sim()
    root = url.removesuffix("/v1")
    async with httpx.AsyncClient(timeout=60) as raw:
        quota = await raw.post(url + CHAT, json=chat("[[sim:insufficient_quota]] hi"))
        spend = await raw.post(f"{root}/v1/messages", json=message("[[sim:insufficient_quota]] hi"), headers=ANTHROPIC)
        credit = await raw.post(f"{root}/v1/messages", json=message("[[sim:402]] hi"), headers=ANTHROPIC)
        await raw.post(f"{root}/_sim/config", json={"always_fault": "403"})
        forbidden = [(await raw.post(url + CHAT, json=chat(f"q {i}"))).status_code for i in range(3)]
    assert quota.status_code == 429 and "retry-after" not in quota.headers
    assert quota.json()["error"]["code"] == "insufficient_quota"
    assert spend.status_code == 429 and "retry-after" not in spend.headers
    assert spend.json()["error"]["details"]["error_code"] == "enforced_spend_limit_reached"
    assert (credit.status_code, credit.json()["error"]["type"]) == (402, "billing_error")
    assert forbidden == [403, 403, 403]


async def test_the_stats_count_the_requests_each_marker_made(start_sim: StartSim) -> None:
    url = await start_sim()
    root = url.removesuffix("/v1")
    async with httpx.AsyncClient(timeout=60) as raw:
        for _ in range(3):
            await raw.post(url + CHAT, json=chat("[[sim:500x1]] flaky"))
        await raw.post(url + CHAT, json=chat("[[sim:refuse]] no"))
        stats = (await raw.get(f"{root}/_sim/stats")).json()
    # Counted whether or not the marker still faulted (500x1 faults the first of them only).
    assert stats["markers"] == {"500": 3, "refuse": 1}
