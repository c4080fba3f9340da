"""Gemini prompts through `llm-dispatch run --simulate` in a process of its own, as a user runs them: every prompt
answered once, the bulk one through Gemini's Batch Mode at half price, each with its cost; and what Gemini refuses, refused with the file before anything is written."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import cli, rows, successes_per_prompt, write_prompts

pytestmark = [pytest.mark.prefect]

EXAMPLE = Path(__file__).parent.parent / "examples" / "gemini.jsonl"


def clean_env(**extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("LLM_DISPATCH_", "OPENAI_", "ANTHROPIC_", "GEMINI_", "GOOGLE_"))}
    return {**env, **extra}


def test_the_gemini_example_runs_offline_its_bulk_prompt_through_batch_mode(prefect_api: str, tmp_path: Path) -> None:
    done = cli("run", str(EXAMPLE), "--simulate", "--wait", "--sim-latency", "0.02", "--json",
               env=clean_env(PREFECT_API_URL=prefect_api), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout)
    prompts = [json.loads(line) for line in EXAMPLE.read_text().splitlines() if line.strip()]
    assert summary["counts"] == {"succeeded": len(prompts)} and summary["unfinished"] == 0
    db = f"sqlite+aiosqlite:///{tmp_path / 'llm_dispatch.db'}"
    assert set(successes_per_prompt(db).values()) == {1}
    # The bulk prompt went in one Gemini batch (Batch Mode, its requests inline), answered at half its list price.
    assert rows(db, "SELECT provider, status, input_file_id FROM batches") == [("gemini", "ingested", None)]
    answered = dict(rows(db, "SELECT p.custom_id, r.route FROM prompts p JOIN results r ON r.prompt_id = p.id"))
    assert sorted(answered.values()).count("batch") == 1 and set(answered.values()) == {"realtime", "batch"}
    assert rows(db, "SELECT r.cost_pico_usd * 2 = r.list_cost_pico_usd FROM results r WHERE r.route = 'batch'") == [(1,)]
    assert "Batch API yet" not in done.stderr
    assert set(summary["cost"]["providers"]) == {"gemini"} and summary["cost"]["total"] > 0
    [(tool_calls,)] = rows(db, """SELECT r.tool_calls FROM results r JOIN prompts p ON r.prompt_id = p.id
                                 WHERE p.custom_id = 'gem-05'""")
    assert json.loads(tool_calls)[0]["function"]["name"] == "get_weather"


def test_what_gemini_refuses_is_refused_with_its_line(tmp_path: Path) -> None:
    bad = write_prompts(tmp_path / "bad.jsonl", [
        {"id": "a", "model": "gemini-2.5-flash", "prompt": "hi", "params": {"logprobs": True}},
        {"id": "b", "model": "gemini-2.5-pro", "prompt": "hi", "params": {"reasoning_effort": "none"}},
        {"id": "c", "model": "gemini-2.5-flash", "prompt": "hi", "params": {"temperature": 2.5}},
        {"id": "d", "model": "gemini-2.5-flash", "prompt": "hi", "params": {"stop": ["1", "2", "3", "4", "5", "6"]}},
    ])
    done = cli("run", str(bad), "--simulate", env=clean_env(), cwd=tmp_path)
    assert done.returncode == 2
    errors = [line for line in done.stderr.splitlines() if "bad.jsonl" in line]
    assert len(errors) == 4, done.stderr
    assert "bad.jsonl:1:" in errors[0] and "params.logprobs" in errors[0] and "no Gemini equivalent" in errors[0]
    assert "bad.jsonl:2:" in errors[1] and "cannot turn thinking off" in errors[1]
    assert "bad.jsonl:3:" in errors[2] and "params.temperature" in errors[2]
    assert "bad.jsonl:4:" in errors[3] and "at most 5 stop sequences" in errors[3]
    assert not (tmp_path / "llm_dispatch.db").exists()


def test_gemini_prompts_without_a_key_exit_2_naming_it(tmp_path: Path) -> None:
    done = cli("run", str(EXAMPLE), env=clean_env(OPENAI_API_KEY="sk-test"), cwd=tmp_path)
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "GEMINI_API_KEY" in lines[0] and "--simulate" in lines[0]


def test_the_models_command_lists_gemini_with_its_tiers_and_shutdowns(tmp_path: Path) -> None:
    done = cli("models", "--provider", "gemini", "--json", env=clean_env(), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    listed = {model["name"]: model for model in json.loads(done.stdout)["models"]}
    assert {"gemini-3.8-flash", "gemini-4-hydrogen", "gemini-2.5-pro", "gemini-2.5-flash-lite"} <= set(listed)
    assert {model["provider"] for model in listed.values()} == {"gemini"}
    pro = listed["gemini-2.5-pro"]
    assert (pro["shutdown"], pro["replacement"], pro["long_prompt"]["above"]) == ("2026-12-01", "gemini-3.8-flash",
                                                                                200000)
    # Every Gemini figure names where it was read: Google's own page, and the secondary source of any price.
    for model in listed.values():
        assert model["source"].startswith(("https://ai.google.dev/", "https://docs.cloud.google.com/")), model["name"]
        assert "input" in model["secondary"]["fields"] and model["secondary"]["source"], model["name"]
