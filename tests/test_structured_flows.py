"""Structured answers through real flow runs over real sockets, both lanes: every answer checked against its
prompt's schema, the parsed value in its own JSON column, an invalid answer stored as ``invalid`` with the first
violation in words."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from pydantic import SecretStr

from llm_dispatch.core import to_json

from conftest import Sim, rows, write_prompts

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
KINDS = {"ok": ("", None), "not-json": ("[[sim:not_json]]", "the answer is not JSON"),
         "missing": ("[[sim:missing_field]]", "is a required property"),
         "wrong-type": ("[[sim:wrong_type]]", "is not of type"),
         "truncated": ("[[sim:truncated_json]]", "the answer was cut off")}


def prompts(tmp_path: Path, *, model: str = "gpt-4o-mini") -> Path:
    return write_prompts(tmp_path / "people.jsonl", [
        {"id": name, "model": model, "prompt": f"Invent a person. {marker}", "params": {"response_format": FORMAT}}
        for name, (marker, _) in KINDS.items()])


def first_answers(db_url: str) -> dict[str, tuple]:
    return {custom_id: (status, parsed, violation) for custom_id, status, parsed, violation in rows(db_url, """
        SELECT p.custom_id, r.status, r.parsed, r.violation FROM results r JOIN prompts p ON p.id = r.prompt_id
        WHERE r.reask = 0""")}


def assert_checked(db_url: str) -> None:
    answers = first_answers(db_url)
    assert set(answers) == set(KINDS)
    status, parsed, violation = answers["ok"]
    assert status == "succeeded" and violation is None and set(json.loads(parsed)) == {"name", "age"}
    for name, (_, words) in KINDS.items():
        if words is not None:
            status, parsed, violation = answers[name]
            assert status == "invalid" and parsed is None and words in violation, (name, answers[name])
    statuses = dict(rows(db_url, "SELECT custom_id, status FROM prompts"))
    assert statuses == {name: "succeeded" if name == "ok" else "invalid" for name in KINDS}


@pytest.mark.parametrize("model", ["gpt-4o-mini", "claude-sonnet-5"])
async def test_realtime_answers_are_checked_and_stored_parsed(prefect_api: str, sim: Sim, db_url: str,
                                                              tmp_path: Path, model: str) -> None:
    from llm_dispatch.flows.realtime import realtime_dispatch

    params = {"max_reasks": 0}
    if model.startswith("claude"):
        params["anthropic_base_url"] = sim.root
    await realtime_dispatch(prompts=str(prompts(tmp_path, model=model)), base_url=sim.base_url,
                            database_url=SecretStr(db_url), **params)
    assert_checked(db_url)


async def test_batch_answers_are_checked_and_stored_parsed(prefect_api: str, sim: Sim, db_url: str,
                                                           tmp_path: Path) -> None:
    from llm_dispatch.flows.dispatch import dispatch

    sim.configure(batch_processing_seconds=0.5)
    await dispatch(prompts=str(prompts(tmp_path)), base_url=sim.base_url, database_url=SecretStr(db_url),
                   route_policy="all-batch", wait=True, batch_poll_interval=0.2, max_reasks=0)
    assert_checked(db_url)
    assert rows(db_url, "SELECT DISTINCT route FROM results") == [("batch",)]


async def test_realtime_reasks_until_valid_each_its_own_paid_row(prefect_api: str, sim: Sim, db_url: str,
                                                                 tmp_path: Path) -> None:
    from llm_dispatch.flows.realtime import realtime_dispatch

    path = prompts(tmp_path)
    with path.open("a") as extra:  # the same request as "missing": answered, and asked again, once for both
        extra.write(json.dumps({"id": "missing-twin", "model": "gpt-4o-mini", "prompt": "Invent a person. "
                                "[[sim:missing_field]]", "params": {"response_format": FORMAT}}) + "\n")
    await realtime_dispatch(prompts=str(path), base_url=sim.base_url, database_url=SecretStr(db_url))
    statuses = dict(rows(db_url, "SELECT custom_id, status FROM prompts"))
    assert set(statuses.values()) == {"succeeded"}, statuses
    reasks = rows(db_url, """SELECT p.custom_id, r.route, r.status, r.cost_pico_usd, r.violation FROM results r
                             JOIN prompts p ON p.id = r.prompt_id WHERE r.reask = 1 ORDER BY p.custom_id""")
    assert [(c, route, status) for c, route, status, _, _ in reasks] == [
        ("missing", "realtime", "succeeded"), ("missing-twin", "reused", "succeeded"),
        ("not-json", "realtime", "succeeded"), ("truncated", "realtime", "succeeded"),
        ("wrong-type", "realtime", "succeeded")]
    assert all(cost > 0 for c, route, _, cost, _ in reasks if route == "realtime")
    # A prompt's cost is the sum of its rows: its first (invalid) answer and its re-ask.
    first, again = rows(db_url, """SELECT r.cost_pico_usd FROM results r JOIN prompts p ON p.id = r.prompt_id
                                   WHERE p.custom_id = 'not-json' ORDER BY r.reask""")
    assert first[0] > 0 and again[0] > 0
    # The re-ask carried the conversation, the invalid answer and the violation.
    assert sim.stats()["completions"] == 5 + 4


async def test_realtime_gives_up_after_max_reasks(prefect_api: str, sim: Sim, db_url: str, tmp_path: Path) -> None:
    from llm_dispatch.flows.realtime import realtime_dispatch

    sim.configure(invalid_json_rate=1.0)
    path = write_prompts(tmp_path / "p.jsonl", [{"id": "a", "prompt": "Invent a person.",
                                                  "params": {"response_format": FORMAT}}])
    await realtime_dispatch(prompts=str(path), base_url=sim.base_url, database_url=SecretStr(db_url), max_reasks=2)
    assert rows(db_url, "SELECT status FROM prompts") == [("invalid",)]
    assert rows(db_url, "SELECT reask, status FROM results ORDER BY reask") == [(0, "invalid"), (1, "invalid"),
                                                                                (2, "invalid")]


async def test_the_report_counts_valid_first_after_reasks_and_still_invalid(
        prefect_api: str, sim: Sim, db_url: str, tmp_path: Path, cli_env: dict[str, str]) -> None:
    from llm_dispatch.flows._artifacts import report_markdown
    from llm_dispatch.flows.dispatch import dispatch

    from conftest import cli

    path = prompts(tmp_path)
    # No answer the simulator makes can follow this schema (a name matching ^Z): invalid however often it is asked.
    impossible = json.loads(json.dumps(FORMAT))
    impossible["json_schema"]["schema"]["properties"]["name"]["pattern"] = "^Z"
    with path.open("a") as extra:
        extra.write(json.dumps({"id": "hopeless", "prompt": "Invent a person.",
                                "params": {"response_format": impossible}}) + "\n")
    finished = await dispatch(prompts=str(path), base_url=sim.base_url, database_url=SecretStr(db_url),
                              route_policy="all-realtime", max_reasks=1)
    summary = to_json(finished)
    structured = summary["structured"]
    reask_cost = sum(cost for (cost,) in rows(db_url, "SELECT cost_pico_usd FROM results WHERE reask > 0")) / 1e12
    assert (structured["valid_first"], structured["valid_after_reasks"], structured["still_invalid"],
            structured["reasks"]) == (1, 4, 1, 5)
    assert rows(db_url, "SELECT custom_id FROM prompts WHERE status = 'invalid'") == [("hopeless",)]
    assert "does not match '^Z'" in rows(db_url, "SELECT violation FROM results WHERE reask = 1 AND status = "
                                                 "'invalid'")[0][0]
    assert structured["reask_cost"] == pytest.approx(reask_cost, abs=1e-6) and reask_cost > 0
    markdown = report_markdown(finished)
    assert f"| structured: valid after re-asks | {structured['valid_after_reasks']} |" in markdown
    shown = " ".join(cli("status", summary["job_id"], env=cli_env, cwd=tmp_path).stdout.split())  # as one line
    assert "structured answers: 1 valid at first, 4 valid after re-asks, 1 still invalid; 5 re-asks cost $" in shown
    as_json = json.loads(cli("status", summary["job_id"], "--json", env=cli_env, cwd=tmp_path).stdout)
    assert as_json["structured"]["reasks"] == 5


async def test_export_writes_each_parsed_field_as_a_typed_column(prefect_api: str, sim: Sim, db_url: str,
                                                                 tmp_path: Path, cli_env: dict[str, str]) -> None:
    import pyarrow.parquet as pq

    from llm_dispatch.flows.realtime import realtime_dispatch

    from conftest import cli

    summary = to_json(await realtime_dispatch(prompts=str(prompts(tmp_path)), base_url=sim.base_url,
                                              database_url=SecretStr(db_url), max_reasks=0))
    out = tmp_path / "people.parquet"
    done = cli("export", summary["job_id"], "--format", "parquet", "--output", str(out), env=cli_env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    table = pq.read_table(out)
    assert str(table.schema.field("name").type) == "string" and str(table.schema.field("age").type) == "int64"
    assert str(table.schema.field("prompt_cost_usd").type) == "double"
    data = table.to_pylist()
    assert [row["id"] for row in data] == list(KINDS)  # input order
    ok = data[0]
    assert isinstance(ok["name"], str) and isinstance(ok["age"], int) and ok["status"] == "succeeded"
    assert ok["violation"] is None and ok["reasks"] == 0 and ok["prompt_cost_usd"] > 0
    for row in data[1:]:
        assert row["status"] == "invalid" and row["name"] is None and row["age"] is None and row["violation"]
    as_csv = cli("export", summary["job_id"], "--format", "csv", env=cli_env, cwd=tmp_path).stdout.splitlines()
    assert as_csv[0].split(",")[-5:] == ["violation", "reasks", "prompt_cost_usd", "name", "age"]


def test_parquet_without_pyarrow_is_one_line_saying_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    from llm_dispatch.core import ConfigError
    from llm_dispatch.jobs._export import parquet_modules

    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(ConfigError, match=r"^--format parquet needs pyarrow: pip install 'llm-dispatch\[parquet\]'"):
        parquet_modules()


async def test_batch_invalid_answers_go_again_together_in_a_follow_up_batch(prefect_api: str, sim: Sim, db_url: str,
                                                                            tmp_path: Path) -> None:
    from llm_dispatch.flows.dispatch import dispatch

    sim.configure(batch_processing_seconds=0.5)
    summary = to_json(await dispatch(prompts=str(prompts(tmp_path)), base_url=sim.base_url,
                                     database_url=SecretStr(db_url), route_policy="all-batch", wait=True,
                                     batch_poll_interval=0.2))
    assert dict(rows(db_url, "SELECT custom_id, status FROM prompts")) == {name: "succeeded" for name in KINDS}
    # Two batches: the prompts', then one with the four invalid answers asked again, at the batch price.
    assert rows(db_url, "SELECT request_total FROM batches ORDER BY id") == [(5,), (4,)]
    again = rows(db_url, "SELECT route, status, discount, cost_pico_usd FROM results WHERE reask = 1")
    assert len(again) == 4 and all(r == ("batch", "succeeded", "0.5", r[3]) and r[3] > 0 for r in again)
    assert summary["structured"]["valid_first"] == 1 and summary["structured"]["valid_after_reasks"] == 4
    assert summary["structured"]["reasks"] == 4


@pytest.mark.parametrize("source", ["file", "model"])
def test_a_job_schema_from_a_file_or_a_pydantic_model_checks_every_answer(cli_env: dict[str, str], sim: Sim,
                                                                          db_url: str, tmp_path: Path,
                                                                          source: str) -> None:
    from conftest import cli

    if source == "file":
        (tmp_path / "person.json").write_text(json.dumps(PERSON))
        given, env = "person.json", cli_env
    else:
        (tmp_path / "people_model.py").write_text("from pydantic import BaseModel\n"
                                                  "class Person(BaseModel):\n    name: str\n    age: int\n")
        given, env = "people_model:Person", {**cli_env, "PYTHONPATH": str(tmp_path)}
    write_prompts(tmp_path / "p.jsonl", [{"id": "a", "prompt": "Invent a person."},
                                         {"id": "b", "prompt": "Invent a person. [[sim:wrong_type]]"}])
    done = cli("run", "p.jsonl", "--schema", given, "--route", "all-realtime", "--json", env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    answers = rows(db_url, "SELECT p.custom_id, r.reask, r.status, r.parsed FROM results r JOIN prompts p "
                           "ON p.id = r.prompt_id ORDER BY p.custom_id, r.reask")
    assert [(c, n, status) for c, n, status, _ in answers] == [("a", 0, "succeeded"), ("b", 0, "invalid"),
                                                               ("b", 1, "succeeded")]
    assert all(set(json.loads(parsed)) == {"name", "age"} for _, _, status, parsed in answers if status == "succeeded")
