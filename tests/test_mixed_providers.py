"""One job, two providers: the mixed example file through `llm-dispatch run --simulate --wait` in its own process,
and the dispatch flow in a real Prefect flow run, both against the simulator over real sockets."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
from pydantic import SecretStr

from conftest import Sim, cli, rows, successes_per_prompt
from llm_dispatch.core import to_json
from llm_dispatch.flows.dispatch import dispatch

pytestmark = [pytest.mark.prefect]

ROOT = Path(__file__).parent.parent
EXAMPLE = ROOT / "examples" / "mixed.jsonl"


def example_prompts() -> list[dict]:
    return [json.loads(line) for line in EXAMPLE.read_text().splitlines() if line.strip()]


def clean_env(**extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("LLM_DISPATCH_", "OPENAI_", "ANTHROPIC_"))}
    return {**env, **extra}


def test_the_mixed_example_runs_offline_with_a_row_per_provider_and_route(prefect_api: str, tmp_path: Path) -> None:
    done = cli("run", str(EXAMPLE), "--simulate", "--wait", "--sim-latency", "0.02", "--json",
               env=clean_env(PREFECT_API_URL=prefect_api), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout)
    prompts = example_prompts()
    assert summary["counts"] == {"succeeded": len(prompts)} and summary["unfinished"] == 0
    db = f"sqlite+aiosqlite:///{tmp_path / 'llm_dispatch.db'}"
    assert set(successes_per_prompt(db).values()) == {1}  # every prompt answered exactly once
    # Each prompt went to its model's provider: Anthropic's answers are Messages, OpenAI's chat completions.
    answered = {custom_id: (model, route, response_id) for custom_id, model, route, response_id in rows(db, """
        SELECT p.custom_id, p.model, r.route, r.response_id FROM prompts p JOIN results r ON r.prompt_id = p.id""")}
    for custom_id, (model, _, response_id) in answered.items():
        assert response_id.startswith("msg_" if model.startswith("claude-") else "chatcmpl-"), custom_id
    # Both routes on both providers, each with its actual cost and its estimate.
    for cost in (summary["cost"], summary["estimate"]):
        assert set(cost["providers"]) == {"openai", "anthropic"}
        for provider, by_route in cost["providers"].items():
            assert set(by_route) == {"realtime", "batch"}, provider
            assert all(r["requests"] > 0 and r["cost"] > 0 for r in by_route.values()), provider
    actual = summary["cost"]["providers"]
    assert sum(r["requests"] for by_route in actual.values() for r in by_route.values()) == len(prompts)
    assert round(sum(r["cost"] for by_route in actual.values() for r in by_route.values()), 6) == pytest.approx(
        summary["cost"]["total"], abs=1e-5)
    [(batches,)] = rows(db, "SELECT COUNT(DISTINCT provider) FROM batches")
    assert batches == 2


def test_claude_prompts_without_an_anthropic_key_exit_2_before_anything_is_written(tmp_path: Path) -> None:
    done = cli("run", str(EXAMPLE), env=clean_env(OPENAI_API_KEY="sk-test"), cwd=tmp_path)
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "ANTHROPIC_API_KEY" in lines[0] and "--simulate" in lines[0]
    assert not (tmp_path / "llm_dispatch.db").exists()


def test_a_claude_prompt_with_a_parameter_anthropic_lacks_is_refused_with_its_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "a", "model": "gpt-4o-mini", "prompt": "hi", "params": {"seed": 1}}) + "\n"
                   + json.dumps({"id": "b", "model": "claude-haiku-4-5", "prompt": "hi", "params": {"seed": 1}}) + "\n")
    done = cli("run", str(bad), "--simulate", env=clean_env(), cwd=tmp_path)
    assert done.returncode == 2
    [line] = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert line.startswith(f"error: {bad}:2:") and "'seed' has no Anthropic equivalent" in line
    assert not (tmp_path / "llm_dispatch.db").exists()


async def test_dispatch_flow_sends_each_provider_through_its_own_api(
    prefect_api: str, sim: Sim, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim.configure(batch_processing_seconds=0.5)
    monkeypatch.setenv("LLM_DISPATCH_ANTHROPIC_BASE_URL", sim.root)
    prompts = example_prompts()
    summary = to_json(await dispatch(prompts=prompts, base_url=sim.base_url, database_url=SecretStr(db_url), wait=True,
                                     batch_poll_interval=0.1))
    assert summary["counts"] == {"succeeded": len(prompts)}
    stats = sim.stats()
    claude = [p for p in prompts if p["model"].startswith("claude-")]
    routes = dict(rows(db_url, "SELECT custom_id, planned_route FROM prompts"))
    assert stats["messages"] == sum(routes[p["id"]] == "realtime" for p in claude)
    assert stats["completions"] == sum(routes[p["id"]] == "realtime" for p in prompts if p not in claude)
    assert stats["message_batches"] >= 1 and stats["batches"] >= 1
    providers = dict(rows(db_url, "SELECT provider, COUNT(*) FROM batches GROUP BY provider"))
    assert set(providers) == {"openai", "anthropic"}


async def test_claude_batches_left_by_a_no_wait_run_are_finished_by_collect_sweeps(
    prefect_api: str, sim: Sim, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import httpx

    from llm_dispatch.flows.batch import collect_batches

    monkeypatch.setenv("LLM_DISPATCH_BATCH_MAX_SUBMISSIONS", "2")
    sim.configure(batch_processing_seconds=0.3)
    # Both Message Batches expire with half their requests answered: the rest goes in a second batch, then real-time.
    httpx.post(f"{sim.root}/_sim/batch_faults", json={"faults": ["expire:0.5", "expire:0.5"]},
               timeout=60).raise_for_status()
    prompts = [{"id": f"c{i}", "model": "claude-haiku-4-5", "prompt": f"question {i}", "params": {"max_tokens": 20}}
               for i in range(4)]
    submitted = to_json(await dispatch(prompts=prompts, route_policy="all-batch", base_url=sim.base_url,
                                       anthropic_base_url=sim.root, database_url=SecretStr(db_url), wait=False))
    assert submitted["counts"] == {"batched": 4}

    async def sweep() -> dict:
        for _ in range(100):  # until Anthropic has ended every batch
            listed = httpx.get(f"{sim.root}/v1/messages/batches", headers={"anthropic-version": "2023-06-01"},
                               timeout=60).json()["data"]
            if all(b["processing_status"] == "ended" for b in listed):
                break
            await asyncio.sleep(0.1)
        return to_json(await collect_batches(database_url=SecretStr(db_url), base_url=sim.base_url,
                                             anthropic_base_url=sim.root))

    first = await sweep()
    assert (first["resubmitted"], first["realtime"]) == (2, 0)
    second = await sweep()
    assert (second["resubmitted"], second["realtime"]) == (0, 1)
    assert set(successes_per_prompt(db_url).values()) == {1}
    answered = dict(rows(db_url, "SELECT route, COUNT(*) FROM results WHERE status = 'succeeded' GROUP BY route"))
    assert answered == {"batch": 3, "realtime": 1}
    assert sim.stats()["message_batches"] == 2 and sim.stats()["messages"] == 1
    assert rows(db_url, "SELECT DISTINCT provider FROM batches") == [("anthropic",)]


async def test_prompt_cache_writes_and_reads_are_stored_and_priced_at_their_own_prices(
    prefect_api: str, sim: Sim, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from decimal import Decimal

    from llm_dispatch.core import PriceTable

    monkeypatch.setenv("LLM_DISPATCH_ANTHROPIC_BASE_URL", sim.root)
    # Above Claude Haiku 4.5's minimum cacheable length (4,096 tokens): a shorter prefix is never cached.
    shared = {"role": "system", "content": [{"type": "text", "text": "A long shared context. " * 1000,
                                             "cache_control": {"type": "ephemeral"}}]}
    prompts = [{"id": f"c{i}", "model": "claude-haiku-4-5", "messages": [shared, {"role": "user", "content": f"q {i}"}],
                "params": {"max_tokens": 20}, "urgency": "urgent"} for i in range(2)]
    await dispatch(prompts=prompts[:1], base_url=sim.base_url, database_url=SecretStr(db_url))
    await dispatch(prompts=prompts[1:], base_url=sim.base_url, database_url=SecretStr(db_url))
    stored = rows(db_url, """SELECT p.custom_id, r.prompt_tokens, r.cached_tokens, r.cache_creation_tokens,
                                    r.completion_tokens, r.cost_pico_usd
                             FROM results r JOIN prompts p ON p.id = r.prompt_id ORDER BY p.custom_id""")
    (_, p0, read0, wrote0, out0, cost0), (_, p1, read1, wrote1, out1, cost1) = stored
    assert wrote0 > 0 and not read0  # the first writes the cache...
    assert read1 == wrote0 and not wrote1  # ...the second reads what the first wrote
    price = PriceTable.load().price_for("claude-haiku-4-5")
    assert price is not None and price.cache_write is not None

    def pico(prompt: int, read: int, wrote: int, out: int) -> int:
        dollars = ((prompt - read - wrote) * price.input + read * price.cached_input + wrote * price.cache_write
                   + out * price.output) / Decimal(1_000_000)
        return int(dollars * 10**12)

    assert cost0 == pico(p0, 0, wrote0, out0) and cost1 == pico(p1, read1, 0, out1)
