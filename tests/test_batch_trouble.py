"""One batch's trouble stays with that batch: a sweep over several jobs where the provider lost one batch and
fails on another collects the rest, names both problems in its state and artifact, keeps the error on the batch
and tries it again later; cancel goes on past a batch it cannot reach; ``abandon`` gives one up by hand.
Real Prefect flow runs against the simulator over real sockets."""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from conftest import Sim, cli, rows, successes_per_prompt
from llm_dispatch.core import to_json
from llm_dispatch.core import BatchInUseError
from llm_dispatch.flows.batch import abandon_batch_flow, cancel_job_batches, collect_batches
from llm_dispatch.flows.dispatch import dispatch
from llm_dispatch.tasks import result_of
from llm_dispatch.jobs._batch_trouble import BATCH_RETRY_FIRST, BATCH_RETRY_MAX, batch_error_wait

pytestmark = [pytest.mark.prefect]


def trouble(sim: Sim, provider_batch_id: str, what: str | int | None) -> None:
    httpx.post(f"{sim.root}/_sim/batch_trouble", json={"batch_id": provider_batch_id, "trouble": what},
               timeout=60).raise_for_status()


def provider_statuses(sim: Sim) -> set[str]:
    batches = httpx.get(f"{sim.base_url}/batches", params={"limit": 100}, timeout=60).raise_for_status().json()
    return {b["status"] for b in batches["data"]}


async def submit_jobs(sim: Sim, db_url: str, *, jobs: int, prompts: int) -> list[str]:
    """``jobs`` jobs of ``prompts`` prompts each, sent to the Batch API without waiting; their ids."""
    ids = []
    for job in range(jobs):
        summary = to_json(await dispatch(prompts=[{"id": f"j{job}-q{i}", "prompt": f"job {job} question {i}"}
                                                  for i in range(prompts)],
                                         route_policy="all-batch", base_url=sim.base_url, database_url=SecretStr(db_url),
                                         wait=False, job_name=f"job {job}"))
        ids.append(summary["job_id"])
    return ids


