"""The cost ledger as a user sees it: a job run against the simulator over real sockets keeps the costs it
was answered at through a price change (``cost``, ``export``, ``status``, the run's summary), ``reprice``
shows the difference without writing, and a new job is priced with the new table."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

import pytest
from pydantic import SecretStr
from click.testing import Result
from typer.testing import CliRunner

from llm_dispatch.core import to_json
from llm_dispatch.cli.main import app
from conftest import Sim, rows
from llm_dispatch.flows.dispatch import dispatch

pytestmark = [pytest.mark.prefect]

SAME = "the same bulk question, twice in one file"
PROMPTS = [
    {"id": "now-1", "prompt": "urgent question one", "urgency": "urgent"},
    {"id": "now-2", "prompt": "urgent question two", "urgency": "urgent"},
    {"id": "bulk-1", "prompt": "bulk question", "urgency": "bulk"},
    {"id": "bulk-2", "prompt": SAME, "urgency": "bulk"},
    {"id": "bulk-3", "prompt": SAME, "urgency": "bulk"},  # one batch line answers both: paid once
    {"id": "house", "prompt": "a question for our own model", "urgency": "urgent", "model": "house-model"},
]
# Ten times the bundled gpt-6-luna (the default model), and a price for the model the bundled table does not know.
NEW_PRICES = {"prices_as_of": "2026-06-01", "models": {
    "gpt-6-luna": {"input": 1.0, "cached_input": 0.1, "cache_write": 1.25, "output": 5.0},
    "house-model": {"input": 1, "output": 2},
}}


async def run(prompts: list[dict], *, sim: Sim, db_url: str, prices_file: Path | None = None) -> dict:
    # house-model is the user's own: without their price file it is sent as given, its cost unknown.
    return to_json(await dispatch(prompts=prompts, base_url=sim.base_url, database_url=SecretStr(db_url), wait=True,
                                  batch_poll_interval=0.2, prices_file=str(prices_file) if prices_file else None,
                                  allow_unknown_model=True))


async def invoke(*args: str, env: dict[str, str] | None = None) -> Result:
    # In a thread: a command runs its own event loop, as it does from a shell.
    return await asyncio.to_thread(CliRunner().invoke, app, list(args), env=env)


async def report(*args: str, db_url: str, env: dict[str, str] | None = None) -> dict | list:
    shown = await invoke(*args, "--json", "--database-url", db_url, env=env)
    assert shown.exit_code == 0, shown.output
    return json.loads(shown.output)


def every_row(db_url: str) -> dict[str, list[tuple]]:
    with sqlite3.connect(db_url.split("///", 1)[1]) as con:
        tables = [name for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {table: con.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall() for table in tables}


async def test_past_costs_survive_a_price_change_and_reprice_shows_the_difference(
    prefect_api: str, sim: Sim, db_url: str, tmp_path: Path
) -> None:
    sim.configure(batch_processing_seconds=1.0)
    first = await run(PROMPTS, sim=sim, db_url=db_url)
    job_id = first["job_id"]
    assert first["counts"] == {"succeeded": 6}
    cost = await report("cost", job_id, db_url=db_url)
    exported = await report("export", job_id, db_url=db_url)
    status = await report("status", job_id, db_url=db_url)

    # Each answer carries its cost: real-time at list price, the batch line at half, the shared answer at 0,
    # the unpriced model unknown (never 0).
    stored = {cid: (route, discount, basis) for cid, route, discount, basis in rows(db_url, """
        SELECT p.custom_id, r.route, r.discount, r.cost_basis FROM results r JOIN prompts p ON p.id = r.prompt_id""")}
    assert stored["now-1"] == ("realtime", "0", "answer") and stored["bulk-1"] == ("batch", "0.5", "answer")
    paid_line, shared = sorted([stored["bulk-2"], stored["bulk-3"]], key=lambda s: s[0])
    assert (paid_line, shared) == (("batch", "0.5", "answer"), ("reused", None, "answer"))
    by_id = {row["id"]: row for row in exported}
    assert by_id["now-1"]["cost_usd"] > 0 and by_id["house"]["cost_usd"] is None
    assert sorted([by_id["bulk-2"]["cost_usd"], by_id["bulk-3"]["cost_usd"]])[0] == 0
    assert (cost["complete"], cost["unpriced_models"]) == (False, {"house-model": 1})
    # What the batch half saved is what it would have cost at the real-time price, minus what it cost: half.
    assert cost["savings"] == pytest.approx(cost["routes"]["batch"]["cost"], abs=1e-12)
    assert (first["cost"]["total"], first["cost"]["savings"]) == (cost["total"], cost["savings"])

    # The prices change: past costs do not.
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps(NEW_PRICES), encoding="utf-8")
    env = {"LLM_DISPATCH_PRICES_FILE": str(prices)}
    assert await report("cost", job_id, db_url=db_url, env=env) == cost
    assert await report("export", job_id, db_url=db_url, env=env) == exported
    assert await report("status", job_id, db_url=db_url, env=env) == status
    again = await run(PROMPTS, sim=sim, db_url=db_url, prices_file=prices)  # the same input: its job, resumed
    assert again["job_id"] == job_id and again["cost"]["total"] == first["cost"]["total"]

    # reprice: the same usage under the new table, beside the stored cost; nothing written.
    before = every_row(db_url)
    what_if = await report("reprice", job_id, "--prices-file", str(prices), db_url=db_url)
    assert every_row(db_url) == before
    by_route = {(r["route"], r["model"]): r for r in what_if["rows"]}
    realtime = by_route["realtime", "gpt-6-luna"]
    # Ten times the price (each figure is shown to a millionth of a dollar).
    assert realtime["repriced"] == pytest.approx(10 * realtime["stored"], abs=1e-5) and realtime["difference"] > 0
    assert by_route["batch", "gpt-6-luna"]["requests"] == 2  # the shared answer was not paid again
    house = by_route["realtime", "house-model"]
    assert (house["stored_unpriced"], house["repriced"] is not None, house["difference"]) == (1, True, None)
    assert what_if["stored"]["total"] == cost["total"] and what_if["repriced"]["total"] > cost["total"]
    shown = await invoke("reprice", job_id, "--prices-file", str(prices), "--database-url", db_url)
    assert shown.exit_code == 0 and "a what-if: the stored costs are unchanged" in shown.output

    # A new job under the new table is priced with it: repricing it with the same table changes nothing.
    fresh = await run([{**p, "id": f"new-{p['id']}", "prompt": f"new: {p['prompt']}"} for p in PROMPTS],
                      sim=sim, db_url=db_url, prices_file=prices)
    assert fresh["cost"]["complete"] and fresh["cost"]["prices_as_of"] == "2026-06-01"
    same = await report("reprice", fresh["job_id"], "--prices-file", str(prices), db_url=db_url)
    assert same["difference"] == 0 and same["repriced"]["total"] == same["stored"]["total"] > 0
    assert rows(db_url, "SELECT DISTINCT prices_file FROM results WHERE job_id = ?", fresh["job_id"]) == [(str(prices),)]


def test_cost_points_a_prices_file_to_reprice(tmp_path: Path) -> None:
    shown = CliRunner().invoke(app, ["cost", "job-1", "--prices-file", "p.json", "--database-url",
                                     f"sqlite+aiosqlite:///{tmp_path / 'x.db'}"])
    assert shown.exit_code == 2 and "llm-dispatch reprice job-1 --prices-file p.json" in shown.output
