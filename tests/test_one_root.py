"""One import root: the built wheel installs ``llm_dispatch`` alone, and a Prefect project with packages of its own
named ``flows`` and ``tasks`` runs llm-dispatch's main job from its own directory, importing both."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent


@pytest.mark.slow
def test_the_wheel_has_one_top_level_package(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = tmp_path.glob("llm_dispatch-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (top_level,) = [name for name in names if name.endswith(".dist-info/top_level.txt")]
        assert archive.read(top_level).decode().split() == ["llm_dispatch"]
    packaged = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert packaged == {"llm_dispatch"}
    # The layers, the bundled prices and the migrations travel inside it.
    for needed in ("llm_dispatch/flows/dispatch.py", "llm_dispatch/tasks/__init__.py", "llm_dispatch/core/prices.json",
                   "llm_dispatch/storage/alembic.ini", "llm_dispatch/storage/migrations/env.py",
                   "llm_dispatch/simulator/__main__.py", "llm_dispatch/cli/main.py"):
        assert needed in names, needed


def user_project(directory: Path) -> Path:
    """A Prefect user's project: its own ``flows`` and ``tasks`` packages, and a prompt file."""
    for package, body in {
        "flows": "from tasks import shout\n\nGREETING = shout('flows of my own')\n",
        "tasks": "def shout(text: str) -> str:\n    return text.upper()\n",
    }.items():
        (directory / package).mkdir(parents=True)
        (directory / package / "__init__.py").write_text(body)
    prompts = directory / "questions.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"q-{i}", "prompt": f"question {i}?"}) + "\n" for i in range(5)))
    return prompts


def project_env(directory: Path, **extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("LLM_DISPATCH_", "OPENAI_", "ANTHROPIC_"))}
    # A worker runs the project's code with the project first on the path.
    return {**env, "PYTHONPATH": str(directory), **extra}


def test_a_project_with_its_own_flows_and_tasks_imports_both(tmp_path: Path) -> None:
    user_project(tmp_path)
    script = textwrap.dedent("""
        import flows, tasks
        from llm_dispatch.flows import dispatch
        from llm_dispatch.tasks import record_prompts
        print(flows.GREETING, tasks.__file__.startswith(%r), dispatch.name, record_prompts.name)
    """ % str(tmp_path))
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=project_env(tmp_path),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["FLOWS", "OF", "MY", "OWN", "True", "dispatch", "record-prompts"]


@pytest.mark.prefect
def test_the_main_job_runs_beside_a_project_with_its_own_flows_and_tasks(prefect_api: str, tmp_path: Path) -> None:
    prompts = user_project(tmp_path)
    done = subprocess.run([sys.executable, "-m", "llm_dispatch.cli.main", "run", str(prompts), "--simulate",
                           "--sim-latency", "0.01", "--json"],
                          cwd=tmp_path, env=project_env(tmp_path, PREFECT_API_URL=prefect_api),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["counts"] == {"succeeded": 5}
    with sqlite3.connect(tmp_path / "llm_dispatch.db") as con:
        answered = con.execute("SELECT COUNT(DISTINCT prompt_id) FROM results WHERE status = 'succeeded'").fetchone()
    assert answered == (5,)
