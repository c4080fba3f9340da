"""Running it every night (issue 29): a fixed file run again resumes or starts over as the user means, jobs named
and found by a person's words, runs named for their work."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic import SecretStr

from conftest import Sim, cli, rows, write_prompts
from llm_dispatch.core import to_json
from llm_dispatch.flows import collect_batches, dispatch, dispatch_directory, realtime_dispatch

pytestmark = [pytest.mark.prefect]


def suite(path: Path, count: int = 12) -> Path:
    return write_prompts(path, [{"id": f"q{i}", "prompt": f"question {i}"} for i in range(count)])


def note(done) -> str:  # type: ignore[no-untyped-def]
    """The CLI's line about which job the run worked on."""
    lines = [line for line in done.stderr.splitlines() if line.startswith(("resumed job", "job "))]
    assert len(lines) == 1, done.stderr[-3000:]
    return lines[0]


def test_the_same_file_on_two_nights(cli_env: dict[str, str], sim: Sim, db_url: str, tmp_path: Path) -> None:
    """Without --new-job the second night resumes the finished job and says so; with it, a second job answers every
    prompt (sent again with --no-dedupe, from storage without)."""
    path = suite(tmp_path / "questions.jsonl")
    first = cli("run", str(path), "--json", env=cli_env, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    job = json.loads(first.stdout)
    assert job["job_name"] == "questions.jsonl" and not job["resumed"]
    assert sim.stats()["requests_total"] == 12

    again = cli("run", str(path), env=cli_env, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert note(again) == (f"resumed job {job['job_id'][:8]} (questions.jsonl): 12 of its 12 prompts were answered "
                           "before this run, nothing sent; --new-job starts a new job from the same file")
    assert sim.stats()["requests_total"] == 12

    fresh = cli("run", str(path), "--new-job", "--no-dedupe", "--job-name", "nightly-2026-11-27", "--json",
                env=cli_env, cwd=tmp_path)
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    second = json.loads(fresh.stdout)
    assert second["job_id"] != job["job_id"] and second["counts"] == {"succeeded": 12}
    assert sim.stats()["requests_total"] == 24  # every prompt sent again

    reused = cli("run", str(path), "--new-job", "--json", env=cli_env, cwd=tmp_path)
    third = json.loads(reused.stdout)
    assert third["counts"] == {"succeeded": 12} and third["realtime"]["reused"] == 12
    assert sim.stats()["requests_total"] == 24  # identical requests answered from storage
    assert sorted(rows(db_url, "SELECT name, status FROM jobs")) == [
        ("nightly-2026-11-27", "finished"), ("questions.jsonl", "finished"), ("questions.jsonl", "finished")]


def test_no_dedupe_starts_a_finished_job_over_and_resumes_an_unfinished_one(
    cli_env: dict[str, str], sim: Sim, db_url: str, tmp_path: Path
) -> None:
    path = write_prompts(tmp_path / "p.jsonl", [{"id": "ok", "prompt": "fine"}, {"id": "flaky", "prompt": "[[sim:500]]"}])
    env = {**cli_env, "LLM_DISPATCH_MAX_RETRIES": "0"}
    first = json.loads(cli("run", str(path), "--json", env=env, cwd=tmp_path).stdout)
    assert first["counts"] == {"succeeded": 1, "failed": 1}
    assert rows(db_url, "SELECT status FROM jobs") == [("finished",)]  # every prompt has an outcome

    # Unfinished: --no-dedupe resumes it, so the answered prompt is not paid again.
    resumed = cli("run", str(path), "--no-dedupe", env=env, cwd=tmp_path)
    assert note(resumed).startswith(f"resumed job {first['job_id'][:8]} (p.jsonl): 2 of its 2 prompts")
    assert sim.stats()["requests_total"] == 3  # only the failed one again

    sim.reset()
    finished = suite(tmp_path / "done.jsonl", 3)
    done = json.loads(cli("run", str(finished), "--json", env=env, cwd=tmp_path).stdout)
    started_over = cli("run", str(finished), "--no-dedupe", "--json", env=env, cwd=tmp_path)
    again = json.loads(started_over.stdout)
    assert note(started_over) == (f"job {done['job_id'][:8]} already answered this input and --no-dedupe was given: "
                                  f"new job {again['job_id'][:8]} (done.jsonl) sent its 3 prompts again")
    assert again["started_over_from"] == done["job_id"] and sim.stats()["requests_total"] == 6


def test_a_job_name_resumes_its_own_job_and_starts_a_new_one_under_another(
    cli_env: dict[str, str], sim: Sim, db_url: str, tmp_path: Path
) -> None:
    path = suite(tmp_path / "questions.jsonl", 4)
    first = json.loads(cli("run", str(path), "--job-name", "nightly-2026-11-26", "--json", env=cli_env,
                           cwd=tmp_path).stdout)
    same = json.loads(cli("run", str(path), "--job-name", "nightly-2026-11-26", "--json", env=cli_env,
                          cwd=tmp_path).stdout)
    other = json.loads(cli("run", str(path), "--job-name", "nightly-2026-11-27", "--no-dedupe", "--json",
                           env=cli_env, cwd=tmp_path).stdout)
    assert same["job_id"] == first["job_id"] and same["resumed"]
    assert other["job_id"] != first["job_id"] and not other["resumed"]
    assert sim.stats()["requests_total"] == 8

    # Jobs by name or by the first characters of their id, in every command that takes one.
    status = cli("status", "nightly-2026-11-27", "--json", env=cli_env, cwd=tmp_path)
    assert json.loads(status.stdout)["job_id"] == other["job_id"]
    exported = cli("export", first["job_id"][:6], env=cli_env, cwd=tmp_path)
    assert [json.loads(line)["id"] for line in exported.stdout.splitlines()] == ["q0", "q1", "q2", "q3"]
    resumed = cli("run", "--resume", other["job_id"][:8], "--json", env=cli_env, cwd=tmp_path)
    assert json.loads(resumed.stdout)["job_id"] == other["job_id"]
    listed = cli("status", env=cli_env, cwd=tmp_path).stdout
    assert first["job_id"][:8] in listed and first["job_id"] not in listed  # short ids, as git shows commits


def test_conflicting_or_ambiguous_job_choices_are_one_line(cli_env: dict[str, str], tmp_path: Path) -> None:
    path = suite(tmp_path / "questions.jsonl", 2)
    both = cli("run", str(path), "--resume", "abcd", "--new-job", env=cli_env, cwd=tmp_path)
    assert both.returncode == 2 and "give one or the other" in both.stderr
    for _ in range(2):
        assert cli("run", str(path), "--new-job", env=cli_env, cwd=tmp_path).returncode == 0
    ambiguous = cli("status", "questions.jsonl", env=cli_env, cwd=tmp_path)
    assert ambiguous.returncode == 2
    assert "error: job 'questions.jsonl' is ambiguous: several jobs are called that:" in ambiguous.stderr


async def test_a_scheduled_run_names_its_job_after_the_file_and_the_night(
    prefect_api: str, sim: Sim, db_url: str, tmp_path: Path
) -> None:
    """A schedule's runs (auto-scheduled flow runs) of a fixed file: one job a night, a retry the same night resumes."""
    from prefect import flow
    from prefect.context import FlowRunContext

    from llm_dispatch.flows._setup import scheduled_job_name

    @flow
    async def scheduled(when: datetime) -> tuple[str | None, str | None]:
        context = FlowRunContext.get()
        assert context is not None and context.flow_run is not None
        manual = scheduled_job_name("inbox/questions.jsonl")
        context.flow_run = context.flow_run.model_copy(update={"auto_scheduled": True, "expected_start_time": when})
        return manual, scheduled_job_name("inbox/questions.jsonl")

    assert await scheduled(datetime(2026, 11, 26, 2, tzinfo=UTC)) == (None, "questions-2026-11-26")


async def test_dispatch_directory_with_new_job_sends_every_file_again(
    prefect_api: str, sim: Sim, db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLM_DISPATCH_DATABASE_URL", db_url)
    monkeypatch.setenv("LLM_DISPATCH_BASE_URL", sim.base_url)
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    suite(inbox / "a.jsonl", 3)
    assert to_json(await dispatch_directory(directory=str(inbox)))["dispatched"] == ["a.jsonl"]
    assert to_json(await dispatch_directory(directory=str(inbox))) == {"dispatched": [], "skipped": ["a.jsonl"]}
    assert to_json(await dispatch_directory(directory=str(inbox), new_job=True))["dispatched"] == ["a.jsonl"]
    assert rows(db_url, "SELECT COUNT(*) FROM jobs") == [(2,)]


async def test_runs_and_artifacts_are_named_for_their_work(prefect_api: str, sim: Sim, db_url: str,
                                                          tmp_path: Path) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    path = suite(tmp_path / "questions.jsonl", 3)
    summary = to_json(await dispatch(prompts=str(path), base_url=sim.base_url, database_url=SecretStr(db_url),
                                     job_name="Nightly eval: 2026/11/26"))
    state = await collect_batches(database_url=SecretStr(db_url), return_state=True)
    resumed = await realtime_dispatch(job_id=summary["job_id"][:8], base_url=sim.base_url, database_url=db_url,
                                      return_state=True)
    shard = await realtime_dispatch(job_id=summary["job_id"], shard=1, shards=2, job_name="Nightly eval: 2026/11/26",
                                    planned_route="realtime", base_url=sim.base_url, database_url=db_url,
                                    return_state=True)
    async with get_client() as client:
        # By key: the session's Prefect server holds every earlier test's artifacts too.
        keys = ArtifactFilterKey(any_=["dispatch-nightly-eval-2026-11-26-report", "dispatch-nightly-eval-2026-11-26-routes"])
        artifacts = {a.key: a for a in await client.read_artifacts(artifact_filter=ArtifactFilter(key=keys))}
        collect_run = await client.read_flow_run(state.state_details.flow_run_id)
        resume_run = await client.read_flow_run(resumed.state_details.flow_run_id)
        shard_run = await client.read_flow_run(shard.state_details.flow_run_id)
    report = artifacts["dispatch-nightly-eval-2026-11-26-report"]
    assert report.description == f"Nightly eval: 2026/11/26 ({summary['job_id'][:8]}): report"
    assert report.data.startswith("# Nightly eval: 2026/11/26 (job ")
    assert "dispatch-nightly-eval-2026-11-26-routes" in artifacts
    assert collect_run.name == "collect (all jobs): 0 open batches, 0 ingested"
    assert resume_run.name == f"resume job {summary['job_id'][:8]}"
    assert shard_run.name == "shard 2/2 of Nightly eval: 2026/11/26"
