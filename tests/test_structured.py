"""Structured answers: a schema per prompt (``params.response_format``) or per job (``--schema FILE`` or
``module:Model``), sent as each provider takes it, a schema a provider would refuse refused with the file, and the
simulator answering JSON of the schema, valid or broken on request, over real sockets."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import respx

from llm_dispatch.core import ChatRequest, check_answer, load_schema, ConfigError
from llm_dispatch.core.wire._anthropic import anthropic_params

from conftest import FakeTime, Sim, make_client, rows

COMMAND = str(Path(sys.executable).parent / "llm-dispatch")
PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
USER = [{"role": "user", "content": "Invent a person."}]


def run_cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLM_DISPATCH_", "OPENAI_", "ANTHROPIC_"))}
    env["COLUMNS"] = "1000"
    return subprocess.run([COMMAND, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


# --- schema sources ---------------------------------------------------------------------------------------------

def test_a_json_schema_file_becomes_a_strict_response_format(tmp_path: Path) -> None:
    path = tmp_path / "person.json"
    path.write_text(json.dumps(PERSON))
    assert load_schema(str(path)) == {"type": "json_schema",
                                      "json_schema": {"name": "person", "schema": PERSON, "strict": True}}


def test_a_pydantic_model_becomes_a_closed_strict_schema(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_models.py").write_text(
        "from pydantic import BaseModel\n"
        "class Pet(BaseModel):\n    kind: str\n"
        "class Person(BaseModel):\n    name: str\n    age: int\n    pet: Pet\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    loaded = load_schema("my_models:Person")
    schema = loaded["json_schema"]["schema"]
    assert loaded["json_schema"]["name"] == "Person" and loaded["json_schema"]["strict"] is True
    assert schema["additionalProperties"] is False and schema["$defs"]["Pet"]["additionalProperties"] is False
    assert check_answer(schema, text='{"name": "Ada", "age": 36, "pet": {"kind": "cat"}}').parsed["pet"] == {"kind": "cat"}


@pytest.mark.parametrize(("content", "expected"), [
    ({"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": False},
     "strict mode needs every property required (at $: 'a')"),
    ({"type": "array", "items": {"type": "string"}}, "strict mode needs the root to be {'type': 'object'}"),
    ({"type": "object", "properties": {"a": {"type": "object", "properties": {}}}, "required": ["a"],
      "additionalProperties": False}, "strict mode needs \"additionalProperties\": false on every object (at $.a)"),
    ({"type": "nonsense"}, "json_schema.schema is not a valid JSON Schema"),
], ids=["optional property", "array root", "open nested object", "not a schema"])
def test_a_job_schema_the_provider_would_refuse_is_one_line(tmp_path: Path, content: dict, expected: str) -> None:
    (tmp_path / "schema.json").write_text(json.dumps(content))
    (tmp_path / "p.jsonl").write_text('{"prompt": "x"}\n')
    result = run_cli(tmp_path, "run", "p.jsonl", "--simulate", "--schema", "schema.json")
    assert result.returncode == 2, result.stderr
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and expected in lines[0] and lines[0].startswith("error: --schema schema.json:"), lines
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.jsonl", "schema.json"]  # nothing written


def test_a_missing_model_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "p.jsonl").write_text('{"prompt": "x"}\n')
    result = run_cli(tmp_path, "run", "p.jsonl", "--simulate", "--schema", "no_such_module:Model")
    assert result.returncode == 2
    assert "--schema no_such_module:Model: cannot import it" in result.stderr


def test_a_prompt_schema_the_provider_would_refuse_is_refused_with_its_line(tmp_path: Path) -> None:
    loose = {"type": "json_schema", "json_schema": {"name": "p", "strict": True,
                                                    "schema": {"type": "object", "properties": {"a": {}}}}}
    (tmp_path / "p.jsonl").write_text(json.dumps({"prompt": "x", "params": {"response_format": FORMAT}}) + "\n"
                                      + json.dumps({"prompt": "y", "params": {"response_format": loose}}) + "\n")
    result = run_cli(tmp_path, "run", "p.jsonl", "--simulate")
    assert result.returncode == 2
    assert ("p.jsonl:2: strict mode needs \"additionalProperties\": false on every object (at $) "
            "(field 'params.response_format')") in result.stderr


# --- sent natively ---------------------------------------------------------------------------------------------

def test_claude_gets_the_schema_as_output_config_format() -> None:
    body = anthropic_params(ChatRequest(model="claude-sonnet-5", messages=USER, params={"response_format": FORMAT}),
                            default_max_tokens=100)
    assert body["output_config"] == {"format": {"type": "json_schema", "schema": PERSON}}
    assert "tools" not in body and "response_format" not in body


def test_an_older_claude_gets_the_schema_as_a_forced_tool() -> None:
    body = anthropic_params(ChatRequest(model="claude-opus-4-1", messages=USER, params={"response_format": FORMAT}),
                            default_max_tokens=100)
    assert body["tool_choice"] == {"type": "tool", "name": "structured_answer"}
    assert body["tools"][0]["input_schema"] == PERSON and "output_config" not in body


def test_a_forced_tool_answer_is_read_as_the_answer() -> None:
    call = [{"id": "t1", "type": "function", "function": {"name": "structured_answer",
                                                          "arguments": '{"name": "Ada", "age": 3}'}}]
    assert check_answer(PERSON, text=None, tool_calls=call).parsed == {"name": "Ada", "age": 3}


# --- the simulator ---------------------------------------------------------------------------------------------

def _chat(sim: Sim, content: str, **body: object) -> dict:
    response = httpx.post(f"{sim.base_url}/chat/completions", timeout=60, json={
        "model": "gpt-4o-mini", "messages": [{"role": "user", "content": content}], "response_format": FORMAT, **body})
    return response.raise_for_status().json()


@pytest.mark.parametrize(("marker", "violation"), [
    ("", None),
    ("[[sim:not_json]]", "the answer is not JSON"),
    ("[[sim:missing_field]]", "is a required property"),
    ("[[sim:wrong_type]]", "is not of type"),
    ("[[sim:truncated_json]]", "the answer was cut off (finish_reason 'length')"),
])
def test_the_simulator_answers_json_of_the_schema_or_breaks_it_on_request(sim: Sim, marker: str,
                                                                           violation: str | None) -> None:
    choice = _chat(sim, f"Invent a person. {marker}")["choices"][0]
    checked = check_answer(PERSON, text=choice["message"]["content"], finish_reason=choice["finish_reason"])
    if violation is None:
        assert checked.valid and set(checked.parsed) == {"name", "age"}
    else:
        assert violation in checked.violation


def test_the_simulator_breaks_about_the_rate_asked(sim: Sim) -> None:
    sim.configure(invalid_json_rate=0.25)
    invalid = 0
    for n in range(200):
        choice = _chat(sim, f"Invent person {n}.")["choices"][0]
        invalid += not check_answer(PERSON, text=choice["message"]["content"],
                                    finish_reason=choice["finish_reason"]).valid
    assert 25 <= invalid <= 75


def test_the_simulator_refuses_a_schema_openai_would_refuse(sim: Sim) -> None:
    loose = {"type": "json_schema", "json_schema": {"name": "p", "strict": True, "schema": {"type": "object"}}}
    response = httpx.post(f"{sim.base_url}/chat/completions", timeout=60, json={
        "model": "gpt-4o-mini", "messages": USER, "response_format": loose})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "response_format"


def test_the_simulator_answers_claude_in_json_of_output_config(sim: Sim) -> None:
    body = anthropic_params(ChatRequest(model="claude-sonnet-5", messages=USER,
                                        params={"response_format": FORMAT, "max_tokens": 200}), default_max_tokens=200)
    response = httpx.post(f"{sim.root}/v1/messages", json=body, timeout=60, headers={
        "x-api-key": "sk-ant-test", "anthropic-version": "2023-06-01"}).raise_for_status().json()
    text = next(block["text"] for block in response["content"] if block["type"] == "text")
    assert check_answer(PERSON, text=text).valid


async def test_on_postgresql_the_parsed_value_is_jsonb_that_sql_can_query(pg_url: str) -> None:
    from sqlalchemy import text

    from llm_dispatch import storage
    from llm_dispatch.core import ChatResult, checked

    async with storage.open_database(pg_url) as sessions:
        job = await storage.create_job(sessions, name="people", fingerprint="f", model="gpt-4o-mini", settings={},
                                       input_path=None)
        job_id = getattr(job, "id", job)
        await storage.add_prompts(sessions, job_id=job_id, prompts=[storage.NewPrompt(
            custom_id="a", position=0, model="gpt-4o-mini", messages=USER, params={"response_format": FORMAT},
            metadata=None, dedupe_key="k")])
        async with sessions() as session:
            prompt_id = (await session.execute(text("SELECT id FROM prompts"))).scalar_one()
        answer = ChatResult(text='{"name": "Ada", "age": 36}', finish_reason="stop", prompt_tokens=9,
                            completion_tokens=9, cached_tokens=0, model="gpt-4o-mini", response_id="r1", latency_s=0.1)
        async with storage.ResultWriter(sessions, job_id=job_id) as writer:
            await writer.success(prompt_ids=[prompt_id], result=checked(answer, PERSON))
        async with sessions() as session:
            found = (await session.execute(text(
                "SELECT parsed->>'name', (parsed->>'age')::int, pg_typeof(parsed)::text FROM results"))).all()
    assert found == [("Ada", 36, "jsonb")]


# --- a re-ask whose call fails ---------------------------------------------------------------------------------

async def test_a_reask_whose_call_fails_is_a_row_of_its_own_and_the_prompt_keeps_its_invalid_answer(
        router: respx.Router, fake_time: FakeTime, db_url: str) -> None:
    from llm_dispatch import storage
    from llm_dispatch.core import PriceTable, WorkItem, send_all

    usage = {"prompt_tokens": 20, "completion_tokens": 9, "total_tokens": 29}
    router.post("/chat/completions", name="chat").mock(side_effect=[
        httpx.Response(200, json={"id": "a", "model": "gpt-4o-mini", "usage": usage, "choices": [
            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": '{"name": "Ada"}'}}]}),
        httpx.Response(400, json={"error": {"message": "Invalid request: too long.", "type": "invalid_request_error"}}),
    ])
    params = {"response_format": FORMAT, "max_tokens": 50}
    async with storage.open_database(db_url) as sessions:
        job_id = await storage.create_job(sessions, name="people", fingerprint="f", model="gpt-4o-mini", settings={},
                                          input_path=None)
        await storage.add_prompts(sessions, job_id=job_id, prompts=[storage.NewPrompt(
            custom_id="a", position=0, model="gpt-4o-mini", messages=USER, params=params, metadata=None,
            dedupe_key="k")])
        [prompt_id] = await storage.unfinished_prompt_ids(sessions, job_id=job_id)
        async with make_client(router, fake_time) as client, \
                storage.ResultWriter(sessions, job_id=job_id, prices=PriceTable.load()) as writer:
            outcome = await send_all(client=client, sink=writer, concurrency=1, max_reasks=2, items=[
                WorkItem(prompt_ids=(prompt_id,), request=ChatRequest(model="gpt-4o-mini", messages=USER,
                                                                     params=params))])
        [row] = [found async for found in storage.export_rows(sessions, job_id=job_id)]
        stats = await storage.structured_stats(sessions, job_id=job_id)
    assert (outcome.invalid, outcome.reasks, outcome.failed) == (1, 1, 0)
    results = rows(db_url, "SELECT reask, status, error_class, cost_pico_usd FROM results ORDER BY id")
    assert [(n, status, error) for n, status, error, _ in results] == [(0, "invalid", None),
                                                                       (1, "failed", "BadRequestError")]
    assert rows(db_url, "SELECT status FROM prompts") == [("invalid",)]
    # What the prompt shows is its invalid answer (the failed call changed nothing), its cost every row's.
    assert (row.status, row.text, row.reask) == ("invalid", '{"name": "Ada"}', 0)
    assert "'age' is a required property" in row.violation
    assert row.prompt_cost_pico_usd == sum(cost for *_, cost in results) > 0
    assert stats is not None and (stats.still_invalid, stats.reasks) == (1, 1)


# --- how an answer is judged: compiled first, jsonschema's words for what it does not pass --------------------

@pytest.mark.parametrize(("schema", "text", "valid"), [
    # A pattern for Python's re: the compiled validator reads \w and $ as ECMA 262 does, jsonschema lets them by.
    ({"type": "string", "pattern": "^\\w+$"}, '"h\u00e9llo"', True),
    ({"type": "string", "pattern": "^a$"}, '"a\\n"', True),
    ({"type": "integer"}, "1.0", True),
    ({"type": "integer"}, "100000000000000000000", True),
    ({"type": "number", "multipleOf": 0.01}, "0.07", True),  # exactly, as the draft says
    ({"type": "string", "format": "email"}, '"nope"', True),  # formats are annotations in 2020-12
    ({"type": "array", "uniqueItems": True}, "[1, 1.0]", False),
    ({"$defs": {"n": {"type": "string"}}, "$ref": "#/$defs/n"}, "3", False),
    (PERSON, '{"name": "Ada", "age": 3.5}', False),
], ids=["unicode \\w", "$ before a newline", "1.0 integer", "big integer", "multipleOf fraction", "format",
        "uniqueItems 1 and 1.0", "$ref", "a float age"])
def test_an_answer_is_judged_as_draft_2020_12_says(schema: dict, text: str, valid: bool) -> None:
    assert check_answer(schema, text=text).valid is valid


def test_an_invalid_answer_s_first_violation_is_said_in_jsonschema_s_words() -> None:
    assert check_answer(PERSON, text='{"name": 5, "age": 1}').violation == "at $.name: 5 is not of type 'string'"
    assert check_answer(PERSON, text='{"name": "Ada"}').violation == "at $: 'age' is a required property"
