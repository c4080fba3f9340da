"""The dispatch, collect-batches and cancel flows, and the CLI around them, in real Prefect flow runs
against the simulator over real sockets; subprocesses where a user would have another process."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from conftest import Sim, cli, rows, successes_per_prompt, write_prompts
from llm_dispatch.core import to_json
from llm_dispatch.flows.batch import collect_batches
from llm_dispatch.flows.dispatch import dispatch

pytestmark = [pytest.mark.prefect]

ROOT = Path(__file__).parent.parent




def provider_batches(sim: Sim) -> list[dict]:
    return httpx.get(f"{sim.base_url}/batches", params={"limit": 100}, timeout=60).raise_for_status().json()["data"]


MIXED = [
    {"id": "now-1", "prompt": "short and urgent", "urgency": "urgent"},
    {"id": "now-2", "prompt": "what is 2 + 2?"},  # short: real-time by the length rule
    {"id": "bulk-1", "prompt": "short but nobody waits", "urgency": "bulk"},
    {"id": "bulk-2", "prompt": "a long document. " * 80},  # long: batch by the length rule
    # Too soon for any discounted lane (flex's 15 minutes + the 1 h margin): real-time.
    {"id": "soon", "prompt": "a long document due soon. " * 80, "deadline": "1h"},
    {"id": "later", "prompt": "short, due in three days", "deadline": "3d"},
]


async def test_dispatch_routes_each_prompt_sends_both_halves_and_reports_cost(
    prefect_api: str, sim: Sim, db_url: str, tmp_path: Path
) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.sorting import ArtifactSort

    sim.configure(batch_processing_seconds=1.0)
    summary = to_json(await dispatch(prompts=MIXED, base_url=sim.base_url, database_url=SecretStr(db_url), wait=True,
                                     batch_poll_interval=0.2))

    routes = dict(rows(db_url, "SELECT custom_id, planned_route FROM prompts"))
    assert routes == {"now-1": "realtime", "now-2": "realtime", "bulk-1": "batch", "bulk-2": "batch",
                      "soon": "realtime", "later": "batch"}
    reasons = dict(rows(db_url, "SELECT custom_id, route_reason FROM prompts"))
    assert reasons["now-1"] == "urgency=urgent" and reasons["bulk-2"].startswith("length ")
    assert "is before flex (15m), the batch window (24h) + margin (1h)" in reasons["soon"]
    assert "leaves room" in reasons["later"]
    answered = dict(rows(db_url, "SELECT p.custom_id, r.route FROM results r JOIN prompts p ON p.id = r.prompt_id"))
    assert answered == routes  # each was answered the way it was routed
    assert summary["counts"] == {"succeeded": 6} and summary["unfinished"] == 0
    assert summary["routes"] == {"realtime": {"succeeded": 3}, "batch": {"succeeded": 3}}
    cost = summary["cost"]
    assert cost["complete"] and cost["total"] > 0 and cost["savings"] > 0
    # Savings: the batch half priced real-time, minus what it cost (half).
    assert cost["savings"] == pytest.approx(cost["routes"]["batch"]["cost"], abs=2e-6)
    assert summary["estimate"]["routes"]["batch"]["requests"] == 3

    async with get_client() as client:
        # Newest first: the session's Prefect server holds every earlier test's artifacts too.
        artifacts = await client.read_artifacts(limit=200, sort=ArtifactSort.CREATED_DESC)
    by_key: dict[str, Any] = {}
    for artifact in artifacts:  # newest first: the first of a key is this run's, not an earlier test's
        if artifact.key:
            by_key.setdefault(artifact.key, artifact)
    key = "dispatch-prompts"  # a list of prompts: the job is called "prompts"
    table, report = by_key[f"{key}-routes"], by_key[f"{key}-report"]
    # The batches' one progress artifact ended at 100%.
    bars = [a for a in artifacts if a.type == "progress" and (a.description or "").startswith("1 of 1 batch ingested")]
    assert bars and all(a.data == 100.0 for a in bars)
    # So did the real-time half.
    realtime_bars = [a for a in artifacts if a.type == "progress" and (a.description or "").startswith(
        "real-time: 3 of 3 prompts done (3 succeeded, 0 failed)")]
    assert realtime_bars and realtime_bars[0].data == 100.0
    table_rows = json.loads(table.data) if isinstance(table.data, str) else table.data
    assert [(r["route"], r["prompts"], r["succeeded"]) for r in table_rows] == [("realtime", 3, 3), ("batch", 3, 3)]
    assert summary["job_id"] in report.data and "saved by the Batch API" in report.data


async def test_max_cost_refuses_before_any_request(prefect_api: str, sim: Sim, db_url: str) -> None:
    from llm_dispatch.core import BudgetExceededError

    with pytest.raises(BudgetExceededError, match="above --max-cost"):
        await dispatch(prompts=MIXED, base_url=sim.base_url, database_url=SecretStr(db_url), max_cost=0.000001)
    assert sim.stats()["requests_total"] == 0 and provider_batches(sim) == []
    assert rows(db_url, "SELECT COUNT(*) FROM results") == [(0,)]


def submit_without_waiting(count: int, *, env: dict[str, str], cwd: Path) -> dict[str, Any]:
    """``llm-dispatch run FILE --route all-batch --no-wait`` on ``count`` prompts; its JSON summary."""
    path = write_prompts(cwd / "p.jsonl", [{"id": i, "prompt": f"question {i}"} for i in range(count)])
    submitted = cli("run", str(path), "--route", "all-batch", "--no-wait", "--json", env=env, cwd=cwd)
    assert submitted.returncode == 0, submitted.stderr[-2000:]
    return json.loads(submitted.stdout)


def test_no_wait_run_then_a_later_collect_sweep_finishes_it(cli_env: dict[str, str], sim: Sim, db_url: str,
                                                          tmp_path: Path) -> None:
    sim.configure(batch_processing_seconds=2.0)
    summary = submit_without_waiting(30, env=cli_env, cwd=tmp_path)
    assert summary["counts"] == {"batched": 30}
    assert summary["batch"]["submitted_batches"] == 1

    asyncio.run(wait_for_provider(sim, timeout=60.0))  # the provider finishes; the submitting process is long gone
    swept = cli("collect", "--json", env=cli_env, cwd=tmp_path)
    assert swept.returncode == 0, swept.stderr[-2000:]
    sweep = json.loads(swept.stdout)
    assert sweep["open"] == 1 and [i["succeeded"] for i in sweep["ingested"]] == [30]
    assert set(successes_per_prompt(db_url).values()) == {1}
    assert rows(db_url, "SELECT status FROM jobs") == [("finished",)]
    assert len(provider_batches(sim)) == 1


@pytest.mark.slow
def test_killed_between_upload_and_create_then_rerun_makes_one_batch(cli_env: dict[str, str], sim: Sim, db_url: str,
                                                                     tmp_path: Path) -> None:
    path = write_prompts(tmp_path / "p.jsonl", [{"id": i, "prompt": f"question {i}"} for i in range(50)])
    httpx.post(f"{sim.root}/_sim/batch_faults", json={"faults": ["hang_create:60"]}, timeout=60).raise_for_status()
    proc = subprocess.Popen([sys.executable, "-m", "llm_dispatch.cli.main", "run", str(path), "--route", "all-batch", "--json"],
                            env=cli_env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:] if proc.stderr else ""
            assert time.monotonic() < deadline, "the run never uploaded its batch file"
            try:
                if rows(db_url, "SELECT status FROM batches") == [("uploaded",)]:
                    break
            except sqlite3.OperationalError:
                pass  # tables not created yet
            time.sleep(0.05)
        time.sleep(0.3)  # well inside the hanging create
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert provider_batches(sim) == []  # the create never happened
    assert rows(db_url, "SELECT status FROM prompts GROUP BY status") == [("batched",)]

    rerun = cli("run", str(path), "--route", "all-batch", "--json", env=cli_env, cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert json.loads(rerun.stdout)["counts"] == {"succeeded": 50}
    assert len(provider_batches(sim)) == 1  # exactly one batch for the one chunk
    assert rows(db_url, "SELECT COUNT(*), MIN(status) FROM batches") == [(1, "ingested")]
    assert set(successes_per_prompt(db_url).values()) == {1}  # none paid twice


def test_cancel_keeps_what_was_answered_and_fails_the_rest(cli_env: dict[str, str], sim: Sim, db_url: str,
                                                           tmp_path: Path) -> None:
    # Long enough that a loaded machine's cancel arrives while the batch runs; answers come at 300 per 600 s.
    sim.configure(batch_processing_seconds=600.0)
    job_id = submit_without_waiting(300, env=cli_env, cwd=tmp_path)["job_id"]
    # Let the provider answer part of it first.
    while provider_batches(sim)[0]["request_counts"]["completed"] < 1:
        time.sleep(0.1)

    cancelled = cli("cancel", job_id, env=cli_env, cwd=tmp_path)
    assert cancelled.returncode == 0, cancelled.stderr[-2000:]
    assert "cancelled 1 batch of job" in cancelled.stdout
    counts = dict(rows(db_url, "SELECT status, COUNT(*) FROM prompts GROUP BY status"))
    assert counts.get("succeeded", 0) >= 1 and counts.get("succeeded", 0) + counts.get("failed", 0) == 300
    assert rows(db_url, "SELECT DISTINCT error_class FROM results WHERE status = 'failed'") in ([("BatchCancelledError",)], [])
    assert rows(db_url, "SELECT status, cancel_requested FROM batches") == [("ingested", 1)]


def test_status_cost_and_export_report_a_finished_job(cli_env: dict[str, str], sim: Sim, db_url: str,
                                                      tmp_path: Path) -> None:
    records = [{"id": f"r{i}", "prompt": f"question {i}", "metadata": {"n": i}} for i in range(5)]
    records.append({"id": "bad", "prompt": "refused [[sim:400]]"})
    path = write_prompts(tmp_path / "p.jsonl", records)
    ran = cli("run", str(path), "--json", env=cli_env, cwd=tmp_path)
    assert ran.returncode == 1, ran.stderr[-2000:]  # one prompt failed
    job_id = json.loads(ran.stdout)["job_id"]

    status = json.loads(cli("status", job_id, "--json", env=cli_env, cwd=tmp_path).stdout)
    assert status["routes"] == {"realtime": {"succeeded": 5, "failed": 1}}
    listing = json.loads(cli("status", "--json", env=cli_env, cwd=tmp_path).stdout)
    assert [j["job_id"] for j in listing["jobs"]] == [job_id]

    cost = json.loads(cli("cost", "--json", env=cli_env, cwd=tmp_path).stdout)
    assert cost["job_id"] == job_id and cost["routes"]["realtime"]["requests"] == 5 and cost["total"] > 0

    exported = cli("export", job_id, "--format", "jsonl", env=cli_env, cwd=tmp_path)
    lines = [json.loads(line) for line in exported.stdout.splitlines()]
    assert [line["id"] for line in lines] == [r["id"] for r in records]  # input order
    assert [line["prompt"] for line in lines] == [r["prompt"] for r in records]
    assert lines[0]["n"] == 0 and lines[0]["answer"] and lines[0]["cost_usd"] > 0
    # A failed call is not billed: it costs 0, stored so.
    assert (lines[-1]["status"], lines[-1]["cost_usd"]) == ("failed", 0) and "400" in lines[-1]["error"]

    out = tmp_path / "out.csv"
    assert cli("export", job_id, "--format", "csv", "--fields", "id,error_class,position,metadata", "-o", str(out),
               env=cli_env, cwd=tmp_path).returncode == 0
    table = list(csv.DictReader(io.StringIO(out.read_text(encoding="utf-8"))))
    assert [row["id"] for row in table] == [r["id"] for r in records]
    assert [row["position"] for row in table] == [str(n) for n in range(6)]
    assert json.loads(table[1]["metadata"]) == {"n": 1} and table[-1]["error_class"] == "BadRequestError"

    unknown = cli("status", "no-such-job", env=cli_env, cwd=tmp_path)
    assert unknown.returncode == 2 and "no job 'no-such-job'" in unknown.stderr


async def test_programmatic_use_with_a_list_of_dicts_and_the_query_api(prefect_api: str, sim: Sim, db_url: str) -> None:
    from llm_dispatch import storage

    summary = to_json(await dispatch(prompts=[{"id": "a", "prompt": "hello"}], base_url=sim.base_url,
                                     database_url=SecretStr(db_url)))
    engine = storage.create_engine(db_url)
    try:
        sessions = storage.session_factory(engine)
        [row] = [r async for r in storage.export_rows(sessions, job_id=summary["job_id"])]
    finally:
        await engine.dispose()
    assert (row.custom_id, row.status, row.route) == ("a", "succeeded", "realtime") and row.text


async def test_dispatch_on_postgres_both_halves_and_reports(prefect_api: str, sim: Sim, pg_url: str) -> None:
    sim.configure(batch_processing_seconds=1.0)
    summary = to_json(await dispatch(prompts=MIXED, base_url=sim.base_url, database_url=SecretStr(pg_url), wait=True,
                                     batch_poll_interval=0.2))
    assert summary["counts"] == {"succeeded": 6}
    assert summary["routes"] == {"realtime": {"succeeded": 3}, "batch": {"succeeded": 3}}
    assert summary["cost"]["routes"]["batch"]["requests"] == 3


# --- escalation: what a batch did not answer goes again, then real-time -----------------------


def queue_batch_faults(sim: Sim, *faults: str) -> None:
    httpx.post(f"{sim.root}/_sim/batch_faults", json={"faults": list(faults)}, timeout=60).raise_for_status()


def answers_by_route(db_url: str) -> dict[str, int]:
    return dict(rows(db_url, "SELECT route, COUNT(*) FROM results WHERE status = 'succeeded' GROUP BY route"))


async def dispatch_to_batches(sim: Sim, db_url: str, *, prompts: int, wait: bool) -> dict:
    return to_json(await dispatch(prompts=[{"id": f"q{i}", "prompt": f"question {i}"} for i in range(prompts)],
                                  route_policy="all-batch", base_url=sim.base_url, database_url=SecretStr(db_url), wait=wait,
                                  batch_poll_interval=0.1))


@pytest.fixture
def two_batches_expire(sim: Sim, monkeypatch: pytest.MonkeyPatch) -> Sim:
    """A limit of two batches a prompt, and the next two batches both expire with half their lines answered."""
    monkeypatch.setenv("LLM_DISPATCH_BATCH_MAX_SUBMISSIONS", "2")
    sim.configure(batch_processing_seconds=0.3)
    queue_batch_faults(sim, "expire:0.5", "expire:0.5")
    return sim


def assert_the_one_unanswered_twice_went_real_time(sim: Sim, db_url: str) -> None:
    """Four prompts: two answered by the first batch, one by the second, the last real-time, each once."""
    assert [b["status"] for b in provider_batches(sim)] == ["expired", "expired"]
    assert answers_by_route(db_url) == {"batch": 3, "realtime": 1} and sim.stats()["completions"] == 1
    [(late, reason)] = rows(db_url, "SELECT custom_id, route_reason FROM prompts WHERE planned_route = 'realtime'")
    assert reason == "unanswered in 2 batches; sent real-time"
    # Its history: expired in both batches, then answered real-time.
    assert rows(db_url, """SELECT r.route, r.status FROM results r JOIN prompts p ON p.id = r.prompt_id
                           WHERE p.custom_id = ? ORDER BY r.id""", late) == [
        ("batch", "failed"), ("batch", "failed"), ("realtime", "succeeded")]
    assert set(successes_per_prompt(db_url).values()) == {1}


async def test_dispatch_resends_an_expired_remainder_in_a_new_batch_while_it_may(
    prefect_api: str, sim: Sim, db_url: str
) -> None:
    sim.configure(batch_processing_seconds=0.3)
    queue_batch_faults(sim, "expire:0.5")
    summary = await dispatch_to_batches(sim, db_url, prompts=6, wait=True)

    assert summary["counts"] == {"succeeded": 6}
    assert summary["batch"]["submitted_batches"] == 2 and summary["batch"]["realtime_fallback"] == 0
    # Both may be created within one second (created_at's unit): told apart by status, not by time.
    totals = {batch["status"]: batch["request_counts"]["total"] for batch in provider_batches(sim)}
    assert totals == {"expired": 6, "completed": 3}  # the second holds only what expired
    assert answers_by_route(db_url) == {"batch": 6} and sim.stats()["completions"] == 0
    assert set(successes_per_prompt(db_url).values()) == {1}


async def test_dispatch_sends_real_time_what_expired_in_every_batch_allowed(
    prefect_api: str, two_batches_expire: Sim, db_url: str
) -> None:
    summary = await dispatch_to_batches(two_batches_expire, db_url, prompts=4, wait=True)

    assert summary["counts"] == {"succeeded": 4}
    assert summary["batch"]["submitted_batches"] == 2 and summary["batch"]["realtime_fallback"] == 1
    assert_the_one_unanswered_twice_went_real_time(two_batches_expire, db_url)


async def test_collect_sweeps_resend_an_expired_remainder_then_go_real_time(
    prefect_api: str, two_batches_expire: Sim, db_url: str
) -> None:
    sim = two_batches_expire
    submitted = await dispatch_to_batches(sim, db_url, prompts=4, wait=False)
    assert submitted["counts"] == {"batched": 4}

    async def sweep() -> dict:
        await wait_for_provider(sim)
        return to_json(await collect_batches(database_url=SecretStr(db_url), base_url=sim.base_url))

    first = await sweep()
    assert (first["resubmitted"], first["realtime"]) == (2, 0)
    second = await sweep()
    assert (second["resubmitted"], second["realtime"]) == (0, 1)
    assert_the_one_unanswered_twice_went_real_time(sim, db_url)
    assert rows(db_url, "SELECT status FROM jobs") == [("finished",)]


async def wait_for_provider(sim: Sim, *, timeout: float = 10.0) -> None:
    """Until every provider batch has ended."""
    deadline = time.monotonic() + timeout
    while any(b["status"] not in ("completed", "expired", "failed", "cancelled") for b in provider_batches(sim)):
        assert time.monotonic() < deadline, "the simulator's batches never ended"
        await asyncio.sleep(0.05)
