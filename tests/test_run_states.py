"""A run's Prefect state tells the truth: failed prompts make it Failed (unless within --fail-above, then Completed
with the count in its message), a run refused by --max-cost ends in the state named MaxCostRefused. Real Prefect
flow runs against the simulator over real sockets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import SecretStr

from conftest import Sim, cli, write_prompts
from llm_dispatch.core import BudgetExceededError, RunFailedError, to_json
from llm_dispatch.flows.dispatch import dispatch
from llm_dispatch.tasks import result_of

pytestmark = [pytest.mark.prefect]

# Eight answered, two refused by the API for good (a 400): 20% of the job fails.
PROMPTS = [{"id": i, "prompt": f"question {i}"} for i in range(8)] + [
    {"id": "bad-1", "prompt": "[[sim:400]] one"}, {"id": "bad-2", "prompt": "[[sim:400]] two"}]


async def test_a_run_with_failed_prompts_ends_failed_with_its_result(prefect_api: str, sim: Sim, db_url: str) -> None:
    state = await dispatch(prompts=PROMPTS, base_url=sim.base_url, database_url=SecretStr(db_url), wait=True,
                           return_state=True)

    assert state.is_failed() and state.name == "Failed"
    assert state.message == "prompts failed: 2 of 10 prompts failed (20.0%): BadRequestError 2"
    summary = to_json(await result_of(state))
    assert summary["counts"] == {"succeeded": 8, "failed": 2}


async def test_a_flow_awaited_itself_with_failed_prompts_raises_run_failed_with_its_summary(
    prefect_api: str, sim: Sim, db_url: str
) -> None:
    """A script that awaits the flow (no return_state) gets an error of ours that says what failed and holds what
    the run did, not Prefect's "cannot be resolved into an exception"; the summary survives being stored."""
    with pytest.raises(RunFailedError, match="2 of 10 prompts failed") as caught:
        await dispatch(prompts=PROMPTS, base_url=sim.base_url, database_url=SecretStr(db_url), wait=True)

    assert to_json(caught.value.summary)["counts"] == {"succeeded": 8, "failed": 2}
    from prefect.serializers import PickleSerializer  # how Prefect stores a run's result

    serializer = PickleSerializer()
    again = serializer.loads(serializer.dumps(caught.value))
    assert str(again) == str(caught.value) and to_json(again.summary) == to_json(caught.value.summary)


async def test_a_failed_chunk_is_logged_in_the_ui_without_a_traceback_of_nothing(
    prefect_api: str, sim: Sim, db_url: str
) -> None:
    """Prefect logs a task run that returned a Failed state with exc_info and no exception: the UI showed the line
    and then "NoneType: None". The line stays, the empty traceback goes."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.logging.handlers import APILogHandler

    state = await dispatch(prompts=PROMPTS, base_url=sim.base_url, database_url=SecretStr(db_url), wait=True,
                           return_state=True)
    await APILogHandler.aflush()  # log lines reach the API in batches
    async with get_client() as client:
        logs = await client.read_logs(log_filter=LogFilter(
            flow_run_id=LogFilterFlowRunId(any_=[state.state_details.flow_run_id])))
    [failed] = [log.message for log in logs if "Task run failed with state" in log.message]
    assert "2 of 10 prompts failed (BadRequestError 2)" in failed
    assert "NoneType: None" not in failed and "Traceback" not in failed


async def test_failures_within_fail_above_leave_the_run_completed_and_counted(
    prefect_api: str, sim: Sim, db_url: str
) -> None:
    state = await dispatch(prompts=PROMPTS, base_url=sim.base_url, database_url=SecretStr(db_url), wait=True,
                           fail_above=0.2, return_state=True)
    assert state.is_completed()
    assert state.message == "2 of 10 prompts failed (20.0%, within --fail-above 20.0%): BadRequestError 2"

    above = await dispatch(prompts=PROMPTS, base_url=sim.base_url, database_url=SecretStr(db_url), wait=True,
                           fail_above=0.1, new_job=True, return_state=True)
    assert above.is_failed() and "above --fail-above 10.0%" in above.message


async def test_a_run_refused_by_max_cost_ends_in_a_state_named_for_it(prefect_api: str, sim: Sim, db_url: str) -> None:
    state = await dispatch(prompts=PROMPTS, base_url=sim.base_url, database_url=SecretStr(db_url),
                           max_cost=0.000001, return_state=True)

    assert state.is_failed() and state.name == "MaxCostRefused" and "above --max-cost" in state.message
    with pytest.raises(BudgetExceededError, match="nothing was sent"):
        await result_of(state)
    assert sim.stats()["requests_total"] == 0


def test_the_cli_exits_0_within_fail_above_and_1_above_it(cli_env: dict[str, str], sim: Sim,
                                                          tmp_path: Path) -> None:
    path = write_prompts(tmp_path / "p.jsonl", PROMPTS)
    within = cli("run", str(path), "--fail-above", "0.25", "--json", env=cli_env, cwd=tmp_path)
    assert within.returncode == 0, within.stderr[-2000:]
    assert json.loads(within.stdout)["counts"] == {"succeeded": 8, "failed": 2}
    assert "2 of 10 prompts failed, within --fail-above 0.25: the run is Completed" in within.stderr

    above = cli("run", str(path), "--new-job", env=cli_env, cwd=tmp_path)
    assert above.returncode == 1 and "Traceback" not in above.stderr

    bad = cli("run", str(path), "--fail-above", "2", env=cli_env, cwd=tmp_path)
    assert bad.returncode == 2 and "--fail-above" in bad.stderr
