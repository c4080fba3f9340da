"""The command line as a user meets it: bad input or settings get one line and exit 2, nothing written."""

from __future__ import annotations

import ast
import asyncio
import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llm_dispatch import storage
from llm_dispatch.cli.main import app
from llm_dispatch.core import PriceTable
from llm_dispatch.core._types import ChatResult, dedupe_key
from conftest import Sim, rows, write_prompts


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    for name in ("OPENAI_API_KEY", "LLM_DISPATCH_API_KEY", "OPENAI_BASE_URL", "LLM_DISPATCH_BASE_URL", "LLM_DISPATCH_DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def test_malformed_file_exits_2_with_one_line_and_no_database(runner: CliRunner, in_tmp: Path) -> None:
    bad = in_tmp / "bad.jsonl"
    bad.write_text('{"prompt": "fine"}\n{"prompt": "also fine"}\n{"promt": "typo"}\n', encoding="utf-8")

    result = runner.invoke(app, ["run", str(bad), "--simulate"])

    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1
    assert "bad.jsonl:3: unknown field" in lines[0] and "promt" in lines[0]
    assert not (in_tmp / "llm_dispatch.db").exists()


def test_no_key_for_openai_says_what_to_do(runner: CliRunner, in_tmp: Path) -> None:
    prompts = in_tmp / "p.jsonl"
    prompts.write_text('{"prompt": "hi"}\n', encoding="utf-8")
    result = runner.invoke(app, ["run", str(prompts)])
    assert result.exit_code == 2
    assert "set OPENAI_API_KEY" in result.output and "--simulate" in result.output
    assert not (in_tmp / "llm_dispatch.db").exists()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["run"], "give a prompt FILE"),
        (["run", "missing.jsonl"], "missing.jsonl: no such file"),
        (["run", "x.jsonl", "--concurrency", "0"], "--concurrency: Input should be greater than or equal to 1, not 0"),
        (["run", "x.jsonl", "--retry-failed", "some"], "--retry-failed must be"),
        (["run", "x.jsonl", "--simulate", "--no-wait"], "--no-wait cannot go with --simulate: the simulator stops"),
        (["run", "x.jsonl", "--job-name", " "], "--job-name must not be empty"),
    ],
)
def test_bad_arguments(runner: CliRunner, in_tmp: Path, args: list[str], expected: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert expected in result.output


@pytest.mark.parametrize("args", [["collect"], ["cancel", "some-job"], ["status"], ["cost"], ["export", "some-job"]])
def test_commands_on_a_missing_database_say_so(runner: CliRunner, in_tmp: Path, args: list[str]) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert "no database at" in result.output and "llm-dispatch run FILE" in result.output
    assert not (in_tmp / "llm_dispatch.db").exists()


BIG_PROMPT = "Tell me about the quiet river by the old mill. " * 62_500  # 3 MB of English


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        ({"id": "neg", "prompt": "hi", "params": {"max_tokens": -5}},
         "error: bad.jsonl:2: must be an integer >= 1, got -5 (field 'params.max_tokens')"),
        ({"id": "hot", "prompt": "hi", "params": {"temperature": "hot"}},
         "error: bad.jsonl:2: must be a number from 0 to 2, got \"hot\" (field 'params.temperature')"),
        ({"id": "big", "prompt": BIG_PROMPT, "model": "gpt-4o"},
         "tokens (estimated), more than gpt-4o's context window of 128,000; shorten it or send it to a model with a "
         "larger window (field 'prompt')"),
    ],
    ids=["max_tokens -5", "temperature hot", "3 MB prompt to gpt-4o"],
)
def test_a_bad_parameter_or_an_oversized_prompt_is_one_line_exit_2_nothing_written_or_sent(
    runner: CliRunner, in_tmp: Path, monkeypatch: pytest.MonkeyPatch, sim: Sim, record: dict, expected: str
) -> None:
    monkeypatch.setenv("LLM_DISPATCH_BASE_URL", sim.base_url)
    monkeypatch.setenv("LLM_DISPATCH_API_KEY", "sk-test")
    bad = in_tmp / "bad.jsonl"
    bad.write_text(json.dumps({"id": "ok", "prompt": "fine"}) + "\n" + json.dumps(record) + "\n", encoding="utf-8")

    result = runner.invoke(app, ["run", "bad.jsonl", "--no-wait"])

    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and expected in lines[0] and lines[0].startswith("error: bad.jsonl:2: ")
    assert sorted(p.name for p in in_tmp.iterdir()) == ["bad.jsonl"]  # no database, no batch files
    stats = sim.stats()
    assert (stats["requests_total"], stats["batches"]) == (0, 0)


