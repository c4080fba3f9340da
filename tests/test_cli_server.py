"""`llm-dispatch server start|stop`: a local Prefect server kept for the session, used by later commands while it
is up, as a user without a server of their own runs them."""

from __future__ import annotations

import json
import os
import socket
import urllib.request
from pathlib import Path

from conftest import Sim, cli, write_prompts


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _flow_run_names(api_url: str) -> list[str]:
    request = urllib.request.Request(f"{api_url}/flow_runs/filter", data=b"{}", method="POST",
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return [run["name"] for run in json.load(answer)]


def test_a_started_server_is_used_by_later_runs_until_stopped(sim: Sim, tmp_path: Path) -> None:
    port = _free_port()
    env = {key: value for key, value in os.environ.items() if not key.startswith("PREFECT_")}
    env |= {"PREFECT_HOME": str(tmp_path / "prefect-home"), "LLM_DISPATCH_BASE_URL": sim.base_url,
            "OPENAI_API_KEY": "sk-test", "LLM_DISPATCH_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'r.db'}"}
    api_url = f"http://127.0.0.1:{port}/api"
    try:
        started = cli("server", "start", "--port", str(port), env=env, cwd=tmp_path, timeout=300)
        assert started.returncode == 0, started.stderr[-2000:]
        assert f"Prefect server started at http://127.0.0.1:{port}" in started.stderr
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ui-settings", timeout=30) as answer:
            assert json.load(answer)["api_url"] == api_url  # the UI reaches this server's API, not the default port's
        again = cli("server", "start", "--port", str(port), env=env, cwd=tmp_path)
        assert again.returncode == 0 and "already up" in again.stderr

        prompts = write_prompts(tmp_path / "few.jsonl", [{"id": f"q{i}", "prompt": f"question {i}"} for i in range(3)])
        ran = cli("run", str(prompts), "--route", "all-realtime", "--json", env=env, cwd=tmp_path)
        assert ran.returncode == 0, ran.stderr[-2000:]
        assert "few.jsonl" in _flow_run_names(api_url)  # the run went to this server, not a temporary one
    finally:
        stopped = cli("server", "stop", env=env, cwd=tmp_path)
    assert stopped.returncode == 0 and f"stopped the Prefect server at {api_url}" in stopped.stderr
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0  # nothing listens there any more
    assert "no Prefect server" in cli("server", "stop", env=env, cwd=tmp_path).stderr
