"""The realtime-dispatch flow against the simulator over real sockets, in real Prefect flow runs."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from prefect import flow

from llm_dispatch.core import to_json
from llm_dispatch import storage
from llm_dispatch.flows.realtime import realtime_dispatch
from llm_dispatch.core import Settings
from llm_dispatch.tasks import record_prompts, result_of
from conftest import Sim, rows, successes_per_prompt, write_prompts

pytestmark = [pytest.mark.prefect]


async def chunk_states(state: Any) -> dict[str, tuple[str, str]]:
    """The send-chunk task runs of the flow run that ended in ``state``: name -> (state type, message)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    async with get_client() as client:
        runs = await client.read_task_runs(flow_run_filter=FlowRunFilter(
            id=FlowRunFilterId(any_=[state.state_details.flow_run_id])))
    return {run.name: (run.state.type.value, run.state.message or "") for run in runs
            if run.name.startswith("send chunk") and run.state is not None}



async def test_flow_with_faults_records_every_outcome(prefect_api: str, sim: Sim, db_url: str, tmp_path: Path) -> None:
    records = [{"id": f"ok-{i}", "prompt": f"question {i}"} for i in range(40)]
    records += [
        {"id": "flaky", "prompt": "flaky [[sim:500x2]]"},
        {"id": "limited", "prompt": "limited [[sim:429x1]]"},
        {"id": "dropped", "prompt": "dropped [[sim:dropx1]]"},
        {"id": "garbled", "prompt": "garbled [[sim:malformedx1]]"},
        {"id": "bad", "prompt": "bad [[sim:400]]"},
    ]
    path = write_prompts(tmp_path / "p.jsonl", records)

    state = await realtime_dispatch(
        prompts=str(path), base_url=sim.base_url, database_url=db_url, concurrency=8, chunk_size=10, return_state=True
    )
    summary = to_json(await result_of(state))

    # Failed prompts make the run Failed in Prefect (alerts fire), its message counting them; so are the chunks
    # that had them, and only those.
    assert state.is_failed() and state.message == (
        "prompts failed: 2 of 45 prompts failed (4.4%): APIResponseValidationError 1, BadRequestError 1")
    chunks = await chunk_states(state)
    assert len(chunks) == 5 and {kind for kind, _ in chunks.values()} == {"COMPLETED", "FAILED"}
    failed_chunks = [message for kind, message in chunks.values() if kind == "FAILED"]
    assert sum(int(message.split(" of ")[0]) for message in failed_chunks) == 2
    assert all(message.endswith("; the run goes on") for message in failed_chunks)
    assert summary["counts"] == {"succeeded": 43, "failed": 2}
    assert summary["failed_by_class"] == {"BadRequestError": 1, "APIResponseValidationError": 1}
    by_id = {cid: (status, attempts, cls, text) for cid, status, attempts, cls, text in rows(db_url, """
        SELECT p.custom_id, r.status, r.attempts, r.error_class, r.text FROM results r JOIN prompts p ON p.id = r.prompt_id""")}
    assert by_id["flaky"][:2] == ("succeeded", 3)
    assert by_id["limited"][:2] == ("succeeded", 2)
    assert by_id["dropped"][:2] == ("succeeded", 2)
    # A 200 that is not JSON was answered, maybe billed: never sent again.
    assert by_id["garbled"][:3] == ("failed", 1, "APIResponseValidationError")
    assert by_id["bad"][:3] == ("failed", 1, "BadRequestError")
    assert all(text for status, _, _, text in by_id.values() if status == "succeeded")
    tokens = rows(db_url, "SELECT MIN(prompt_tokens), MIN(completion_tokens), MIN(latency_ms) FROM results WHERE status='succeeded'")
    assert all(value and value > 0 for value in tokens[0])
    assert set(successes_per_prompt(db_url).values()) <= {0, 1}