def test_export_json_is_one_array_of_the_rows(runner: CliRunner, in_tmp: Path) -> None:
    url = f"sqlite+aiosqlite:///{in_tmp / 'results.db'}"
    job_id = asyncio.run(_answered_job(url))

    as_json = runner.invoke(app, ["export", job_id, "--json", "--database-url", url])
    as_jsonl = runner.invoke(app, ["export", job_id, "--database-url", url])

    assert as_json.exit_code == 0 and as_jsonl.exit_code == 0
    rows = json.loads(as_json.output)
    assert rows == [json.loads(line) for line in as_jsonl.output.splitlines()]
    assert [(r["id"], r["prompt"], r["status"], r["answer"], r["completion_tokens"]) for r in rows] == [
        ("q-1", "Capital of Australia?", "succeeded", "Canberra", 3), ("q-2", "Define entropy.", "pending", None, None)]
    assert [r["source"] for r in rows] == ["quiz", None]  # a metadata key is a column of its own
    # 12 x 0.15 + 3 x 0.60 per 1M tokens, as stored when answered.
    assert rows[0]["cost_usd"] == 3.6e-06

    written = runner.invoke(app, ["export", job_id, "--json", "-o", "out.json", "--database-url", url])
    assert written.exit_code == 0 and "wrote 2 rows to out.json" in written.output
    assert json.loads((in_tmp / "out.json").read_text(encoding="utf-8")) == rows
    both = runner.invoke(app, ["export", job_id, "--json", "--format", "csv", "--database-url", url])
    assert both.exit_code == 2 and "give --json or --format, not both" in both.output


def test_export_for_scoring_chosen_fields_and_metadata_columns(runner: CliRunner, in_tmp: Path) -> None:
    url = f"sqlite+aiosqlite:///{in_tmp / 'results.db'}"
    conversation = [{"role": "system", "content": "Answer in one word."},
                    {"role": "user", "content": [{"type": "text", "text": "Capital of"}, {"type": "text", "text": "Peru?"}]}]
    job_id = asyncio.run(_answered_job(url, metadata=[{"label": "Canberra", "id": "row-7", "status": "gold"},
                                                      {"label": "Lima", "difficulty": 2}],
                                       second=conversation))
    default = [json.loads(line) for line in runner.invoke(app, ["export", job_id[:8], "--database-url", url]).output.splitlines()]
    assert list(default[0]) == ["id", "prompt", "messages", "answer", "status", "error", "model", "prompt_tokens",
                                "completion_tokens", "cost_usd", "latency_ms", "label", "metadata.id",
                                "metadata.status", "difficulty"]
    assert default[1]["prompt"] == "Capital of\nPeru?" and default[1]["messages"] == conversation
    assert (default[0]["metadata.id"], default[1]["difficulty"], default[1]["label"]) == ("row-7", 2, "Lima")

    chosen = runner.invoke(app, ["export", job_id, "--format", "csv", "--fields", "id, answer,label,metadata.status",
                                 "-o", "scores.csv", "--database-url", url])
    assert chosen.exit_code == 0, chosen.output
    with (in_tmp / "scores.csv").open(encoding="utf-8", newline="") as handle:
        assert list(csv.reader(handle)) == [["id", "answer", "label", "metadata.status"],
                                            ["q-1", "Canberra", "Canberra", "gold"], ["q-2", "", "Lima", ""]]

    unknown = runner.invoke(app, ["export", job_id, "--fields", "id,score", "-o", "bad.csv", "--database-url", url])
    assert unknown.exit_code == 2 and not (in_tmp / "bad.csv").exists()
    assert unknown.output.startswith("error: --fields: no field 'score'; fields: id, prompt, messages, answer")
    assert "this job's metadata keys: label, id, status, difficulty" in unknown.output


