"""The shared prefixes a job's prompts have, found when the job is recorded and shown with the estimate before any
request leaves: the estimate's lines and ``--max-cost`` (priced with the cache plan), ``--json``, the rows stored
with the job, ``status``; through the real command against the simulator over real sockets."""

from __future__ import annotations

import json
import re
import uuid
from decimal import Decimal
from pathlib import Path

import pytest

from conftest import Sim, cli, rows, write_prompts
from llm_dispatch.core import ChatRequest, PriceTable, provider_lookup
from llm_dispatch.jobs._cache_plan import CacheEstimate, JobPrefixes, describe_cache_estimate

pytestmark = [pytest.mark.prefect]

COLUMNS = ("lane, key, provider, model, endpoint, prompts, prefix_tokens, prefix_messages, own_breakpoints, action, "
           "keys, ttl, planned_cost_pico_usd, uncached_cost_pico_usd")


def graded(tmp_path: Path, *, claude: int = 24, gpt: int = 16) -> Path:
    """Prompts sharing a rubric per model (one rubric of this test alone), and one prompt of no group."""
    rubric = f"Rubric {uuid.uuid4()}: grade the answer point by point. " + "Be strict and fair. " * 700
    records = [{"id": f"{model}-{n}", "model": model, "params": {"max_tokens": 16},
                "messages": [{"role": "system", "content": rubric}, {"role": "user", "content": f"item {n}"}]}
               for model, count in (("claude-sonnet-5-5", claude), ("gpt-6.2-sol", gpt)) for n in range(count)]
    records.append({"id": "alone", "model": "gpt-6.2-sol", "prompt": "A prompt of its own.",
                    "params": {"max_tokens": 16}})
    return write_prompts(tmp_path / "graded.jsonl", records)


@pytest.fixture
def env(cli_env: dict[str, str], sim: Sim) -> dict[str, str]:
    return {**cli_env, "LLM_DISPATCH_ANTHROPIC_BASE_URL": sim.root, "ANTHROPIC_API_KEY": "sk-ant-test",
            "LLM_DISPATCH_API_KEY": "sk-test"}


