"""Named budgets: set and shown by the command, held by shards of one job running in processes of their own (four on
PostgreSQL, two on SQLite), by two jobs in turn; the cap holds and every request sent is stored and counted."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llm_dispatch import storage
from llm_dispatch.cli.main import EXIT_BUDGET, app
from llm_dispatch.core import PICO_PER_USD, ChatRequest, PriceTable, Settings, to_json, worst_case_cost
from llm_dispatch.flows.realtime import realtime_dispatch
from llm_dispatch.jobs import record_job, to_pico
from conftest import Sim, write_prompts

pytestmark = [pytest.mark.prefect]

PARAMS = {"max_tokens": 40}

# One shard of a job, a flow run in a process of its own against the session's Prefect API: prints its state.
SHARD = textwrap.dedent("""
    import asyncio, inspect, json, sys
    from llm_dispatch.flows.realtime import realtime_dispatch

    job_id, shard, shards, base_url, database_url = sys.argv[1:6]
    state = asyncio.run(realtime_dispatch(job_id=job_id, shard=int(shard), shards=int(shards), budget_name="shared",
                                          base_url=base_url, database_url=database_url, concurrency=4, chunk_size=10,
                                          return_state=True))
    result = state.result()
    if inspect.isawaitable(result):
        result = asyncio.run(result)
    print(json.dumps({"state": state.name, "sent": result.sent_prompts}))