def test_export_all_fields_reads_each_column_from_what_is_stored(runner: CliRunner, in_tmp: Path) -> None:
    url = f"sqlite+aiosqlite:///{in_tmp / 'results.db'}"
    job_id = asyncio.run(_answered_job(url))

    result = runner.invoke(app, ["export", job_id, "--fields", "all", "--json", "--database-url", url])

    assert result.exit_code == 0, result.output
    answered, pending = json.loads(result.output)
    assert answered["cost_usd"] == answered["prompt_cost_usd"] > 0
    assert answered == {
        "id": "q-1", "prompt": "Capital of Australia?", "messages": [{"role": "user", "content": "Capital of Australia?"}],
        "answer": "Canberra", "status": "succeeded", "error": None, "error_class": None, "model": "gpt-4o-mini",
        "prompt_tokens": 12, "completion_tokens": 3, "cached_tokens": 0, "cache_creation_tokens": None,
        "cache_creation_extended_tokens": None, "reasoning_tokens": None, "service_tier": None,
        "cost_usd": answered["cost_usd"], "latency_ms": 100.0, "maybe_billed": 1, "raw_body": None,
        "finish_reason": "stop", "truncated": False, "tool_calls": None, "refusal": None, "route": "realtime",
        "planned_route": "realtime", "route_reason": "test", "discount": "0",
        "prices_as_of": PriceTable.load().prices_as_of, "cost_basis": "answer", "position": 0,
        "prompt_id": answered["prompt_id"], "parsed": None, "violation": None, "reasks": 0,
        "prompt_cost_usd": answered["cost_usd"], "embedding": None, "source": "quiz"}
    # Not answered yet: what its prompt says, and nothing of an answer.
    assert {key for key, value in pending.items() if value is not None} == {
        "id", "prompt", "messages", "status", "model", "planned_route", "route_reason", "position", "prompt_id"}


def test_export_text_is_what_json_and_csv_write_of_each_row(runner: CliRunner, in_tmp: Path) -> None:
    # Columns of mixed types, NaN, non-ASCII text, braces and quotes in keys and values, numbers too big for 64 bits:
    # each line is what json.dumps writes of its row, and each cell what the csv module writes of it.
    url = f"sqlite+aiosqlite:///{in_tmp / 'results.db'}"
    first = {"note": 'naïve "quoted" {braces}', "{key}": 1, "score": 0.5, "flag": True, "big": 2**70,
             "tags": ["a", {"b": None}]}
    second = {"note": None, "{key}": "one", "score": float("nan"), "flag": None, "big": 3, "tags": None}
    job_id = asyncio.run(_answered_job(url, metadata=[first, second]))

    jsonl = runner.invoke(app, ["export", job_id, "--fields", "all", "--database-url", url])
    as_json = runner.invoke(app, ["export", job_id, "--fields", "all", "--json", "--database-url", url])
    table = runner.invoke(app, ["export", job_id, "--fields", "all", "--format", "csv", "--database-url", url])

    assert jsonl.exit_code == as_json.exit_code == table.exit_code == 0, jsonl.output + as_json.output + table.output
    lines = jsonl.output.splitlines()
    rows = [json.loads(line) for line in lines]
    assert lines == [json.dumps(row, ensure_ascii=False) for row in rows]
    assert as_json.output == "[\n" + ",\n".join(lines) + "\n]\n"
    assert [{key: row[key] for key in first} for row in rows[:1]] == [first]
    assert rows[1]["score"] != rows[1]["score"] and '"score": NaN' in lines[1] and '"big": 3' in lines[1]
    expected = io.StringIO()
    csv.writer(expected, lineterminator="\n").writerows([list(rows[0]), *([json.dumps(value, ensure_ascii=False)
                                                                      if isinstance(value, (dict, list)) else value
                                                                      for value in row.values()] for row in rows)])
    assert table.output == expected.getvalue()


async def _answered_job(url: str, *, metadata: list[dict | None] | None = None,
                        second: list[dict] | None = None) -> str:
    """A job of two prompts in ``url``, the first answered (``second``: the messages of the second)."""
    engine = storage.create_engine(url)
    await storage.migrate(engine)
    sessions = storage.session_factory(engine)
    try:
        job_id = await storage.create_job(sessions, name="t", fingerprint="e" * 64, input_path=None,
                                          model="gpt-4o-mini", settings={})
        prompts = []
        metadata = metadata or [{"source": "quiz"}, None]
        asked = [[{"role": "user", "content": "Capital of Australia?"}],
                 second or [{"role": "user", "content": "Define entropy."}]]
        for i, messages in enumerate(asked):
            prompts.append(storage.NewPrompt(
                custom_id=f"q-{i + 1}", position=i, model="gpt-4o-mini", messages=messages, params={},
                metadata=metadata[i],
                dedupe_key=dedupe_key(model="gpt-4o-mini", messages=messages, params={}),
                planned_route="realtime", route_reason="test"))
        await storage.add_prompts(sessions, job_id=job_id, prompts=prompts)
        first = (await storage.unfinished_prompt_ids(sessions, job_id=job_id))[0]
        async with storage.ResultWriter(sessions, job_id=job_id, prices=PriceTable.load()) as writer:
            await writer.success(prompt_ids=[first], model="gpt-4o-mini", result=ChatResult(
                text="Canberra", finish_reason="stop", prompt_tokens=12, completion_tokens=3, cached_tokens=0,
                model="gpt-4o-mini-2024-07-18", response_id="r-1", latency_s=0.1, attempts=1))
        return job_id
    finally:
        await engine.dispose()


