"""Files as real tools write them, through the installed ``llm-dispatch`` command in a subprocess, as a user runs it:
a file that cannot be used is one line per problem (at most 20, then one saying how many), exit 2, no traceback,
nothing written; an Excel "CSV UTF-8" file keeps its ids, and a past deadline is a warning, not a stop."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

COMMAND = str(Path(sys.executable).parent / "llm-dispatch")
# Every line a user sees for one problem: long enough for a path, a field and what to do, never a 10,000-character id.
MAX_LINE = 450


def run(cwd: Path, *args: str, timeout: float = 120, prefect_api: str | None = None) -> subprocess.CompletedProcess[str]:
    """The command as a user runs it; with ``prefect_api``, against the session's Prefect server (a run that sends
    needs one: without it each would start a temporary server of its own, 10-20 s; test_cli.py keeps that path)."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("LLM_DISPATCH_", "OPENAI_", "ANTHROPIC_"))}
    if prefect_api is not None:
        env["PREFECT_API_URL"] = prefect_api
    # Rich wraps at the terminal's width: a wide one keeps each message on its own line, as in a real terminal.
    env["COLUMNS"] = "1000"
    return subprocess.run([COMMAND, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def refused(cwd: Path, name: str, content: bytes) -> list[str]:
    """Run the file and return what the user sees, once it is known to be a clean refusal with nothing written."""
    (cwd / name).write_bytes(content)
    result = run(cwd, "run", name, "--simulate")
    seen = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert result.returncode == 2, seen
    assert "Traceback" not in result.stderr
    assert all(len(line) <= MAX_LINE for line in seen), [len(line) for line in seen]
    assert sorted(path.name for path in cwd.iterdir()) == [name]  # no database, no batch files
    return seen


def jsonl(*records: object) -> bytes:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records).encode()


@pytest.mark.parametrize(
    ("name", "content", "expected"),
    [
        ("dup.csv", b"id,prompt,id\n1,hi,2\n", "dup.csv:1: CSV header has column 'id' twice; rename or remove one"),
        ("dup.jsonl", b'{"id": "a", "prompt": "hi", "prompt": "bye"}\n',
         "dup.jsonl:1: key 'prompt' is given twice in one object; keep one"),
        ("surrogate.jsonl", b'{"id": "a", "prompt": "broken \\ud800 text"}\n',
         "surrogate.jsonl:1: holds a lone surrogate escape (\\ud800-\\udfff), which is not text; fix the string "
         "(field 'prompt')"),
        ("deep.jsonl", b'{"prompt": "x", "metadata": ' + b"[" * 5000 + b"]" * 5000 + b"}\n",
         "deep.jsonl:1: JSON nested too deep to read; flatten it"),
        ("far.jsonl", jsonl({"prompt": "x", "deadline": "2920000d"}),
         "far.jsonl:1: '2920000d' is more than 100 years away; leave the deadline out for none (field 'deadline')"),
        ("huge.jsonl", b'{"prompt": "x", "metadata": {"n": ' + b"9" * 5000 + b"}}\n", "huge.jsonl:1: invalid JSON: "),
        ("nan.jsonl", b'{"prompt": "x", "params": {"temperature": NaN}}\n', "nan.jsonl:1: invalid JSON: NaN"),
    ],
    ids=["csv header twice", "json key twice", "lone surrogate", "nested 5000 deep", "deadline 2920000d",
         "5000-digit number", "NaN"],
)
def test_a_file_a_tool_wrote_badly_is_one_line_exit_2_nothing_written(
    tmp_path: Path, name: str, content: bytes, expected: str
) -> None:
    [line] = refused(tmp_path, name, content)
    assert line.startswith(f"error: {name}:") and expected in line


def test_a_10000_character_id_makes_a_short_line(tmp_path: Path) -> None:
    long_id = "x" * 10_000
    [line] = refused(tmp_path, "ids.jsonl", jsonl({"id": long_id, "prompt": "a"}, {"id": long_id, "prompt": "b"}))
    assert line.startswith("error: ids.jsonl:2: duplicate id 'xxx") and "(first on line 1); ids must be unique" in line


def test_every_bad_line_up_to_20_is_named_at_once(tmp_path: Path) -> None:
    records: list[object] = []
    for number in range(1, 31):
        records.append({"prompt": ""} if number % 3 == 0 else {"prompt": f"fine {number}"})  # 10 bad lines
    records += ["{not json"] * 15  # and 15 more: 25 in all
    seen = refused(tmp_path, "many.jsonl", jsonl(*records))
    assert len(seen) == 21
    assert seen[0] == "error: many.jsonl:3: must be a non-empty string (field 'prompt')"
    assert all(line.startswith("error: many.jsonl:") for line in seen)  # each line says what it is
    assert [line.split(":")[2] for line in seen[1:20]] == [str(n) for n in (6, 9, 12, 15, 18, 21, 24, 27, 30,
                                                                           31, 32, 33, 34, 35, 36, 37, 38, 39, 40)]
    assert seen[-1] == "error: many.jsonl: 25 problems in all, the first 20 shown; fix them and run again"


def test_a_line_cut_short_is_named_at_its_end(tmp_path: Path) -> None:
    seen = refused(tmp_path, "cut.jsonl", b'{"id": 1, "prompt": "hi"}\n{"id":2,"prompt":\n')
    assert seen == ["error: cut.jsonl:2: invalid JSON (Expecting value at column 18)"]


def test_a_string_broken_over_two_lines_is_named_at_its_column(tmp_path: Path) -> None:
    seen = refused(tmp_path, "broken.jsonl", b'{"id": "a", "prompt": "hi"}\n{"id": "b", "prompt": "line\nbroken"}\n')
    assert seen[0] == "error: broken.jsonl:2: invalid JSON (Invalid control character at column 28)"


def test_an_excel_csv_keeps_its_ids_and_a_past_deadline_warns_and_goes_real_time(tmp_path: Path, prefect_api: str) -> None:
    # Excel's "CSV UTF-8" starts the file with a byte-order mark, which used to become part of the first column's name.
    (tmp_path / "excel.csv").write_bytes("\ufeffid,prompt,deadline\nq1,hello,2020-01-01T00:00:00Z\nq2,bye,\n"
                                         .encode("utf-8"))
    result = run(tmp_path, "run", "excel.csv", "--simulate", "--sim-latency", "0.01", "--json", prefect_api=prefect_api)
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert warnings == ["warning: excel.csv: 1 prompt has a deadline already past (the first on line 2: "
                        "'2020-01-01T00:00:00Z'); sending it real-time now"]
    summary = json.loads(result.stdout)
    assert summary["counts"] == {"succeeded": 2}
    exported = run(tmp_path, "export", summary["job_id"], "--fields", "id,route")
    rows = [json.loads(line) for line in exported.stdout.splitlines()]
    assert [(row["id"], row["route"]) for row in rows] == [("q1", "realtime"), ("q2", "realtime")]


def test_max_tokens_to_a_reasoning_model_is_answered_under_simulate(tmp_path: Path, prefect_api: str) -> None:
    # Issue 24's first row: 20 of 25 prompts to gpt-6-luna set max_tokens, which the model refuses (the simulator
    # answers that 400 as OpenAI does); llm-dispatch sends it as max_completion_tokens, so all 25 are answered.
    records = [{"id": f"p{i}", "prompt": f"Question {i}?", "model": "gpt-6-luna", "urgency": "urgent",
                **({"params": {"max_tokens": 50}} if i < 20 else {})} for i in range(25)]
    (tmp_path / "luna.jsonl").write_bytes(jsonl(*records))
    result = run(tmp_path, "run", "luna.jsonl", "--simulate", "--sim-latency", "0.01", "--json", prefect_api=prefect_api)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["counts"] == {"succeeded": 25}


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        ({"prompt": "x", "model": "gpt-6-luna", "params": {"temperature": 0.2}},
         "error: rules.jsonl:2: gpt-6-luna takes no temperature at its default reasoning_effort: set reasoning_effort "
         "to 'none' or remove temperature (field 'params.temperature')"),
        ({"prompt": "x", "model": "claude-sonnet-5-5", "params": {"max_tokens": 9, "tool_choice": "required",
                                                                   "tools": [{"type": "function", "function": {
                                                                       "name": "f", "parameters": {}}}]}},
         "error: rules.jsonl:2: claude-sonnet-5-5 refuses forced tool use"),
        ({"prompt": "x", "params": {"max_token": 9}},
         "error: rules.jsonl:2: 'max_token' is not a request parameter; did you mean 'max_tokens'? "
         "(field 'params.max_token')"),
        ({"messages": [{"role": "user", "content": "x"}, {"role": "tool", "content": "18 C"}]},
         "error: rules.jsonl:2: a tool message needs 'tool_call_id'"),
    ],
    ids=["sampling at the default effort", "forced tool use on sonnet 5.5", "misspelled parameter",
         "tool message without id"],
)
def test_a_prompt_the_provider_would_refuse_is_refused_with_the_file(
    tmp_path: Path, record: dict, expected: str
) -> None:
    [line] = refused(tmp_path, "rules.jsonl", jsonl({"prompt": "fine"}, record))
    assert line.startswith(expected)
