"""A background create is counted before it is sent (issue 27): OpenAI's API has no idempotency key and no list of
responses to look one up by, so a run killed between a create's answer and storing its id cannot find that response
again; the next run creates it once more and counts the lost one as possibly billed, never silently."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import respx

from llm_dispatch.core import ChatRequest

from conftest import FakeTime, cli, make_client, rows, write_prompts


def body(status: str, **fields: Any) -> dict[str, Any]:
    return {"id": "resp_bg", "object": "response", "status": status, "model": "gpt-5.5", "output": [],
            "usage": None, "background": True, **fields}


DONE = body("completed", output=[{"type": "message", "role": "assistant", "content": [
    {"type": "output_text", "text": "done", "annotations": []}]}],
    usage={"input_tokens": 5, "output_tokens": 7, "total_tokens": 12})


async def test_a_create_is_counted_before_it_is_sent_and_earlier_lost_creates_count_as_possibly_billed(
    router: respx.Router, fake_time: FakeTime
) -> None:
    create = router.post("/responses", name="create").respond(200, json=body("queued"))
    router.get("/responses/resp_bg", name="poll").respond(200, json=DONE)
    order: list[str] = []

    async def creating() -> None:
        order.append(f"counted, {create.call_count} sent")

    async def started(response_id: str) -> None:
        order.append(f"stored {response_id}")

    request = ChatRequest(model="gpt-5.5", messages=[{"role": "user", "content": "hi"}], endpoint="responses",
                          lane="background-2h", lost_creates=1)
    async with make_client(router, fake_time, background_poll=1.0) as client:
        result = await client.chat(request, creating=creating, started=started)
    assert order == ["counted, 0 sent", "stored resp_bg"]
    sent = json.loads(create.calls.last.request.content)
    assert sent["background"] is True and sent["background_options"] == {"completion_window": "2h"}
    assert result.text == "done" and result.maybe_billed == 2  # this answer, and the create whose id was lost


@pytest.mark.prefect
def test_a_run_killed_before_storing_a_created_id_creates_it_once_more_and_reports_the_lost_one(
    cli_env: dict[str, str], sim: Any, db_url: str, tmp_path: Path
) -> None:
    path = write_prompts(tmp_path / "window.jsonl", [
        {"id": "w", "prompt": "this afternoon", "model": "gpt-5.5", "endpoint": "responses", "deadline": "3h"}])
    first = cli("run", str(path), "--json", env=cli_env, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    assert rows(db_url, "SELECT background_creates, background_id IS NOT NULL FROM prompts") == [(1, 1)]
    # What a kill between the create's answer and storing its id leaves: the create counted, no id, no answer.
    rows(db_url, "DELETE FROM results")
    rows(db_url, "UPDATE prompts SET status = 'in_flight', background_id = NULL")
    again = cli("run", str(path), "--json", env=cli_env, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert sim.stats()["by_status"]["background_created"] == 2  # the lost one cannot be found: created once more
    assert rows(db_url, "SELECT p.background_creates, r.maybe_billed, r.status FROM prompts p "
                        "JOIN results r ON r.prompt_id = p.id") == [(2, 2, "succeeded")]
    assert json.loads(again.stdout)["stats"]["billed_unanswered"] == 1