READ_ONLY_COMMANDS = [["status"], ["status", "{job}"], ["cost"], ["export", "{job}"], ["reprice", "--tier", "flex"],
                      ["models"]]


def _loaded(command: list[str], tmp_path: Path, *, listed: str) -> list[str]:
    """What ``llm-dispatch COMMAND`` (``{job}``: an answered job's id) has loaded once it is done, in a fresh
    interpreter, as a user's command is (this test process has imported everything long since): ``listed``, an
    expression over ``sys.modules``, printed."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'results.db'}"
    job_id = asyncio.run(_answered_job(url))
    argv = [part.format(job=job_id) for part in command] + (["--database-url", url] if command != ["models"] else [])
    script = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from llm_dispatch.cli import app\n"
        f"result = CliRunner().invoke(app, {argv!r})\n"
        "assert result.exit_code == 0, result.output\n"
        f"print({listed})\n"
    )
    ran = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PREFECT_API_URL": ""})
    assert ran.returncode == 0, ran.stderr[-2000:]
    return ast.literal_eval(ran.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("command", READ_ONLY_COMMANDS, ids=lambda c: " ".join(c))
def test_a_read_only_command_loads_neither_prefect_nor_the_send_path(command: list[str], tmp_path: Path) -> None:
    assert _loaded(command, tmp_path, listed="sorted({name.split('.')[0] for name in sys.modules} & {'prefect', "
                                             "'httpx', 'aiohttp', 'jsonschema', 'alembic'})") == []


# What ``status JOB`` and ``cost JOB`` never need: the cache planner and the wire it plans for (and its model rules),
# the export's writers, the run's progress bar, the server command's HTTP client. Each is import time a user waits for.
NOT_FOR_A_REPORT = ("llm_dispatch.jobs._cache_plan", "llm_dispatch.core.caching._plan", "llm_dispatch.core.caching._explicit",
                    "llm_dispatch.core.wire._gemini", "llm_dispatch.core.rules._model_rules", "llm_dispatch.jobs._export",
                    "rich.progress", "urllib.request")


@pytest.mark.parametrize("command", [["status", "{job}"], ["cost", "{job}"]], ids=lambda c: c[0])
def test_status_and_cost_load_only_what_they_show(command: list[str], tmp_path: Path) -> None:
    assert _loaded(command, tmp_path, listed=f"sorted(m for m in {NOT_FOR_A_REPORT!r} if m in sys.modules)") == []


def test_a_database_at_an_older_revision_is_upgraded_by_status_and_refused_by_reprice(
    runner: CliRunner, tmp_path: Path
) -> None:
    from alembic import command
    from sqlalchemy import text

    from llm_dispatch.storage._migrate import _config

    url = f"sqlite+aiosqlite:///{tmp_path / 'results.db'}"
    job_id = asyncio.run(_answered_job(url))

    async def downgrade_one() -> list[str]:
        # The database as the release before the newest migration left it.
        def down(connection: object) -> None:
            config = _config()
            config.attributes["connection"] = connection
            command.downgrade(config, "-1")

        engine = storage.create_engine(url)
        try:
            async with engine.begin() as connection:
                await connection.run_sync(down)
                return list((await connection.execute(text("SELECT version_num FROM alembic_version"))).scalars())
        finally:
            await engine.dispose()

    async def revision() -> list[str]:
        engine = storage.create_engine(url)
        try:
            async with engine.connect() as connection:
                return list((await connection.execute(text("SELECT version_num FROM alembic_version"))).scalars())
        finally:
            await engine.dispose()

    head = asyncio.run(revision())
    older = asyncio.run(downgrade_one())
    assert older != head

    refused = runner.invoke(app, ["reprice", job_id, "--tier", "flex", "--database-url", url])
    assert refused.exit_code == 2
    assert "this database's schema is older than this llm-dispatch: run `llm-dispatch cost` once" in refused.output
    assert asyncio.run(revision()) == older  # reprice changes nothing

    shown = runner.invoke(app, ["status", job_id, "--database-url", url, "--json"])
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.output)["counts"] == {"succeeded": 1, "pending": 1}
    assert asyncio.run(revision()) == head


# Modules `llm-dispatch run` does not need: Alembic (only to upgrade an older database), the structured-answer
# validator (no prompt has a schema), pyarrow (export), the simulator (no --simulate), the modules of the flows a run
# does not run (each builds its flows' parameter schemas as it is imported).
NOT_FOR_A_RUN = ["alembic", "jsonschema_rs", "llm_dispatch.simulator", "pyarrow", "llm_dispatch.flows.batch",
                 "llm_dispatch.flows.realtime"]


@pytest.mark.prefect
def test_a_run_loads_no_alembic_validator_export_or_simulator(
    cli_env: dict[str, str], db_url: str, tmp_path: Path
) -> None:
    write_prompts(tmp_path / "p.jsonl", [{"id": f"q{i}", "prompt": f"question {i}"} for i in range(3)])
    # A fresh interpreter for each run, as a user's command is: this test process has imported everything long since.
    script = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from llm_dispatch.cli import app\n"
        "result = CliRunner().invoke(app, ['run', 'p.jsonl', '--new-job', '--json'])\n"
        "assert result.exit_code == 0, result.output\n"
        f"print(sorted(m for m in {NOT_FOR_A_RUN!r} if m in sys.modules))\n"
    )
    loaded = []
    for _ in range(2):
        ran = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=180,
                             env=cli_env)
        assert ran.returncode == 0, ran.stderr[-2000:]
        loaded.append(ran.stdout.strip().splitlines()[-1])
    # The first run made the database and stamped it at head; the second found it at head.
    assert loaded == ["[]", "[]"]
    assert rows(db_url, "SELECT status, count(*) FROM prompts GROUP BY status") == [("succeeded", 6)]


def test_importing_the_dispatch_flow_builds_no_other_flow() -> None:
    # A fresh interpreter, as a user's command is; every flow built is counted as Prefect builds it.
    script = (
        "import sys\n"
        "import prefect.flows\n"
        "built = []\n"
        "init = prefect.flows.Flow.__init__\n"
        "def counting(self, *args, **kwargs):\n"
        "    init(self, *args, **kwargs)\n"
        "    built.append(self.name)\n"
        "prefect.flows.Flow.__init__ = counting\n"
        "import llm_dispatch.flows.dispatch\n"
        "print(sorted(built))\n"
        "print(sorted(m for m in sys.modules if m in ('llm_dispatch.flows.batch', 'llm_dispatch.flows.realtime')))\n"
        # The package's name is the flow (as README's `from llm_dispatch.flows import dispatch`), not its module.
        "from llm_dispatch.flows import dispatch\n"
        "print(dispatch.name)\n"
    )
    ran = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PREFECT_API_URL": ""})
    assert ran.returncode == 0, ran.stderr[-2000:]
    built, modules, name = ran.stdout.strip().splitlines()[-3:]
    assert built == "['dispatch', 'dispatch-directory']"
    assert modules == "[]"
    assert name == "dispatch"


@pytest.mark.prefect
@pytest.mark.parametrize("keep", [10_000, 2], ids=["small file", "larger than memory keeps"])
def test_a_run_reads_its_file_once_small_or_larger_than_memory_keeps(
    prefect_api: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keep: int
) -> None:
    from llm_dispatch.jobs import _record

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(_record, "KEEP_CHECKED", keep)
    prompts = write_prompts(tmp_path / "p.jsonl", [{"id": f"q{i}", "prompt": f"question {i}"} for i in range(3)])
    opened: list[Path] = []
    path_open = Path.open

    def counting_open(self: Path, *args: object, **kwargs: object) -> object:
        if self.name == prompts.name:
            opened.append(self)
        return path_open(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "open", counting_open)
    result = CliRunner().invoke(app, ["run", "p.jsonl", "--simulate", "--sim-latency", "0.01", "--json"])

    assert result.exit_code == 0, result.output
    # The command's check keeps the prompts (past KEEP_CHECKED in a temporary file, so memory stays flat) and the
    # job is stored from them. The flow never checks the same file again.
    assert len(opened) == 1, result.output
    # The report is a JSON document on lines of its own (Prefect's log handler may complain around it, in a second
    # command run in the same process, about the first one's closed stream).
    report, _ = json.JSONDecoder().raw_decode(result.output, result.output.index("\n{\n") + 1)
    assert report["counts"] == {"succeeded": 3}
    # The real-time half's statistics are the job's, read once at the end of the run.
    assert report["realtime"]["stats"] == report["stats"] and report["stats"]["succeeded"] == 3
