"""Structured answers with re-asks and a budget on Gemini rows, real-time lane (issue 37, must-show): real flow runs
over real sockets against the simulator's generateContent, the schema sent as ``responseJsonSchema``, invalid
answers (fault markers, or every answer) asked again with the conversation, each answer a paid row of its own, and
``--budget`` / ``--max-cost`` holding Gemini prompts and their re-asks as they hold OpenAI's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from llm_dispatch.core import PICO_PER_USD, BudgetExceededError, to_json

from conftest import Sim, rows, write_prompts

pytestmark = [pytest.mark.prefect]

MODEL = "gemini-2.5-flash-lite"
PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
MARKERS = {"ok": "", "not-json": "[[sim:not_json]]", "missing": "[[sim:missing_field]]",
           "wrong-type": "[[sim:wrong_type]]", "truncated": "[[sim:truncated_json]]"}


def people(tmp_path: Path, names: dict[str, str], **params: Any) -> Path:
    return write_prompts(tmp_path / "people.jsonl", [
        {"id": name, "model": MODEL, "prompt": f"Invent a person called {name}. {marker}",
         "params": {"response_format": FORMAT, **params}} for name, marker in names.items()])


def gemini_urls(sim: Sim) -> dict[str, Any]:
    return {"base_url": sim.base_url, "gemini_base_url": sim.root}


async def test_invalid_gemini_answers_are_asked_again_until_valid_each_its_own_paid_row(
    prefect_api: str, sim: Sim, db_url: str, tmp_path: Path
) -> None:
    from llm_dispatch.flows.dispatch import dispatch

    state = await dispatch(prompts=str(people(tmp_path, MARKERS)), database_url=SecretStr(db_url), max_reasks=2,
                           route_policy="all-realtime", return_state=True, **gemini_urls(sim))
    assert state.is_completed(), state.message
    first = dict(rows(db_url, """SELECT p.custom_id, r.violation FROM results r JOIN prompts p ON p.id = r.prompt_id
                                 WHERE r.reask = 0"""))
    assert first["ok"] is None and all(first[name] for name in MARKERS if name != "ok"), first
    assert dict(rows(db_url, "SELECT custom_id, status FROM prompts")) == {name: "succeeded" for name in MARKERS}
    reasks = rows(db_url, """SELECT p.custom_id, r.route, r.status, r.cost_pico_usd, r.parsed FROM results r
                             JOIN prompts p ON p.id = r.prompt_id WHERE r.reask = 1 ORDER BY p.custom_id""")
    assert [(c, route, status) for c, route, status, _, _ in reasks] == [
        (name, "realtime", "succeeded") for name in sorted(MARKERS) if name != "ok"]
    assert all(cost > 0 and set(json.loads(parsed)) == {"name", "age"} for *_, cost, parsed in reasks)
    # Each answer generateContent gave is its own paid row: five first answers, four re-asks.
    assert sim.stats()["generate_contents"] == 5 + 4 and sim.stats()["completions"] == 0
    [(paid,)] = rows(db_url, "SELECT count(*) FROM results WHERE cost_pico_usd > 0")
    assert paid == 9
    summary = to_json(await state.result())
    structured = summary["structured"]
    assert (structured["valid_first"], structured["valid_after_reasks"], structured["still_invalid"],
            structured["reasks"]) == (1, 4, 0, 4)
    reask_cost = sum(cost for (cost,) in rows(db_url, "SELECT cost_pico_usd FROM results WHERE reask > 0")) / 1e12
    assert structured["reask_cost"] == pytest.approx(reask_cost, abs=1e-6) and reask_cost > 0


async def test_a_budget_holds_gemini_prompts_and_their_reasks_and_a_higher_one_sends_the_rest(
    prefect_api: str, sim: Sim, db_url: str, tmp_path: Path
) -> None:
    from llm_dispatch.flows.realtime import realtime_dispatch

    sim.configure(invalid_json_rate=1.0)  # every answer breaks the schema: each prompt is asked max_reasks times more
    names = {f"p{i:02d}": "" for i in range(30)}
    budget = 0.0004
    state = await realtime_dispatch(prompts=str(people(tmp_path, names, max_tokens=200)),
                                    database_url=SecretStr(db_url), max_reasks=2, concurrency=4, chunk_size=10,
                                    budget=budget, return_state=True, **gemini_urls(sim))
    assert state.name == "BudgetReached", state.message
    summary = to_json(await state.result())
    [(cost, answered)] = rows(db_url, "SELECT COALESCE(SUM(cost_pico_usd), 0), count(*) FROM results")
    # The cap held with every Gemini answer counted in it, re-asks included; nothing was sent it did not hold.
    # (The summary shows dollars to 6 places: a cost of exactly half a micro-dollar may round either way.)
    assert 0 < cost <= budget * PICO_PER_USD and abs(cost / PICO_PER_USD - summary["budget"]["spent"]) < 1e-6
    assert summary["budget"]["reserved"] == 0 and summary["counts"]["pending"] > 0
    assert sim.stats()["generate_contents"] == answered
    [(reasked,)] = rows(db_url, "SELECT count(*) FROM results WHERE reask > 0")
    assert reasked > 0

    state = await realtime_dispatch(job_id=summary["job_id"], database_url=SecretStr(db_url), max_reasks=2,
                                    concurrency=4, budget=1.0, return_state=True, **gemini_urls(sim))
    summary = to_json(await state.result())
    # Every prompt answered (invalid after its re-asks), none sent again once it had its answers.
    assert summary["counts"] == {"invalid": 30}
    per_prompt = rows(db_url, "SELECT p.custom_id, count(r.id) FROM prompts p JOIN results r ON r.prompt_id = p.id "
                              "GROUP BY p.id")
    assert len(per_prompt) == 30 and all(count <= 3 for _, count in per_prompt)
    [(cost_after,)] = rows(db_url, "SELECT SUM(cost_pico_usd) FROM results")
    assert abs(cost_after / PICO_PER_USD - summary["budget"]["spent"]) < 1e-6
    assert sim.stats()["generate_contents"] == sum(count for _, count in per_prompt)


async def test_max_cost_refuses_a_gemini_run_before_anything_is_sent(
    prefect_api: str, sim: Sim, db_url: str, tmp_path: Path
) -> None:
    from llm_dispatch.flows.dispatch import dispatch
    from llm_dispatch.tasks import result_of

    state = await dispatch(prompts=str(people(tmp_path, MARKERS, max_tokens=200)), database_url=SecretStr(db_url),
                           max_cost=0.000001, return_state=True, **gemini_urls(sim))
    assert state.is_failed() and state.name == "MaxCostRefused" and "above --max-cost" in state.message
    with pytest.raises(BudgetExceededError, match="nothing was sent"):
        await result_of(state)
    assert sim.stats()["requests_total"] == 0
