"""--budget on real runs against the simulator: the cap holds, the run stops in a state named for it, and a resume
with a higher budget sends the rest, each prompt answered once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llm_dispatch.cli.main import EXIT_BUDGET, app
from llm_dispatch.core import PICO_PER_USD, ConfigError, to_json
from llm_dispatch.flows.dispatch import dispatch
from llm_dispatch.flows.realtime import realtime_dispatch
from conftest import Sim, rows, write_prompts

pytestmark = [pytest.mark.prefect]

BUDGET = 0.0004


def _prompts(tmp_path: Path, n: int = 40) -> Path:
    return write_prompts(tmp_path / "questions.jsonl", [
        {"id": f"q-{i}", "prompt": f"question {i}", "params": {"max_tokens": 50}} for i in range(n)])


def _paid(db_url: str) -> tuple[int, dict[str, int]]:
    """(the stored cost of the job's answers in picodollars, paid answers per prompt)."""
    [(cost,)] = rows(db_url, "SELECT COALESCE(SUM(cost_pico_usd), 0) FROM results")
    per_prompt = dict(rows(db_url, """SELECT p.custom_id, COUNT(r.id) FROM prompts p LEFT JOIN results r
        ON r.prompt_id = p.id AND r.route != 'reused' AND r.status = 'succeeded' GROUP BY p.id"""))
    return cost, per_prompt


async def test_a_run_stops_at_its_budget_and_a_higher_one_sends_the_rest(
    prefect_api: str, sim: Sim, db_url: str, tmp_path: Path
) -> None:
    path = _prompts(tmp_path)
    state = await realtime_dispatch(prompts=str(path), base_url=sim.base_url, database_url=db_url, concurrency=4,
                                    chunk_size=10, budget=BUDGET, return_state=True)
    assert state.name == "BudgetReached" and state.is_completed()
    summary = to_json(await state.result())
    budget = summary["budget"]
    assert budget["stopped"] and budget["label"] == "--budget"
    assert state.message.startswith("budget --budget reached: spent $")
    cost, paid = _paid(db_url)
    # The cap held, every answer's cost is counted in it, and the rest is left pending for later.
    assert 0 < cost <= BUDGET * PICO_PER_USD
    assert abs(cost / PICO_PER_USD - budget["spent"]) < 1e-6  # shown to 6 places: a half may round either way
    assert budget["reserved"] == 0
    assert summary["counts"]["pending"] == budget["over_budget"] > 0
    assert set(paid.values()) == {0, 1}
    assert sim.stats()["requests_total"] == sum(paid.values())  # nothing was sent that the budget did not hold

    # A run without a budget on the same job holds the job's own: nothing more is sent.
    again = await realtime_dispatch(job_id=summary["job_id"], base_url=sim.base_url, database_url=db_url,
                                    concurrency=4, return_state=True)
    assert again.name == "BudgetReached"
    assert _paid(db_url)[0] == cost

    state = await realtime_dispatch(job_id=summary["job_id"], base_url=sim.base_url, database_url=db_url,
                                    concurrency=4, budget=1.0, return_state=True)
    assert state.name == "Completed"
    summary = to_json(await state.result())
    cost_after, paid = _paid(db_url)
    # Every prompt answered once, none paid twice; the job's budget counted both runs.
    assert set(paid.values()) == {1}
    assert summary["counts"] == {"succeeded": 40}
    assert abs(cost_after / PICO_PER_USD - summary["budget"]["spent"]) < 1e-6


async def test_a_prompt_with_no_bound_on_its_cost_is_refused_before_anything_is_sent(
    prefect_api: str, sim: Sim, db_url: str, tmp_path: Path
) -> None:
    path = write_prompts(tmp_path / "p.jsonl", [{"id": "a", "prompt": "hi", "model": "my-own-model",
                                                 "params": {"max_tokens": 10}}])
    with pytest.raises(ConfigError, match="cannot hold budget --budget: no price for my-own-model"):
        await dispatch(prompts=str(path), base_url=sim.base_url, database_url=db_url, budget=1.0,
                       allow_unknown_model=True)
    assert sim.stats()["requests_total"] == 0


def test_the_command_says_where_the_budget_stands_and_exits_4(
    prefect_api: str, db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    path = _prompts(tmp_path, n=30)
    result = CliRunner().invoke(app, ["run", str(path), "--simulate", "--sim-latency", "0.01", "--database-url",
                                      db_url, "--budget", str(BUDGET), "--route", "all-realtime"])
    assert result.exit_code == EXIT_BUDGET, result.output
    [line] = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert "budget --budget reached: spent $" in line and "reserved $0.000000, left $" in line
    assert "prompts are left pending: run `llm-dispatch run --resume" in line and "--budget HIGHER" in line


def test_status_and_cost_show_where_each_budget_holding_the_job_stands(
    prefect_api: str, db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    path = _prompts(tmp_path, n=30)
    runner = CliRunner()
    sim = ["--simulate", "--sim-latency", "0.01", "--database-url", db_url, "--route", "all-realtime"]
    assert runner.invoke(app, ["budget", "set", "team", "--limit", str(BUDGET), "--per", "day",
                               "--database-url", db_url]).exit_code == 0
    stopped = runner.invoke(app, ["run", str(path), *sim, "--budget-name", "team"])
    assert stopped.exit_code == EXIT_BUDGET, stopped.output
    [(job_id,)] = rows(db_url, "SELECT id FROM jobs")

    def report(name: str) -> dict:
        shown = runner.invoke(app, [name, job_id[:8], "--database-url", db_url, "--json"])
        assert shown.exit_code == 0, shown.output
        return json.loads(shown.stdout)

    first_cost = _paid(db_url)[0] / PICO_PER_USD
    [team] = report("status")["budgets"]
    assert (team["name"], team["label"], team["per"], team["limit"]) == ("team", "'team'", "day", BUDGET)
    assert team["spent"] == round(first_cost, 6) and team["reserved"] == 0
    assert team["left"] == pytest.approx(BUDGET - first_cost, abs=1e-6)

    # Resumed with a budget of its own: both hold it, and both are shown.
    resumed = runner.invoke(app, ["run", "--resume", job_id, *sim, "--budget", "1"])
    assert resumed.exit_code == 0, resumed.output
    total = _paid(db_url)[0] / PICO_PER_USD
    for data in (report("status"), report("cost")):
        own, team = data["budgets"]
        assert (own["name"], own["label"], own["limit"]) == (f"job:{job_id}", "--budget", 1.0)
        assert own["spent"] == round(total, 6) and own["left"] == pytest.approx(1 - total, abs=1e-6)
        assert team["name"] == "team" and team["spent"] == round(first_cost, 6)
    for name in ("status", "cost"):
        said = " ".join(runner.invoke(app, [name, job_id[:8], "--database-url", db_url]).stdout.split())
        assert f"budget --budget: limit $1.000000, spent ${total:.6f}, reserved $0.000000" in said
        assert f"budget 'team' this day (" in said and f"limit ${BUDGET:.6f}, spent ${first_cost:.6f}" in said
