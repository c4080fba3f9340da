"""Expected failures through the real command, in a process of its own: one line and an exit code, never a traceback
(unless ``--debug``). The cases a nightly user met as pages of traceback (issue 29, item 5)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import uuid
from pathlib import Path

import pytest

from conftest import PG_SKIP_REASON, PG_URL_ENV, cli, write_prompts

pytestmark = [pytest.mark.prefect]



def only_line(done: subprocess.CompletedProcess[str], *, code: int, says: str) -> str:
    """The command exited ``code`` with one error line saying ``says``, and no traceback or Prefect error log."""
    lines = (done.stdout + done.stderr).splitlines()
    assert done.returncode == code, done.stderr[-3000:]
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1 and says in errors[0], lines
    noise = [line for line in lines if "Traceback" in line or line.lstrip().startswith(("File \"", "│", "╭"))
             or "| ERROR" in line]
    assert noise == [], "\n".join(lines)
    return errors[0]


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def prompts(tmp_path: Path) -> Path:
    return write_prompts(tmp_path / "p.jsonl", [{"id": i, "prompt": f"question {i}"} for i in range(20)])


def test_max_cost_refused_is_one_line_exit_2(cli_env: dict[str, str], prompts: Path, tmp_path: Path) -> None:
    done = cli("run", str(prompts), "--max-cost", "0.0000001", env={**cli_env, "LLM_DISPATCH_API_KEY": "sk-test"},
               cwd=tmp_path)
    only_line(done, code=2, says="is above --max-cost $1e-07; nothing was sent")


def test_a_bare_path_as_database_url_is_one_line_exit_2_before_anything_starts(
    cli_env: dict[str, str], prompts: Path, tmp_path: Path
) -> None:
    done = cli("run", str(prompts), "--database-url", "results.db", env=cli_env, cwd=tmp_path)
    line = only_line(done, code=2, says="'results.db' is a path, not a database URL")
    assert "sqlite+aiosqlite:///results.db" in line
    assert len((done.stdout + done.stderr).splitlines()) == 1  # no flow started: the check comes first
    assert sorted(path.name for path in tmp_path.iterdir()) == ["p.jsonl"]


@pytest.mark.skipif(not os.environ.get(PG_URL_ENV), reason=PG_SKIP_REASON)
def test_a_missing_postgres_database_is_one_line_exit_2(cli_env: dict[str, str], prompts: Path, tmp_path: Path) -> None:
    missing = os.environ[PG_URL_ENV].rsplit("/", 1)[0] + f"/llmd_missing_{uuid.uuid4().hex[:12]}"
    done = cli("run", str(prompts), "--database-url", missing, env={**cli_env, "LLM_DISPATCH_API_KEY": "sk-test"},
               cwd=tmp_path)
    only_line(done, code=2, says="does not exist; check --database-url")


@pytest.fixture
def open_batch_job(cli_env: dict[str, str], prompts: Path, tmp_path: Path) -> str:
    """A job whose batch is open at the provider, submitted by a run that did not wait; its id."""
    cli_env["LLM_DISPATCH_API_KEY"] = "sk-test"
    done = cli("run", str(prompts), "--route", "all-batch", "--no-wait", "--json", env=cli_env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["counts"] == {"batched": 20}
    return str(summary["job_id"])


@pytest.mark.parametrize("command", ["collect", "cancel"])
def test_a_network_error_in_collect_or_cancel_is_one_line_exit_3(
    cli_env: dict[str, str], open_batch_job: str, tmp_path: Path, command: str
) -> None:
    unreachable = {**cli_env, "LLM_DISPATCH_BASE_URL": f"http://127.0.0.1:{closed_port()}/v1",
                   "LLM_DISPATCH_MAX_RETRIES": "0"}
    args = [command] if command == "collect" else [command, open_batch_job, "--wait-seconds", "0"]
    done = cli(*args, env=unreachable, cwd=tmp_path)
    only_line(done, code=3, says="Could not get an answer from http://127.0.0.1:")


def test_debug_shows_the_traceback(cli_env: dict[str, str], prompts: Path, tmp_path: Path) -> None:
    done = cli("--debug", "run", str(prompts), "--database-url", "results.db", env=cli_env, cwd=tmp_path)
    assert done.returncode == 1
    assert "Traceback" in done.stderr and "DatabaseError" in done.stderr
