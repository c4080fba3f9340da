"""The report of a job's prompt caching, per group of prompts sharing a prefix, from the stored answers: in the run's
``--json`` summary and closing table, ``status`` (and ``--json``) and the Prefect report, after a real flow run
against the simulator's caches over real sockets."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from pydantic import SecretStr
from rich.console import Console

from llm_dispatch.core import PriceTable, to_json

from conftest import Sim, cli, rows, write_prompts

pytestmark = [pytest.mark.prefect]


def record(custom_id: str, model: str, system: str, item: str) -> dict:
    return {"id": custom_id, "model": model, "params": {"max_tokens": 16},
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": item}]}


def stored(db_url: str, group: str) -> list[tuple]:
    """The stored answers of the prompts whose id starts with ``group``, read apart from the code under test."""
    return rows(db_url, """
        SELECT p.model, r.route, r.prompt_tokens, r.completion_tokens, r.cached_tokens, r.cache_creation_tokens,
               r.service_tier, r.cost_pico_usd
        FROM results r JOIN prompts p ON p.id = r.prompt_id WHERE p.custom_id LIKE ? || '%'""", group)


async def test_each_groups_hit_rate_and_saving_are_shown_from_the_stored_answers(
        prefect_api: str, sim: Sim, db_url: str, tmp_path: Path, cli_env: dict[str, str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from llm_dispatch.cli.reports import job_table
    from llm_dispatch.flows._artifacts import report_markdown
    from llm_dispatch.flows.dispatch import dispatch

    monkeypatch.setenv("LLM_DISPATCH_ANTHROPIC_BASE_URL", sim.root)
    # A rubric of this test alone: the session's simulator keeps every earlier test's caches.
    rubric = f"Rubric {uuid.uuid4()}: grade the answer point by point. " + "Be strict and fair. " * 700
    records = [record(f"claude-{n}", "claude-sonnet-4-5", rubric, f"item {n}") for n in range(12)]
    records += [record(f"gpt-{n}", "gpt-4o-mini", rubric, f"item {n}") for n in range(8)]
    short_rubric = f"Short {uuid.uuid4()}."
    records += [record(f"short-{n}", "claude-sonnet-4-5", short_rubric, f"item {n}") for n in range(3)]
    records += [{"id": "alone", "model": "gpt-4o-mini", "prompt": "A prompt of its own.", "params": {"max_tokens": 16}}]
    path = write_prompts(tmp_path / "graded.jsonl", records)
    finished = await dispatch(prompts=str(path), base_url=sim.base_url, database_url=SecretStr(db_url),
                              route_policy="all-realtime")
    summary = to_json(finished)
    assert summary["counts"] == {"succeeded": len(records)}
    groups = {group["model"] + (" short" if group["prefix_tokens"] < 100 else ""): group
              for group in summary["cache"]}
    assert set(groups) == {"claude-sonnet-4-5", "gpt-4o-mini", "claude-sonnet-4-5 short"}  # "alone" is no group

    prices = PriceTable.load()
    for name, prefix in (("claude-sonnet-4-5", "claude-"), ("gpt-4o-mini", "gpt-"), ("claude-sonnet-4-5 short", "short-")):
        group, answers = groups[name], stored(db_url, prefix)
        assert (group["prompts"], group["answers"], group["unpriced"]) == (len(answers), len(answers), 0), name
        # What was paid is what is stored; uncached, the same answers priced with nothing read or written.
        paid = sum(row[7] for row in answers)
        uncached = 0
        for model, route, prompt_tokens, completion_tokens, _, _, tier, _ in answers:
            plain = prices.price(model=model, route=route, prompt_tokens=prompt_tokens,
                                 completion_tokens=completion_tokens, service_tier=tier)
            assert plain is not None
            uncached += plain.cost
        assert group["cached_tokens"] == sum(row[4] for row in answers), name
        # Cached over the prefix the answers held: the estimate, or the provider's count where one reported more.
        held = max(group["prefix_tokens"], *(row[4] + (row[5] or 0) for row in answers)) * len(answers)
        assert group["hit_rate"] == pytest.approx(group["cached_tokens"] / held, abs=1e-4), name
        assert group["written_tokens"] == sum(row[5] or 0 for row in answers), name
        assert group["cost"] == pytest.approx(paid / 1e12, abs=1e-6), name
        assert group["uncached_cost"] == pytest.approx(uncached / 1e12, abs=1e-6), name
        assert group["saved"] == pytest.approx((uncached - paid) / 1e12, abs=2e-6), name

    claude, gpt, short = groups["claude-sonnet-4-5"], groups["gpt-4o-mini"], groups["claude-sonnet-4-5 short"]
    # The plan's breakpoint: the warm-up wrote the prefix once, the other 11 read it.
    assert claude["hit_rate"] == pytest.approx(11 / 12, abs=1e-4) and claude["saved"] > 0
    assert claude["prefix_tokens"] > 3000
    # OpenAI's automatic cache over the plan's keys, each warmed once: read by the rest.
    assert gpt["cached_tokens"] > 0 and gpt["saved"] > 0
    # Below Claude's minimum: nothing cached, nothing saved.
    assert (short["cached_tokens"], short["hit_rate"], short["saved"]) == (0, 0.0, 0.0)

    # The run's closing table: a line per group.
    console = Console(width=400, record=True)
    console.print(job_table(finished, title="run"))
    shown = " ".join(console.export_text().split())  # the caption wraps at the table's width
    assert (f"cache {claude['key']} claude-sonnet-4-5: 12 prompts, ~{claude['prefix_tokens']:,} prefix tokens, "
            f"{claude['cached_tokens']:,} cached, hit rate 91.7%; paid ${claude['cost']:.6f}, uncached "
            f"${claude['uncached_cost']:.6f}, saved ${claude['saved']:.6f}") in shown
    # The Prefect report's table.
    assert (f"| {gpt['key']} | gpt-4o-mini | 8 | {gpt['prefix_tokens']} | {gpt['cached_tokens']} "
            f"| {gpt['hit_rate']:.1%} | ${gpt['cost']:.6f} | ${gpt['uncached_cost']:.6f} | ${gpt['saved']:.6f} |"
            ) in report_markdown(finished)
    # status --cache, after the fact, from the database alone: the same figures (plain status does not read them).
    assert json.loads(cli("status", summary["job_id"], "--json", env=cli_env, cwd=tmp_path).stdout)["cache"] is None
    as_json = json.loads(cli("status", summary["job_id"], "--cache", "--json", env=cli_env, cwd=tmp_path).stdout)
    assert as_json["cache"] == summary["cache"]
    listed = " ".join(cli("status", summary["job_id"], "--cache", env=cli_env, cwd=tmp_path).stdout.split())
    assert f"cache {short['key']} claude-sonnet-4-5: 3 prompts," in listed and "hit rate 0.0%;" in listed