async def test_the_prefect_ui_shows_the_job_in_words(prefect_api: str, sim: Sim, db_url: str, tmp_path: Path) -> None:
    """Flow and task runs are named for what they do; the summary stays out of the log lines."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, LogFilter, LogFilterFlowRunId
    from prefect.logging.handlers import APILogHandler

    path = write_prompts(tmp_path / "questions.jsonl", [{"id": i, "prompt": f"question {i}"} for i in range(25)])
    state = await realtime_dispatch(prompts=str(path), base_url=sim.base_url, database_url=db_url, chunk_size=10,
                                    return_state=True)
    run_id = state.state_details.flow_run_id
    await APILogHandler.aflush()  # log lines reach the API in batches
    async with get_client() as client:
        run = await client.read_flow_run(run_id)
        tasks = await client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id])))
        logs = await client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id])))
    assert run.name == "questions.jsonl"
    names = sorted(task.name for task in tasks)
    assert names[0] == "record questions.jsonl"
    assert names[1:] == ["send chunk 1/3 (10 prompts)", "send chunk 2/3 (10 prompts)", "send chunk 3/3 (5 prompts)"]
    messages = [log.message for log in logs]
    assert any("25 prompts sent, 25 succeeded, 0 refused, 0 failed" in message for message in messages)
    assert not any("{" in message for message in messages), "no dicts in the log lines"


async def test_same_input_again_sends_nothing_new(prefect_api: str, sim: Sim, db_url: str, tmp_path: Path) -> None:
    path = write_prompts(tmp_path / "p.jsonl", [{"id": i, "prompt": f"q{i}"} for i in range(30)] + [{"id": "bad", "prompt": "[[sim:400]]"}])
    first = to_json(await realtime_dispatch(prompts=str(path), base_url=sim.base_url, database_url=db_url, fail_above=1.0))
    sent = sim.stats()["requests_total"]
    assert sent == 31

    again = to_json(await realtime_dispatch(prompts=str(path), base_url=sim.base_url, database_url=db_url, fail_above=1.0))

    assert again["job_id"] == first["job_id"] and again["resumed"]
    assert sim.stats()["requests_total"] == sent  # succeeded never resent; a 400 is final
    assert again["counts"] == {"succeeded": 30, "failed": 1}

    await realtime_dispatch(job_id=first["job_id"], retry_failed="all", base_url=sim.base_url, database_url=db_url,
                            fail_above=1.0)
    assert sim.stats()["requests_total"] == sent + 1  # only the failed one, when asked


async def test_identical_requests_are_paid_once(prefect_api: str, sim: Sim, db_url: str, tmp_path: Path) -> None:
    same = {"prompt": "the same question", "params": {"temperature": 0, "reasoning_effort": "none"}}
    path = write_prompts(tmp_path / "a.jsonl", [{"id": f"a{i}", **same} for i in range(5)] + [{"id": "x", "prompt": "other"}])
    await realtime_dispatch(prompts=str(path), base_url=sim.base_url, database_url=db_url)
    assert sim.stats()["requests_total"] == 2

    # A different job asking the same thing reuses the stored answer ...
    path_b = write_prompts(tmp_path / "b.jsonl", [{"id": "b", **same}])
    summary = to_json(await realtime_dispatch(prompts=str(path_b), base_url=sim.base_url, database_url=db_url))
    assert summary["reused"] == 1 and sim.stats()["requests_total"] == 2
    # ... unless told not to.
    path_c = write_prompts(tmp_path / "c.jsonl", [{"id": "c", **same}])
    await realtime_dispatch(prompts=str(path_c), base_url=sim.base_url, database_url=db_url, dedupe=False)
    assert sim.stats()["requests_total"] == 3
    routes = rows(db_url, "SELECT route, COUNT(*) FROM results GROUP BY route")
    assert dict(routes) == {"realtime": 3, "reused": 5}


async def test_new_job_is_sent_while_the_rest_is_recorded(
    prefect_api: str, sim: Sim, db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job bigger than the first chunks starts sending before all of it is stored, and loses nothing:
    identical requests split between the first prompts and later slices are still paid once."""
    from llm_dispatch.core import LLMClient

    same = {"prompt": "asked at the start and at the end", "params": {"temperature": 0, "reasoning_effort": "none"}}
    records = [{"id": i, "prompt": f"question {i}"} for i in range(130)]
    records[3] = {"id": 3, **same}
    records[120] = {"id": 120, **same}
    records[121] = {"id": 121, **same}
    # Requests are taken from memory, by input position: each answer must land on its own prompt.
    records[4] = {"id": 4, "prompt": "refused [[sim:400]]"}
    records[77] = {"id": 77, "prompt": "refused too [[sim:400]]"}
    path = write_prompts(tmp_path / "p.jsonl", records)
    events: list[tuple[str, int]] = []
    add_prompts, chat = storage.add_prompts, LLMClient.chat

    async def recording(*args: object, **kwargs: object) -> int:
        stored = await add_prompts(*args, **kwargs)  # type: ignore[arg-type]
        events.append(("stored", stored))
        return stored

    async def sending(self: LLMClient, *args: object, **kwargs: object) -> object:
        events.append(("request", 1))
        return await chat(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(storage, "add_prompts", recording)
    monkeypatch.setattr(LLMClient, "chat", sending)
    sim.configure(latency=0.05)

    # 4 at once, chunks of 10: the first 10 prompts (a chunk for its one lane) are stored, then 120 in slices.
    summary = to_json(await realtime_dispatch(prompts=str(path), base_url=sim.base_url, database_url=db_url,
                                              concurrency=4, chunk_size=10, fail_above=1.0))

    assert summary["counts"] == {"succeeded": 128, "failed": 2}
    assert rows(db_url, "SELECT custom_id FROM prompts WHERE status = 'failed' ORDER BY position") == [("4",), ("77",)]
    assert sorted(set(successes_per_prompt(db_url).values())) == [0, 1]
    assert sim.stats()["requests_total"] == 128  # the three identical prompts made one request
    assert dict(rows(db_url, "SELECT route, COUNT(*) FROM results GROUP BY route")) == {"realtime": 128, "reused": 2}
    slices = [n for kind, n in events if kind == "stored"]
    assert slices == [10, 10, 20, 40, 50]
    stored_at = [i for i, (kind, _) in enumerate(events) if kind == "stored"]
    assert events.index(("request", 1)) < stored_at[1]  # sending began before the rest was stored
    assert rows(db_url, "SELECT status FROM jobs") == [("finished",)]


@flow(name="test-cut-off-recording")
async def cut_off_recording(source: str | list[dict[str, Any]], database_url: str, head: int) -> str:
    """What a realtime-dispatch run leaves when it dies once the first ``head`` prompts are stored."""
    engine = storage.create_engine(database_url)
    try:
        await storage.migrate(engine)
        job = await record_prompts(source=source, job_id=None, settings=Settings(database_url=database_url),
                                   sessions=storage.session_factory(engine), head=head)
    finally:
        await engine.dispose()
    return job.job_id


async def test_recording_cut_off_is_finished_by_the_next_run(prefect_api: str, sim: Sim, db_url: str, tmp_path: Path) -> None:
    """A run killed after storing its first prompts left the job 'recording': the next run of the
    same input (or of the job id, from its input file) stores the rest and sends each prompt once."""
    from llm_dispatch.core import ConfigError

    path = write_prompts(tmp_path / "p.jsonl", [{"id": i, "prompt": f"question {i}"} for i in range(30)])
    job_id = await cut_off_recording(source=str(path), database_url=db_url, head=8)
    assert rows(db_url, "SELECT status, (SELECT COUNT(*) FROM prompts) FROM jobs") == [("recording", 8)]

    # By job id, the input file must still read as the same prompts.
    changed = tmp_path / "p.jsonl.orig"
    path.rename(changed)
    write_prompts(path, [{"id": i, "prompt": f"question {i}"} for i in range(31)])
    with pytest.raises(ConfigError, match="no longer reads as the same prompts"):
        await realtime_dispatch(job_id=job_id, base_url=sim.base_url, database_url=db_url)
    changed.replace(path)
    assert sim.stats()["requests_total"] == 0

    summary = to_json(await realtime_dispatch(job_id=job_id, base_url=sim.base_url, database_url=db_url))

    assert summary["resumed"] and summary["counts"] == {"succeeded": 30}
    assert set(successes_per_prompt(db_url).values()) == {1}
    assert sim.stats()["requests_total"] == 30
    assert rows(db_url, "SELECT status FROM jobs") == [("finished",)]

    # The same input again: nothing left to record or send.
    again = to_json(await realtime_dispatch(prompts=str(path), base_url=sim.base_url, database_url=db_url))
    assert again["job_id"] == job_id and sim.stats()["requests_total"] == 30


async def test_recording_failing_midway_keeps_every_answer_already_paid(
    prefect_api: str, sim: Sim, db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Storing a slice fails while requests are in flight: they land and are kept, the run then
    fails saying why, and the next run stores the rest and sends only what has no answer."""
    from sqlalchemy.exc import OperationalError

    path = write_prompts(tmp_path / "p.jsonl", [{"id": i, "prompt": f"question {i}"} for i in range(60)])
    add_prompts = storage.add_prompts
    calls = 0

    async def disk_full(*args: object, **kwargs: object) -> int:
        nonlocal calls
        calls += 1
        if calls == 3:  # the head, the first slice, then this
            raise OperationalError("INSERT INTO prompts", {}, Exception("database or disk is full"))
        return await add_prompts(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(storage, "add_prompts", disk_full)
    sim.configure(latency=0.1)
    with pytest.raises(OperationalError, match="disk is full"):
        await realtime_dispatch(prompts=str(path), base_url=sim.base_url, database_url=db_url, concurrency=4, chunk_size=10)

    sent = sim.stats()["requests_total"]
    assert sent >= 10
    assert rows(db_url, "SELECT status, COUNT(*) FROM prompts GROUP BY status") == [("succeeded", sent)]
    assert rows(db_url, "SELECT status FROM jobs") == [("recording",)]

    monkeypatch.setattr(storage, "add_prompts", add_prompts)
    summary = to_json(await realtime_dispatch(prompts=str(path), base_url=sim.base_url, database_url=db_url))
    assert summary["resumed"] and summary["counts"] == {"succeeded": 60}
    assert set(successes_per_prompt(db_url).values()) == {1}
    assert sim.stats()["requests_total"] == 60


async def test_recording_cut_off_without_its_file_says_how_to_go_on(prefect_api: str, sim: Sim, db_url: str) -> None:
    from llm_dispatch.core import ConfigError

    prompts = [{"id": i, "prompt": f"question {i}"} for i in range(12)]
    job_id = await cut_off_recording(source=prompts, database_url=db_url, head=5)
    with pytest.raises(ConfigError, match="run the same prompts again as input"):
        await realtime_dispatch(job_id=job_id, base_url=sim.base_url, database_url=db_url)

    summary = to_json(await realtime_dispatch(prompts=prompts, base_url=sim.base_url, database_url=db_url))
    assert summary["job_id"] == job_id and summary["counts"] == {"succeeded": 12}
    assert set(successes_per_prompt(db_url).values()) == {1}


async def test_in_flight_bound_across_two_concurrent_flow_runs(prefect_api: str, sim: Sim, tmp_path: Path) -> None:
    """requests in flight across all runs <= tag limit x per-chunk concurrency, proven at the server."""
    from prefect.client.orchestration import get_client

    tag, tag_limit, per_chunk = "test-inflight-bound", 2, 3
    async with get_client() as client:
        await client.create_concurrency_limit(tag=tag, concurrency_limit=tag_limit)
    sim.configure(latency=0.05)
    runs = []
    for name in ("a", "b"):
        path = write_prompts(tmp_path / f"{name}.jsonl", [{"id": i, "prompt": f"{name} {i}"} for i in range(60)])
        runs.append(realtime_dispatch(
            prompts=str(path), base_url=sim.base_url, database_url=f"sqlite+aiosqlite:///{tmp_path / name}.db",
            concurrency=6, chunk_concurrency=per_chunk, chunk_size=10, concurrency_tag=tag,
        ))
    # Unbounded, each run would keep 6 in flight (two chunks of 3): 12 together.
    summaries = await asyncio.gather(*runs)

    assert [s.counts for s in summaries] == [{"succeeded": 60}, {"succeeded": 60}]
    peak = sim.stats()["peak_in_flight"]
    assert peak <= tag_limit * per_chunk
    assert peak >= per_chunk  # the bound was reached, not trivially satisfied


@pytest.mark.slow
def test_killed_run_resumes_without_loss_or_double_pay(prefect_api: str, sim: Sim, db_url: str, tmp_path: Path) -> None:
    path = write_prompts(tmp_path / "p.jsonl", [{"id": i, "prompt": f"question {i}"} for i in range(400)])
    sim.configure(latency=0.05)
    env = {**os.environ, "PREFECT_API_URL": prefect_api, "LLM_DISPATCH_BASE_URL": sim.base_url,
           "LLM_DISPATCH_DATABASE_URL": db_url, "LLM_DISPATCH_CONCURRENCY": "8", "LLM_DISPATCH_CHUNK_SIZE": "50"}
    proc = subprocess.Popen([sys.executable, "-m", "llm_dispatch.cli.main", "run", str(path), "--json"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=Path(__file__).parent.parent)
    try:
        deadline = time.monotonic() + 90
        landed = 0
        while landed < 60:
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:] if proc.stderr else ""
            assert time.monotonic() < deadline, "the subprocess never got going"
            time.sleep(0.1)
            try:
                landed = rows(db_url, "SELECT COUNT(*) FROM results WHERE status='succeeded'")[0][0]
            except sqlite3.OperationalError:
                landed = 0  # tables not created yet
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()

    kept = rows(db_url, "SELECT COUNT(*) FROM results WHERE status='succeeded'")[0][0]
    assert 60 <= kept < 400, "kill the run mid-way"
    sent_before = sim.stats()["requests_total"]

    summary = to_json(asyncio.run(realtime_dispatch(prompts=str(path), base_url=sim.base_url, database_url=db_url, concurrency=8)))

    assert summary["resumed"]
    assert summary["counts"] == {"succeeded": 400}
    assert set(successes_per_prompt(db_url).values()) == {1}  # none lost, none paid twice
    assert sim.stats()["requests_total"] - sent_before == 400 - kept  # only what had no stored result


async def test_flow_on_postgres(prefect_api: str, sim: Sim, tmp_path: Path, pg_url: str) -> None:
    url = pg_url
    path = write_prompts(tmp_path / "p.jsonl", [{"id": i, "prompt": f"question {i}"} for i in range(50)]
                         + [{"id": "bad", "prompt": "[[sim:400]]"}])

    # Chunks of 10 at 4 at once: the first 10 prompts are stored, the other 41 in slices as they go out.
    summary = to_json(await realtime_dispatch(prompts=str(path), base_url=sim.base_url, database_url=url, concurrency=4,
                                              chunk_size=10, fail_above=1.0))
    again = to_json(await realtime_dispatch(prompts=str(path), base_url=sim.base_url, database_url=url, fail_above=1.0))

    assert summary["counts"] == {"succeeded": 50, "failed": 1}
    assert again["job_id"] == summary["job_id"] and sim.stats()["requests_total"] == 51
    engine = storage.create_engine(url)
    try:
        stats = await storage.result_stats(storage.session_factory(engine), job_id=summary["job_id"])
    finally:
        await engine.dispose()
    assert stats.succeeded == 50 and stats.failed_by_class == {"BadRequestError": 1}

