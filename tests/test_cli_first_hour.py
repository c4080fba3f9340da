"""A newcomer's first hour (issue 39): the demo runs clean, a reasoning model's cramped reply cap is said before
anything is sent, a mistyped model is refused with the name it likely meant, a bad flag is blamed as the flag, and
the output ends saying where the results are and what to run next."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llm_dispatch.cli.main import app
from llm_dispatch.cli.reports import failure_line
from llm_dispatch.core import THINKING_ROOM, PriceTable, Settings, check_prompts, counted
from llm_dispatch.jobs import prompt_input

from conftest import write_prompts

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    for name in ("OPENAI_API_KEY", "LLM_DISPATCH_API_KEY", "OPENAI_BASE_URL", "LLM_DISPATCH_BASE_URL",
                 "LLM_DISPATCH_DATABASE_URL", "LLM_DISPATCH_MODEL", "LLM_DISPATCH_ALLOW_UNKNOWN_MODEL",
                 "LLM_DISPATCH_ROUTE_POLICY", "LLM_DISPATCH_MODEL_PROVIDERS"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


# ---------------------------------------------------------------------------------------- 1. room for thinking


def cramped(tmp_path: Path, params: dict, *, model: str | None = None, n: int = 20) -> tuple[str, ...]:
    path = write_prompts(tmp_path / "p.jsonl", [{"id": f"q{i}", "prompt": "Say hi", "params": params,
                                                 **({"model": model} if model else {})} for i in range(n)])
    warnings = check_prompts(path, default_model="gpt-6-luna", table=PriceTable.load(), warn=False).warnings
    return tuple(warning for warning in warnings if "thinking" in warning)


def test_a_reasoning_model_with_a_cramped_reply_cap_gets_one_warning_for_the_whole_input(tmp_path: Path) -> None:
    warnings = cramped(tmp_path, {"max_completion_tokens": 80})
    assert len(warnings) == 1
    assert warnings[0].endswith(
        "p.jsonl: 20 prompts to a reasoning model leave too little room for its thinking (the first on line 1): "
        f"their answers may be cut at max_completion_tokens; raise it to {THINKING_ROOM:,} or set reasoning_effort "
        "lower ('none' where the model takes it)")
    # max_tokens is sent as max_completion_tokens to a reasoning model: the same room.
    assert len(cramped(tmp_path, {"max_tokens": 80}, model="gpt-5.5")) == 1


@pytest.mark.parametrize("params", [
    {"max_completion_tokens": 80, "reasoning_effort": "none"},  # no thinking
    {"max_completion_tokens": THINKING_ROOM},  # room enough
    {},  # no cap: the model's own maximum
], ids=["effort none", "room enough", "no cap"])
def test_no_warning_when_thinking_has_room_or_does_not_happen(tmp_path: Path, params: dict) -> None:
    assert cramped(tmp_path, params) == ()


def test_no_warning_for_a_model_that_does_not_reason_or_defaults_to_no_reasoning(tmp_path: Path) -> None:
    assert cramped(tmp_path, {"max_tokens": 80}, model="gpt-4.1-mini") == ()
    assert cramped(tmp_path, {"max_completion_tokens": 80}, model="gpt-5.1") == ()  # defaults to none


@pytest.mark.parametrize("name", sorted(path.name for path in EXAMPLES.glob("*.jsonl")))
def test_the_examples_run_without_a_warning(name: str) -> None:
    # With the example providers file: the mixed-providers example names a provider it declares.
    settings = Settings(providers_file=str(EXAMPLES / "providers.toml"))
    assert prompt_input(EXAMPLES / name, settings=settings).check(warn=False).warnings == ()


def test_the_simulator_cuts_what_the_warning_warns_of(
    prefect_api: str, in_tmp: Path
) -> None:
    # 60 tokens: less than the shortest answer (20 tokens) and its thinking; every answer is cut.
    write_prompts(in_tmp / "p80.jsonl", [{"id": f"q{i}", "prompt": f"Say hi {i}",
                                          "params": {"max_completion_tokens": 60}} for i in range(20)])
    write_prompts(in_tmp / "roomy.jsonl", [{"id": f"q{i}", "prompt": f"Say hi {i}",
                                            "params": {"max_completion_tokens": THINKING_ROOM}} for i in range(20)])
    warned = CliRunner().invoke(app, ["run", "p80.jsonl", "--simulate", "--sim-latency", "0.01", "--route",
                                      "all-realtime"])
    assert warned.exit_code == 0, warned.output
    assert sum("too little room for its thinking" in line for line in lines(warned.output)) == 1
    assert "answers: 20 truncated" in warned.output, warned.output
    roomy = CliRunner().invoke(app, ["run", "roomy.jsonl", "--simulate", "--sim-latency", "0.01", "--route",
                                     "all-realtime"])
    assert roomy.exit_code == 0, roomy.output
    assert "too little room" not in roomy.output and "truncated" not in roomy.output


# ------------------------------------------------------------------------------------------ 3. unknown models


@pytest.mark.parametrize(("model", "hint"), [
    ("gpt-6-lun", "did you mean gpt-6-luna?"),
    ("gpt-7-turbo", "`llm-dispatch models` lists the catalog"),
])
def test_a_mistyped_model_is_refused_with_the_nearest_name_and_nothing_is_written(
    in_tmp: Path, model: str, hint: str
) -> None:
    write_prompts(in_tmp / "p.jsonl", [{"id": f"q{i}", "prompt": f"question {i}"} for i in range(3)])
    result = CliRunner().invoke(app, ["run", "p.jsonl", "--simulate", "--model", model])
    assert result.exit_code == 2, result.output
    assert lines(result.output) == [
        f"error: p.jsonl: unknown model '{model}' (3 prompts, first on line 1); {hint} (your own model: give it in "
        "--prices-file or LLM_DISPATCH_MODEL_PROVIDERS, or pass --allow-unknown-model)"]
    assert sorted(path.name for path in in_tmp.iterdir()) == ["p.jsonl"]  # no database, no batch files


def test_each_unknown_model_of_a_file_is_named_once_with_its_first_line(tmp_path: Path) -> None:
    path = write_prompts(tmp_path / "p.jsonl", [
        {"id": "a", "prompt": "x"}, {"id": "b", "prompt": "x", "model": "claude-sonet-5-5"},
        {"id": "c", "prompt": "x", "model": "claude-sonet-5-5"}, {"id": "d", "prompt": "x", "model": "gpt-4.1-mni"}])
    from llm_dispatch.core import InputError

    with pytest.raises(InputError) as refused:
        check_prompts(path, default_model="gpt-6-luna", table=PriceTable.load(), warn=False)
    assert [line.split(": ", 1)[1].split(";")[0] for line in str(refused.value).splitlines()] == [
        "unknown model 'claude-sonet-5-5' (2 prompts, first on line 2)",
        "unknown model 'gpt-4.1-mni' (1 prompt, first on line 4)"]
    assert "did you mean claude-sonnet-5-5?" in str(refused.value)


def test_a_model_the_user_declared_is_theirs_and_sent(tmp_path: Path) -> None:
    path = write_prompts(tmp_path / "p.jsonl", [{"id": "a", "prompt": "x", "model": "meta-llama/Llama-3-8B"}])
    table = PriceTable.load()
    # Mapped to a provider (an OpenAI-compatible server: vLLM), by glob: declared, nothing to warn of.
    mapped = check_prompts(path, default_model="gpt-6-luna", table=table, warn=False,
                           model_providers={"meta-llama/*": "openai"})
    assert mapped.warnings == ()
    # In the user's price file: in the catalog.
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"models": {"meta-llama/Llama-3-8B": {"input": 0, "output": 0}}}))
    assert check_prompts(path, default_model="gpt-6-luna", table=PriceTable.load(path=prices), warn=False).warnings == ()
    # A fine-tune of a catalog model is the user's by its name.
    tuned = write_prompts(tmp_path / "ft.jsonl", [{"id": "a", "prompt": "x", "model": "ft:gpt-4.1-mini:acme::x1"}])
    assert check_prompts(tuned, default_model="gpt-6-luna", table=table, warn=False).count == 1
    # Allowed: sent, with a warning that its cost is unknown.
    allowed = check_prompts(path, default_model="gpt-6-luna", table=table, warn=False, allow_unknown_model=True)
    assert len(allowed.warnings) == 1 and allowed.warnings[0].endswith(
        "p.jsonl: 1 prompt uses meta-llama/Llama-3-8B, which is not in the price catalog (first on line 1): sent as "
        "given, its cost unknown")


def test_an_allowed_unknown_model_is_sent_and_its_cost_shown_unknown_never_0(
    prefect_api: str, in_tmp: Path
) -> None:
    write_prompts(in_tmp / "p.jsonl", [{"id": f"q{i}", "prompt": f"question {i}"} for i in range(2)])
    result = CliRunner().invoke(app, ["run", "p.jsonl", "--simulate", "--sim-latency", "0.01", "--model",
                                      "house-model", "--allow-unknown-model", "--route", "all-realtime"])
    assert result.exit_code == 0, result.output
    seen = lines(result.output)
    assert "warning: p.jsonl: 2 prompts use house-model, which is not in the price catalog (first on line 1): sent " \
           "as given, its cost unknown" in seen
    realtime = next(line for line in seen if line.startswith("│ realtime"))
    total = next(line for line in seen if line.startswith("│ total"))
    for row in (realtime, total):
        cells = [cell.strip() for cell in row.strip("│").split("│")]
        assert cells[-2:] == ["unknown", "unknown"], row
    assert "$0.000000" not in realtime + total


def test_the_environment_allows_unknown_models_too(in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLM_DISPATCH_ALLOW_UNKNOWN_MODEL", "true")
    settings = Settings()
    path = write_prompts(in_tmp / "p.jsonl", [{"id": "a", "prompt": "x"}])
    checked = prompt_input(path, settings=settings.model_copy(update={"model": "gpt-6-lun"})).check(warn=False)
    assert checked.warnings and "gpt-6-lun, which is not in the price catalog" in checked.warnings[0]


# --------------------------------------------------------------- 2. where the results are; 8. the run's table


def test_the_run_ends_saying_where_the_results_are_and_what_to_run_next(prefect_api: str, in_tmp: Path) -> None:
    write_prompts(in_tmp / "p.jsonl", [{"id": f"q{i}", "prompt": f"question {i}"} for i in range(2)])
    first = CliRunner().invoke(app, ["run", "p.jsonl", "--simulate", "--sim-latency", "0.01", "--route",
                                     "all-realtime"])
    assert first.exit_code == 0, first.output
    # Prefect's own lines (the temporary server stopping) may come after it.
    closing = next(line for line in lines(first.output) if line.startswith("results in "))
    job = closing.split("llm-dispatch status ", 1)[1][:8]
    assert closing == (f"results in ./llm_dispatch.db; next: `llm-dispatch status {job}`, `llm-dispatch export {job} "
                       f"--format csv -o {job}.csv`, `llm-dispatch cost {job}`")
    assert "1 chunks" not in first.output and "2 prompts valid" in first.output
    # Run again: the job is resumed; its cost is the whole job's, its estimate this run's, and the headers say so.
    again = CliRunner().invoke(app, ["run", "p.jsonl", "--simulate", "--sim-latency", "0.01", "--route",
                                     "all-realtime"])
    assert again.exit_code == 0, again.output
    header = next(line for line in lines(again.output) if "route" in line and "prompts" in line)
    assert "cost (whole job)" in header and "estimate (this run)" in header


def test_the_database_is_shown_without_its_password() -> None:
    from llm_dispatch.cli.main import where_results_are

    assert where_results_are("postgresql+asyncpg://me:s3cret@db:5432/jobs") == "postgresql+asyncpg://me:***@db:5432/jobs"
    assert where_results_are("sqlite+aiosqlite:///llm_dispatch.db") == "./llm_dispatch.db"
    assert where_results_are("sqlite+aiosqlite:////data/runs.db") == "/data/runs.db"


def test_a_failure_is_one_line_its_kind_status_and_the_providers_words_cut_short() -> None:
    body = json.dumps({"error": {"message": "Invalid value for 'temperature': " + "x" * 300, "type": "invalid"}})
    stored = f"HTTP 400 from POST /v1/chat/completions after 1 attempt: {body}. Request id req_1. Fix the prompt."
    line = failure_line("BadRequestError", stored)
    assert line.startswith("BadRequestError (HTTP 400): Invalid value for 'temperature': xxx")
    assert line.endswith("...") and "\n" not in line and len(line) < 110
    assert failure_line("APITimeoutError", "No response to POST /v1/chat/completions after 3 attempts (timed out).") \
        == "APITimeoutError: No response to POST /v1/chat/completions after 3 attempts (timed out)."


# ------------------------------------------------------------------------------------- 4. what the user typed


def test_a_bad_flag_is_blamed_as_the_flag_and_the_environment_as_its_variable(
    in_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_prompts(in_tmp / "p.jsonl", [{"id": "a", "prompt": "x"}])
    route = CliRunner().invoke(app, ["run", "p.jsonl", "--simulate", "--route", "fast"])
    assert (route.exit_code, lines(route.output)) == (2, [
        "error: --route: Input should be 'length', 'all-realtime' or 'all-batch', not 'fast'"])
    url = CliRunner().invoke(app, ["run", "p.jsonl", "--simulate", "--database-url", "foo://bar"])
    assert url.exit_code == 2 and lines(url.output)[0].startswith("error: Unsupported database 'foo' in --database-url;")
    monkeypatch.setenv("LLM_DISPATCH_ROUTE_POLICY", "fast")
    env = CliRunner().invoke(app, ["run", "p.jsonl", "--simulate"])
    assert env.exit_code == 2 and "(env LLM_DISPATCH_ROUTE_POLICY)" in env.output and "--route" not in env.output
    assert sorted(path.name for path in in_tmp.iterdir()) == ["p.jsonl"]


def test_counts_agree_with_their_nouns() -> None:
    assert [counted(1, "chunk"), counted(2, "chunk"), counted(1, "batch", many="batches"),
            counted(1_000, "batch", many="batches"), counted(0, "prompt")] == [
        "1 chunk", "2 chunks", "1 batch", "1,000 batches", "0 prompts"]


# ---------------------------------------------------------------------------------------------- 9. from Python


def test_a_summary_prints_as_a_short_line_without_the_price_catalog(prefect_api: str, db_url: str) -> None:
    import re

    from llm_dispatch.cli import run_prompts

    found = run_prompts(prompts=["one question", "another question"], simulate=True, sim_latency=0.01,
                        route="all-realtime", database_url=db_url)
    shown = str(found.summary)
    assert shown == repr(found.summary)
    assert re.fullmatch(rf"<DispatchSummary job {found.job_id[:8]} \(prompts\): 2 prompts, 2 succeeded, 0 refused, "
                        r"0 failed, 0 unfinished; cost \$0\.\d{6}, estimate \$0\.\d{6}; \d+\.\d s>", shown), shown
    # The report's own repr (its costs) leaves the catalog out too.
    assert "PriceTable" not in repr(found.summary.report) and len(repr(found.summary.report)) < 5_000


def test_run_prompts_blames_its_keyword_not_the_environment(db_url: str) -> None:
    from llm_dispatch.cli import run_prompts
    from llm_dispatch.core import ConfigError

    with pytest.raises(ConfigError, match=r"^route: Input should be 'length', 'all-realtime' or 'all-batch', not 'fast'$"):
        run_prompts(prompts=["x"], simulate=True, route="fast", database_url=db_url)  # type: ignore[arg-type]


def test_a_failed_batch_line_is_said_in_the_providers_words_not_our_member_names(prefect_api: str, in_tmp: Path) -> None:
    write_prompts(in_tmp / "b.jsonl", [{"id": "kept", "prompt": "fine", "urgency": "bulk", "model": "gpt-4o-mini"},
                                       {"id": "lost", "prompt": "[x] lost [[sim:line_error]]", "urgency": "bulk",
                                        "model": "gpt-4o-mini"}])
    ran = CliRunner().invoke(app, ["run", "b.jsonl", "--simulate", "--sim-latency", "0.01", "--wait"])
    assert ran.exit_code == 1, ran.output  # a prompt failed
    said = next(line for line in lines(ran.output) if line.startswith("BatchLineError"))
    assert said.startswith("BatchLineError: its batch line failed: This request was stopped inside the batch")
    assert " p1" not in said and " p2" not in said  # no member id of ours