def test_the_groups_and_the_plans_price_are_shown_and_stored_before_any_request(
        env: dict[str, str], sim: Sim, db_url: str, tmp_path: Path) -> None:
    path = graded(tmp_path)
    # A job larger than its first chunks: stored while it is sent, its groups found by the check pass.
    refused = cli("run", str(path), "--route", "all-realtime", "--chunk-size", "4", "--max-cost", "0.000001",
                  env=env, cwd=tmp_path)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert sim.stats()["requests_total"] == 0
    said = re.search(r"estimated cost \$([\d.]+) with the cache plan \(\$([\d.]+) without\) is above --max-cost",
                     refused.stderr)
    assert said is not None, refused.stderr[-3000:]
    planned_total, total = (Decimal(value) for value in said.groups())
    assert planned_total < total

    stored = {row[3]: row for row in rows(db_url, f"SELECT {COLUMNS} FROM cache_groups")}
    assert set(stored) == {"claude-sonnet-5-5", "gpt-6.2-sol"}  # "alone" is no group
    claude, gpt = stored["claude-sonnet-5-5"], stored["gpt-6.2-sol"]
    assert claude[:2] == ("realtime", claude[1]) and claude[2] == "anthropic" and claude[5] == 24
    assert (claude[7], claude[8], claude[9], claude[11]) == (1, 0, "breakpoint", "5m")
    assert gpt[2] == "openai" and gpt[5] == 16 and gpt[9] == "keys" and gpt[10] >= 1
    for row in (claude, gpt):
        assert 3_000 < row[6] < 5_000 and row[12] < row[13]
    # What the user read before anything was sent: the total with the plan beside without, and a line per group.
    saved = Decimal(sum(row[13] - row[12] for row in stored.values())) / 10**12
    assert planned_total == pytest.approx(total - saved, abs=Decimal("0.000002"))
    assert "with the cache plan ~$" in refused.stderr and "2 shared prefixes" in refused.stderr
    for row in (claude, gpt):
        line = next(line for line in refused.stderr.splitlines() if f"realtime {row[1]} {row[3]}:" in line)
        assert f"{row[5]:,} prompts, ~{row[6]:,} prefix tokens: {row[9]} (" in line
        assert f"${Decimal(row[12]) / 10**12:.4f} vs ${Decimal(row[13]) / 10**12:.4f}" in line

    # --max-cost between the plan's price and the uncached one: the plan's is the one checked, so the run goes.
    limit = (planned_total + total) / 2
    done = cli("run", str(path), "--route", "all-realtime", "--max-cost", f"{limit:.6f}", "--json", env=env,
               cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["counts"] == {"succeeded": 41}
    # The resumed run's estimate found the same groups again from its open prompts, read back.
    estimate = summary["estimate"]
    assert {group["key"] for group in estimate["cache"]["groups"]} == {row[1] for row in stored.values()}
    assert estimate["planned_total"] == pytest.approx(float(planned_total), abs=2e-6)

    status = cli("status", summary["job_id"][:8], env={**env, "COLUMNS": "1000"}, cwd=tmp_path)
    assert status.returncode == 0, status.stderr[-2000:]
    assert "cache plan: 2 shared prefix(es)" in status.stdout and "(as recorded)" in status.stdout, status.stdout
    for row in (claude, gpt):
        assert f"realtime {row[1]} {row[3]}: {row[5]:,} prompts" in status.stdout
    as_json = json.loads(cli("status", summary["job_id"][:8], "--json", env=env, cwd=tmp_path).stdout)
    assert as_json["cache_plan"]["total"] == 2
    assert as_json["cache_plan"]["saved"] == pytest.approx(float(saved), abs=2e-6)


def test_json_shows_the_groups_and_with_the_plan_off_prices_nothing_planned(
        env: dict[str, str], sim: Sim, db_url: str, tmp_path: Path) -> None:
    path = graded(tmp_path, claude=6, gpt=0)
    done = cli("run", str(path), "--route", "all-batch", "--no-cache-plan", "--json", env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    estimate = json.loads(done.stdout)["estimate"]
    cache = estimate["cache"]
    assert (cache["total"], cache["enabled"], cache["saved"]) == (1, False, 0)
    [group] = cache["groups"]
    assert (group["lane"], group["model"], group["prompts"], group["action"]) == ("batch", "claude-sonnet-5-5", 6,
                                                                                  "none")
    assert group["planned_cost_pico_usd"] == group["uncached_cost_pico_usd"] > 0
    assert estimate["planned_total"] == estimate["total"]
    assert "with the cache plan ~" not in done.stderr
    assert rows(db_url, "SELECT lane, action, prompts FROM cache_groups") == [("batch", "none", 6)]


def test_an_estimate_names_the_largest_twenty_groups_then_counts_the_rest() -> None:
    found = JobPrefixes(provider_of=provider_lookup())
    for group in range(25):
        system = f"Instruction {group}. " + "Follow it closely. " * (50 + group * 40)
        for n in range(2):
            found.add(group * 2 + n, ChatRequest(model="gpt-6.2-sol", messages=[
                {"role": "system", "content": system}, {"role": "user", "content": f"item {n}"}]), route="realtime")
    found.add(99, ChatRequest(model="gpt-6.2-sol", messages=[{"role": "user", "content": "alone"}]), route="realtime")
    rows_ = found.plans(prices=PriceTable.load(), concurrency=50, enabled=True)
    assert len(rows_) == 25 and rows_[0].prefix_tokens == max(row.prefix_tokens for row in rows_)
    lines = describe_cache_estimate(CacheEstimate.of(rows_, enabled=True))
    assert lines[0].startswith("cache plan: 25 shared prefix(es)")
    assert len(lines) == 1 + 20 + 1 and lines[-1] == "  and 5 more"