async def provider_done(sim: Sim, *, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while provider_statuses(sim) - {"completed", "failed", "expired", "cancelled"}:
        assert time.monotonic() < deadline, "the simulator's batches never ended"
        await asyncio.sleep(0.05)


def batch_of(db_url: str, job_id: str) -> tuple[int, str]:
    [(batch_id, provider_id)] = rows(db_url, "SELECT id, provider_batch_id FROM batches WHERE job_id = ? "
                                             "ORDER BY id LIMIT 1", job_id)
    return batch_id, provider_id


async def one_finished_batch(sim: Sim, db_url: str, monkeypatch: pytest.MonkeyPatch) -> tuple[str, int, str]:
    """A job of three prompts in one batch the provider has finished (not yet collected); no retries of a call."""
    monkeypatch.setenv("LLM_DISPATCH_MAX_RETRIES", "0")
    sim.configure(batch_processing_seconds=0.2)
    [job] = await submit_jobs(sim, db_url, jobs=1, prompts=3)
    await provider_done(sim)
    return job, *batch_of(db_url, job)


def test_a_batch_waits_longer_after_each_error_in_a_row_up_to_a_limit() -> None:
    waits = [batch_error_wait(n) for n in range(1, 12)]
    assert waits[0] == BATCH_RETRY_FIRST and waits[1] == 2 * BATCH_RETRY_FIRST
    assert waits == sorted(waits) and waits[-1] == BATCH_RETRY_MAX


async def test_a_sweep_collects_every_job_but_a_lost_batch_and_a_failing_one_and_names_both(
    prefect_api: str, sim: Sim, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    monkeypatch.setenv("LLM_DISPATCH_MAX_RETRIES", "0")
    sim.configure(batch_processing_seconds=0.3)
    jobs = await submit_jobs(sim, db_url, jobs=5, prompts=4)
    await provider_done(sim)
    lost_batch, lost_provider_id = batch_of(db_url, jobs[0])
    failing_batch, failing_provider_id = batch_of(db_url, jobs[1])
    trouble(sim, lost_provider_id, "forget")
    trouble(sim, failing_provider_id, 500)

    state = await collect_batches(database_url=SecretStr(db_url), base_url=sim.base_url, return_state=True)

    assert state.is_failed()
    assert f"batch {lost_batch} (job {jobs[0][:8]}) lost" in state.message
    assert f"batch {failing_batch} (job {jobs[1][:8]}): poll failed" in state.message
    first = to_json(await result_of(state))
    assert len(first["ingested"]) == 3 and sum(i["succeeded"] for i in first["ingested"]) == 12
    assert [p["batch_id"] for p in first["problems"]] == [lost_batch, failing_batch]
    # The lost batch's four prompts were sent again in a new batch at once; the failing one keeps its error.
    assert first["resubmitted"] == 4
    status, error, count, retry_after = rows(
        db_url, "SELECT status, last_error, error_count, retry_after FROM batches WHERE id = ?", failing_batch)[0]
    assert status == "validating" and count == 1  # as last polled and error.startswith("poll: InternalServerError")
    assert retry_after is not None
    assert rows(db_url, "SELECT status FROM batches WHERE id = ?", lost_batch) == [("lost",)]
    async with get_client() as client:
        sweeps = ArtifactFilter(key=ArtifactFilterKey(any_=["collect-batches"]))
        [artifact] = [a for a in await client.read_artifacts(artifact_filter=sweeps)
                      if a.flow_run_id == state.state_details.flow_run_id]
    assert "## Problems (2)" in artifact.data and f"| {lost_batch} | {jobs[0][:8]} | lost |" in artifact.data
    assert f"| {failing_batch} | {jobs[1][:8]} | poll |" in artifact.data

    # The next sweep leaves the failing batch alone (its wait is not over) and collects the resent prompts.
    await provider_done(sim)
    second = to_json(await collect_batches(database_url=SecretStr(db_url), base_url=sim.base_url))
    assert second["waiting"] == [failing_batch] and second["problems"] == []
    assert sum(i["succeeded"] for i in second["ingested"]) == 4

    # Healed, and tried now: the last job is collected too; every prompt answered exactly once.
    trouble(sim, failing_provider_id, None)
    third = to_json(await collect_batches(database_url=SecretStr(db_url), base_url=sim.base_url, retry_now=True))
    assert [i["batch_id"] for i in third["ingested"]] == [failing_batch] and third["problems"] == []
    assert set(successes_per_prompt(db_url).values()) == {1} and len(successes_per_prompt(db_url)) == 20
    assert rows(db_url, "SELECT DISTINCT status FROM jobs") == [("finished",)]
    assert rows(db_url, "SELECT error_count, retry_after FROM batches WHERE id = ?", failing_batch) == [(0, None)]
    assert sim.stats()["batches"] == 6  # five, and the lost one's prompts once more


async def test_a_batch_unknown_at_the_provider_but_listed_under_its_ids_is_adopted_not_lost(
    prefect_api: str, sim: Sim, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    job, batch_id, provider_id = await one_finished_batch(sim, db_url, monkeypatch)
    # Our row names a provider id the provider never had; the batch it made for us carries our ids in its metadata.
    with sqlite3.connect(db_url.split("///", 1)[1]) as con:
        con.execute("UPDATE batches SET provider_batch_id = 'batch_gone' WHERE id = ?", (batch_id,))

    first = await collect_batches(database_url=SecretStr(db_url), base_url=sim.base_url, return_state=True)
    [problem] = to_json(await result_of(first))["problems"]
    assert not problem["lost"] and f"adopted {provider_id}" in problem["error"]
    second = to_json(await collect_batches(database_url=SecretStr(db_url), base_url=sim.base_url, retry_now=True))
    assert [i["succeeded"] for i in second["ingested"]] == [3]
    assert sim.stats()["batches"] == 1


async def test_cancel_goes_past_a_batch_it_cannot_reach_and_says_so(
    prefect_api: str, sim: Sim, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLM_DISPATCH_MAX_RETRIES", "0")
    monkeypatch.setenv("LLM_DISPATCH_BATCH_MAX_REQUESTS", "2")
    sim.configure(batch_processing_seconds=30.0)
    [job] = await submit_jobs(sim, db_url, jobs=1, prompts=4)
    (unreachable, unreachable_id), (other, _) = rows(
        db_url, "SELECT id, provider_batch_id FROM batches WHERE job_id = ? ORDER BY id", job)
    trouble(sim, unreachable_id, 503)

    state = await cancel_job_batches(job_id=job, database_url=SecretStr(db_url), base_url=sim.base_url,
                                     wait_seconds=60.0, return_state=True)  # ends once the other is ingested

    assert state.is_failed() and f"batch {unreachable} (job {job[:8]}): cancel failed" in state.message
    summary = to_json(await result_of(state))
    assert summary["cancelled"] == [other] and [i["batch_id"] for i in summary["ingested"]] == [other]
    # The one it could not reach stays open with its error, for a later sweep (or `abandon`).
    [(status, count)] = rows(db_url, "SELECT status, error_count FROM batches WHERE id = ?", unreachable)
    assert status not in ("ingested", "lost") and count == 1
    assert rows(db_url, "SELECT status FROM batches WHERE id = ?", other) == [("ingested",)]


async def test_abandon_refuses_a_batch_the_provider_holds_and_gives_up_one_it_lost(
    prefect_api: str, sim: Sim, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    job, batch_id, provider_id = await one_finished_batch(sim, db_url, monkeypatch)

    with pytest.raises(BatchInUseError, match="`llm-dispatch collect` stores its answers"):
        await abandon_batch_flow(batch_id=batch_id, database_url=SecretStr(db_url), base_url=sim.base_url)
    assert rows(db_url, "SELECT status FROM batches") == [("validating",)]  # as last polled: unchanged

    trouble(sim, provider_id, "forget")
    outcome = await abandon_batch_flow(batch_id=batch_id, database_url=SecretStr(db_url), base_url=sim.base_url)
    assert outcome.released == 3 and outcome.provider_said.startswith("NotFoundError: HTTP 404")
    assert rows(db_url, "SELECT status FROM batches") == [("lost",)]
    assert rows(db_url, "SELECT DISTINCT status FROM prompts") == [("pending",)]

    # The next run of the job answers each prompt once.
    resumed = to_json(await dispatch(job_id=job, base_url=sim.base_url, database_url=SecretStr(db_url), wait=True,
                                     batch_poll_interval=0.1))
    assert resumed["counts"] == {"succeeded": 3}
    assert set(successes_per_prompt(db_url).values()) == {1}


def test_the_cli_names_each_problem_in_one_line_and_exits_3(cli_env: dict[str, str], sim: Sim, db_url: str,
                                                            tmp_path: Path) -> None:
    from conftest import write_prompts

    sim.configure(batch_processing_seconds=0.3)
    env = {**cli_env, "LLM_DISPATCH_MAX_RETRIES": "0"}
    path = write_prompts(tmp_path / "p.jsonl", [{"id": i, "prompt": f"question {i}"} for i in range(3)])
    assert cli("run", str(path), "--route", "all-batch", "--no-wait", env=env, cwd=tmp_path).returncode == 0
    asyncio.run(provider_done(sim))
    [(batch_id, provider_id)] = rows(db_url, "SELECT id, provider_batch_id FROM batches")
    trouble(sim, provider_id, 502)

    swept = cli("collect", env=env, cwd=tmp_path)
    assert swept.returncode == 3, swept.stderr[-2000:]
    [line] = [line for line in swept.stderr.splitlines() if line.startswith("error:")]
    assert f"batch {batch_id}" in line and "poll failed (1 in a row)" in line and "Traceback" not in swept.stderr

    cancelled = cli("cancel", rows(db_url, "SELECT id FROM jobs")[0][0][:8], "--wait-seconds", "0", env=env,
                    cwd=tmp_path)
    assert cancelled.returncode == 3 and "Traceback" not in cancelled.stderr
    assert f"batch {batch_id}" in cancelled.stderr and "cancel failed" in cancelled.stderr

    trouble(sim, provider_id, "forget")
    abandoned = cli("abandon", str(batch_id), env=env, cwd=tmp_path)
    assert abandoned.returncode == 0, abandoned.stderr[-2000:]
    # The job's cancel asked for its prompts not to be sent again: they fail as cancelled, none pending.
    said = " ".join(abandoned.stdout.split())
    assert f"batch {batch_id} abandoned (NotFoundError" in said and "0 prompts of job" in said
    assert "3 failed as cancelled" in said
    assert rows(db_url, "SELECT status, COUNT(*) FROM prompts GROUP BY status") == [("failed", 3)]


async def test_a_run_follows_many_batches_in_one_sub_flow_and_one_failing_poll_stops_none(
    prefect_api: str, sim: Sim, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, FlowRunFilter, \
        FlowRunFilterParentFlowRunId
    from llm_dispatch.tasks import result_of

    monkeypatch.setenv("LLM_DISPATCH_MAX_RETRIES", "0")
    monkeypatch.setenv("LLM_DISPATCH_BATCH_MAX_REQUESTS", "3")
    sim.configure(batch_processing_seconds=1.0)
    # The first batch created answers its first two polls 503, then serves them: counted, so however slow the
    # machine, the run meets both errors (fewer than FOLLOW_ERRORS in a row) and then the healed batch.
    httpx.post(f"{sim.root}/_sim/batch_faults", json={"faults": ["unreachable:2"]}, timeout=60).raise_for_status()

    state = await dispatch(prompts=[{"id": i, "prompt": f"question {i}"} for i in range(60)], route_policy="all-batch",
                           base_url=sim.base_url, database_url=SecretStr(db_url), wait=True, batch_poll_interval=0.2,
                           return_state=True)
    summary = to_json(await result_of(state))

    assert summary["counts"] == {"succeeded": 60} and summary["batch"]["submitted_batches"] == 20
    # The troubled batch's error was kept on it, and cleared once a poll worked again; no other batch had one.
    [(error, count)] = rows(db_url, "SELECT last_error, error_count FROM batches WHERE last_error IS NOT NULL")
    assert error.startswith("poll: InternalServerError: HTTP 503") and count == 0
    assert set(successes_per_prompt(db_url).values()) == {1}
    # One polling sub-flow run followed all twenty, with the progress artifact: no sub-flow per batch.
    async with get_client() as client:
        children = await client.read_flow_runs(flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[state.state_details.flow_run_id])))
        [child] = children
        flow = await client.read_flow(child.flow_id)
        artifacts = await client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[child.id])))
    assert flow.name == "wait-for-batches" and child.name == f"wait for 20 batches of job {summary['job_id'][:8]}"
    assert child.state is not None and child.state.is_completed()
    # The parent's run was handed over in-process: the UI shows its type, never its settings (the database URL).
    assert child.parameters["run"] == "<JobRun>" and db_url not in json.dumps(child.parameters)
    assert [a.type for a in artifacts] == ["progress"]
    assert "20 of 20 batches ingested" in (artifacts[0].description or "")


async def test_an_endpoint_without_a_batch_api_gets_every_prompt_real_time_with_one_warning_and_remembers(
    prefect_api: str, start_sim: Any, db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    base_url = await start_sim(batch_api=False, latency=0.01)
    prompts = [{"id": f"short-{i}", "prompt": f"question {i}"} for i in range(5)] + [
        {"id": f"long-{i}", "prompt": f"a long document {i}. " * 80} for i in range(3)]

    with caplog.at_level(logging.WARNING):
        summary = to_json(await dispatch(prompts=prompts, base_url=base_url, database_url=SecretStr(db_url),
                                         wait=True))

    assert summary["counts"] == {"succeeded": 8} and summary["routes"] == {"realtime": {"succeeded": 8}}
    warnings = [r.getMessage() for r in caplog.records if "no Batch API" in r.getMessage()]
    assert len(warnings) == 1 and "3 prompts routed to the Batch API go real-time instead" in warnings[0]
    assert rows(db_url, "SELECT COUNT(*) FROM endpoint_capabilities WHERE batch_api = 0") == [(1,)]
    answered = dict(rows(db_url, "SELECT p.custom_id, r.route FROM results r JOIN prompts p ON p.id = r.prompt_id"))
    assert set(answered.values()) == {"realtime"} and len(answered) == 8

    # The next job there is routed real-time at once: no upload tried.
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        again = to_json(await dispatch(prompts=prompts, base_url=base_url, database_url=SecretStr(db_url),
                                       wait=True, new_job=True, dedupe=False))
    assert again["counts"] == {"succeeded": 8} and again["batch"]["submitted_batches"] == 0
    assert len([r for r in caplog.records if "has no Batch API" in r.getMessage()]) == 1


async def test_route_all_realtime_on_a_resumed_job_re_plans_its_pending_batch_prompts(
    prefect_api: str, sim: Sim, db_url: str
) -> None:
    prompts = [{"id": i, "prompt": f"a long document {i}. " * 80} for i in range(4)]
    refused = await dispatch(prompts=prompts, base_url=sim.base_url, database_url=SecretStr(db_url),
                             max_cost=0.0000001, return_state=True)  # recorded, routed to batch, nothing sent
    assert refused.name == "MaxCostRefused"
    assert rows(db_url, "SELECT DISTINCT planned_route FROM prompts") == [("batch",)]

    again = to_json(await dispatch(prompts=prompts, base_url=sim.base_url, database_url=SecretStr(db_url),
                                   route_policy="all-realtime", wait=True))
    assert again["resumed"] and again["routes"] == {"realtime": {"succeeded": 4}}
    assert again["batch"]["submitted_batches"] == 0


async def test_an_endpoint_without_a_batch_api_reroutes_only_its_own_providers_prompts(
    prefect_api: str, sim: Sim, start_sim: Any, db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """OpenAI's base URL has no Batch API, Anthropic's has one: the long OpenAI prompts go real-time (one warning),
    the long Claude prompts still go through Message Batches at half price."""
    sim.configure(batch_processing_seconds=0.3)
    no_batches = await start_sim(batch_api=False, latency=0.01)
    long = "a long document. " * 80
    prompts = [{"id": f"gpt-{i}", "prompt": f"{long}{i}"} for i in range(3)] + [
        {"id": f"claude-{i}", "model": "claude-haiku-5-5", "prompt": f"{long}{i}", "params": {"max_tokens": 50}}
        for i in range(3)]

    with caplog.at_level(logging.WARNING):
        summary = to_json(await dispatch(prompts=prompts, base_url=no_batches, anthropic_base_url=sim.root,
                                         database_url=SecretStr(db_url), wait=True, batch_poll_interval=0.1))

    assert summary["counts"] == {"succeeded": 6}
    answered = dict(rows(db_url, "SELECT p.custom_id, r.route FROM results r JOIN prompts p ON p.id = r.prompt_id"))
    assert answered == {**{f"gpt-{i}": "realtime" for i in range(3)}, **{f"claude-{i}": "batch" for i in range(3)}}
    assert rows(db_url, "SELECT provider, status FROM batches WHERE provider_batch_id IS NOT NULL") == [
        ("anthropic", "ingested")]
    warnings = [r.getMessage() for r in caplog.records if "no Batch API" in r.getMessage()]
    assert len(warnings) == 1 and "3 prompts routed to the Batch API go real-time instead" in warnings[0]

    # The next run knows it: the OpenAI prompts real-time from the start, the Claude ones in a batch again.
    again = to_json(await dispatch(prompts=prompts, base_url=no_batches, anthropic_base_url=sim.root,
                                   database_url=SecretStr(db_url), wait=True, new_job=True, batch_poll_interval=0.1))
    assert again["routes"] == {"realtime": {"succeeded": 3}, "batch": {"succeeded": 3}}



async def test_route_all_batch_on_a_resumed_job_re_plans_its_pending_prompts_that_a_batch_can_meet(
    prefect_api: str, sim: Sim, db_url: str
) -> None:
    sim.configure(batch_processing_seconds=0.3)
    prompts = [{"id": i, "prompt": f"question {i}"} for i in range(4)] + [
        {"id": "soon", "prompt": "question soon", "deadline": "20m"}]
    refused = await dispatch(prompts=prompts, base_url=sim.base_url, database_url=SecretStr(db_url),
                             max_cost=0.0000001, return_state=True)  # recorded, short ones real-time, nothing sent
    assert refused.name == "MaxCostRefused"
    assert rows(db_url, "SELECT DISTINCT planned_route FROM prompts") == [("realtime",)]

    again = to_json(await dispatch(prompts=prompts, base_url=sim.base_url, database_url=SecretStr(db_url),
                                   route_policy="all-batch", wait=True, batch_poll_interval=0.1))
    assert again["resumed"] and again["counts"] == {"succeeded": 5}
    # The four without a deadline went in a batch; the one due in 20 minutes stayed real-time.
    assert again["routes"] == {"batch": {"succeeded": 4}, "realtime": {"succeeded": 1}}
    assert again["batch"]["submitted_batches"] == 1
    answered = dict(rows(db_url, "SELECT p.custom_id, r.route FROM results r JOIN prompts p ON p.id = r.prompt_id"))
    assert answered == {"0": "batch", "1": "batch", "2": "batch", "3": "batch", "soon": "realtime"}
