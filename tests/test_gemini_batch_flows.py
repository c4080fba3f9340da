"""Gemini's Batch Mode in real flow runs over real sockets: a run killed while its create hangs, then run again (one
batch, no prompt paid twice), and the collect sweep resending what an expired Gemini batch left (it once raised
KeyError on pending batch-routed Gemini prompts)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from pydantic import SecretStr

from conftest import Sim, cli, rows, successes_per_prompt, write_prompts
from llm_dispatch.core import to_json
from llm_dispatch.flows.batch import collect_batches

pytestmark = [pytest.mark.prefect]

MODEL = "gemini-2.5-flash"


@pytest.fixture
def gemini_env(cli_env: dict[str, str], sim: Sim) -> dict[str, str]:
    return {**cli_env, "LLM_DISPATCH_GEMINI_BASE_URL": sim.root}


def gemini_batches(sim: Sim) -> list[dict]:
    return httpx.get(f"{sim.root}/v1beta/batches", params={"pageSize": 100}, timeout=5).raise_for_status().json().get(
        "operations", [])


def prompts(tmp_path: Path, count: int) -> Path:
    return write_prompts(tmp_path / "g.jsonl", [{"id": f"g{i}", "model": MODEL, "prompt": f"question {i}"}
                                                for i in range(count)])


def test_killed_while_its_create_hangs_then_rerun_makes_one_batch(gemini_env: dict[str, str], sim: Sim, db_url: str,
                                                                  tmp_path: Path) -> None:
    path = prompts(tmp_path, 40)
    httpx.post(f"{sim.root}/_sim/batch_faults", json={"faults": ["create_lost_hang:60"]}, timeout=5).raise_for_status()
    proc = subprocess.Popen([sys.executable, "-m", "llm_dispatch.cli.main", "run", str(path), "--route", "all-batch",
                             "--json"], env=gemini_env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 90
        # Recorded ``uploaded`` before the create is sent; killed once the provider has made the batch (its answer
        # held back by the fault): the create reached Google and its answer was lost with the process.
        while True:
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:] if proc.stderr else ""
            assert time.monotonic() < deadline, "the run never sent its create"
            try:
                recorded = rows(db_url, "SELECT status FROM batches")
            except sqlite3.OperationalError:
                recorded = []  # tables not created yet
            if recorded == [("uploaded",)] and gemini_batches(sim):
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rows(db_url, "SELECT status, provider_batch_id FROM batches") == [("uploaded", None)]

    rerun = cli("run", str(path), "--route", "all-batch", "--json", env=gemini_env, cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert json.loads(rerun.stdout)["counts"] == {"succeeded": 40}
    assert len(gemini_batches(sim)) == 1  # the lost create's batch, found by its display name
    assert rows(db_url, "SELECT COUNT(*), MIN(status) FROM batches") == [(1, "ingested")]
    assert set(successes_per_prompt(db_url).values()) == {1}  # none paid twice
    assert sim.stats()["gemini_batch_lines"] == 40


def test_collect_resends_what_an_expired_gemini_batch_left(gemini_env: dict[str, str], sim: Sim, db_url: str,
                                                           tmp_path: Path) -> None:
    path = prompts(tmp_path, 10)
    httpx.post(f"{sim.root}/_sim/batch_faults", json={"faults": ["expire:0.5"]}, timeout=5).raise_for_status()
    submitted = cli("run", str(path), "--route", "all-batch", "--no-wait", "--json", env=gemini_env, cwd=tmp_path)
    assert submitted.returncode == 0, submitted.stderr[-2000:]
    assert json.loads(submitted.stdout)["counts"] == {"batched": 10}
    deadline = time.monotonic() + 60
    while gemini_batches(sim)[0]["metadata"]["state"] != "BATCH_STATE_EXPIRED":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    # The sweep ingests the expired batch: its ten prompts are pending, batch-routed Gemini prompts, resubmitted.
    swept = cli("collect", "--json", env=gemini_env, cwd=tmp_path)
    assert swept.returncode == 0, swept.stderr[-2000:]
    sweep = json.loads(swept.stdout)
    assert sweep["resubmitted"] == 10 and not sweep["problems"]
    deadline = time.monotonic() + 60
    while any(batch["metadata"]["state"] != "BATCH_STATE_SUCCEEDED" for batch in gemini_batches(sim)[:1]):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    # The flow itself, told the Gemini endpoint as a parameter (this process's environment names none).
    assert "LLM_DISPATCH_GEMINI_BASE_URL" not in os.environ
    sweep = to_json(asyncio.run(collect_batches(database_url=SecretStr(db_url), gemini_base_url=sim.root)))
    assert [i["succeeded"] for i in sweep["ingested"]] == [10] and not sweep["problems"]
    assert set(successes_per_prompt(db_url).values()) == {1}
    assert rows(db_url, "SELECT status FROM jobs") == [("finished",)]