""")


def _records(n: int, prefix: str = "q") -> list[dict]:
    return [{"id": f"{prefix}-{i}", "model": "gpt-4o-mini", "prompt": f"{prefix} question {i}", "params": PARAMS}
            for i in range(n)]


def _worst() -> int:
    request = ChatRequest(model="gpt-4o-mini", messages=[{"role": "user", "content": "q question 100"}], params=PARAMS)
    found = worst_case_cost(request=request, route="realtime", table=PriceTable.load())
    assert found is not None and found[1] is not None
    return found[1].cost


async def _ledger(url: str, job_id: str) -> tuple[int, int, int, storage.BudgetUsage]:
    """(stored cost of the job, paid answers, prompts left pending, the budget's current period)."""
    from sqlalchemy import func, select

    async with storage.open_database(url) as sessions:
        async with sessions() as session:
            cost, paid = (await session.execute(
                select(func.coalesce(func.sum(storage.Result.cost_pico_usd), 0), func.count())
                .where(storage.Result.job_id == job_id, storage.Result.route == "realtime"))).one()
        counts = await storage.job_counts(sessions, job_id=job_id)
        [usage] = await storage.budget_usage(sessions, name="shared")
    return int(cost), int(paid), counts.get("pending", 0), usage


async def _shards_share_a_budget(*, url: str, shards: int, prompts: int, prefect_api: str, sim: Sim,
                                 tmp_path: Path) -> None:
    path = write_prompts(tmp_path / "questions.jsonl", _records(prompts))
    async with storage.open_database(url) as sessions:
        job = await record_job(source=str(path), job_id=None, settings=Settings(database_url=url), sessions=sessions)
        # Room for a third of the job at its worst case; about half of it at the cost its answers come to.
        limit = _worst() * prompts // 3
        await storage.set_budget(sessions, name="shared", limit_pico_usd=limit, per="day")
    # Answers slow enough that the shards, started a few seconds apart, spend the budget together.
    sim.configure(latency=0.5)
    script = tmp_path / "shard.py"
    script.write_text(SHARD)
    env = {**os.environ, "PREFECT_API_URL": prefect_api}
    procs = [subprocess.Popen([sys.executable, str(script), job.job_id, str(index), str(shards), sim.base_url, url],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for index in range(shards)]
    outputs = [await asyncio.to_thread(proc.communicate, timeout=400) for proc in procs]
    for proc, (_, stderr) in zip(procs, outputs):
        assert proc.returncode == 0, stderr[-3000:]
    found = [json.loads(stdout.strip().splitlines()[-1]) for stdout, _ in outputs]
    states = [shard["state"] for shard in found]
    cost, paid, pending, usage = await _ledger(url, job.job_id)
    print(f"\n{shards} shards on {url.split(':')[0]}: budget ${limit / PICO_PER_USD:.6f}, stored costs "
          f"${cost / PICO_PER_USD:.6f} over {paid} answers, {pending} of {prompts} prompts left pending, requests "
          f"sent {sim.stats()['requests_total']}; per shard (state, prompts sent): "
          f"{[(shard['state'], shard['sent']) for shard in found]}")
    # The cap held over every shard, every answer's cost is in it, and nothing is held any more.
    assert cost <= limit
    assert usage.spent_pico_usd == cost and usage.reserved_pico_usd == 0
    # Every request sent was held and stored: the simulator saw exactly the stored answers.
    assert sim.stats()["requests_total"] == paid
    assert pending > 0 and paid + pending == prompts
    assert "BudgetReached" in states


async def test_four_shards_on_postgresql_share_a_named_budget(
    prefect_api: str, sim: Sim, pg_url: str, tmp_path: Path
) -> None:
    await _shards_share_a_budget(url=pg_url, shards=4, prompts=240, prefect_api=prefect_api, sim=sim,
                                 tmp_path=tmp_path)


async def test_two_processes_on_sqlite_share_a_named_budget(
    prefect_api: str, sim: Sim, db_url: str, tmp_path: Path
) -> None:
    await _shards_share_a_budget(url=db_url, shards=2, prompts=120, prefect_api=prefect_api, sim=sim,
                                 tmp_path=tmp_path)


async def test_two_jobs_in_turn_share_what_is_left(prefect_api: str, sim: Sim, db_url: str, tmp_path: Path) -> None:
    async with storage.open_database(db_url) as sessions:
        await storage.set_budget(sessions, name="shared", limit_pico_usd=_worst() * 30, per="month")
    first = write_prompts(tmp_path / "a.jsonl", _records(20, "a"))
    second = write_prompts(tmp_path / "b.jsonl", _records(40, "b"))
    one = to_json(await realtime_dispatch(prompts=str(first), base_url=sim.base_url, database_url=db_url,
                                          concurrency=4, budget_name="shared"))
    assert one["counts"] == {"succeeded": 20} and not one["budget"]["stopped"]
    two = await realtime_dispatch(prompts=str(second), base_url=sim.base_url, database_url=db_url, concurrency=4,
                                  budget_name="shared", return_state=True)
    assert two.name == "BudgetReached"
    summary = to_json(await two.result())
    # The second job got what the first left: together under the limit.
    assert summary["budget"]["spent"] == round(one["budget"]["spent"] + _cost_of(db_url, summary["job_id"]), 6)
    assert summary["budget"]["spent"] <= summary["budget"]["limit"]


def _cost_of(db_url: str, job_id: str) -> float:
    from conftest import rows

    [(cost,)] = rows(db_url, "SELECT SUM(cost_pico_usd) FROM results WHERE job_id = ?", job_id)
    return cost / PICO_PER_USD


def test_budget_set_and_show(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    made = runner.invoke(app, ["budget", "set", "team", "--limit", "50", "--per", "day", "--database-url", db_url,
                               "--json"])
    assert made.exit_code == 0, made.output
    row = json.loads(made.output)
    assert (row["name"], row["per"], row["limit"], row["spent"], row["reserved"], row["left"]) == (
        "team", "day", 50.0, 0.0, 0.0, 50.0)
    assert len(row["period"]) == 10  # today, UTC
    raised = runner.invoke(app, ["budget", "set", "team", "--limit", "75.5", "--per", "month", "--database-url", db_url])
    assert raised.exit_code == 0 and "$75.500000" in raised.output
    shown = runner.invoke(app, ["budget", "show", "--database-url", db_url, "--json"])
    assert [(r["name"], r["per"], r["limit"]) for r in json.loads(shown.output)] == [("team", "month", 75.5)]

    for args, expected in [
        (["budget", "set", "team", "--limit", "5", "--per", "week"], "--per must be one of day, month, total"),
        (["budget", "set", "job:x", "--limit", "5"], "must not be empty or start with 'job:'"),
        (["budget", "show", "nope"], "no budget named 'nope'"),
    ]:
        result = runner.invoke(app, [*args, "--database-url", db_url])
        assert result.exit_code == 2 and expected in result.output, result.output


def test_a_run_naming_a_budget_that_is_not_there_sends_nothing(
    prefect_api: str, db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    path = write_prompts(tmp_path / "q.jsonl", _records(3))
    result = CliRunner().invoke(app, ["run", str(path), "--simulate", "--database-url", db_url, "--budget-name", "nope"])
    assert result.exit_code == 2, result.output
    assert "no budget named 'nope' in this database; create it with `llm-dispatch budget set nope" in result.output
    assert EXIT_BUDGET == 4 and to_pico(0.5) == PICO_PER_USD // 2
