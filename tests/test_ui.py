"""The Prefect UI after a run with refusals and failures, looked at in a real browser as a user would: the server a
user starts with `llm-dispatch server start --port`, a run in both lanes with a failing request, refusals and failing
batch lines, then its pages in Chromium (Playwright drives the system's Chromium; the test skips where there is none).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from conftest import cli, write_prompts

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on this machine (`apt-get install chromium`): "
                                                         "the UI check needs a real browser")
# As a root process on a machine with no network starts it: no sandbox, no GPU, no calls home.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--no-first-run", "--disable-sync"]
# The UI's own loading: a page is read once the text it waits for is there, however long that takes.
PAGE_TIMEOUT_MS = 120_000


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _api(url: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        return json.load(answer)


def _tab(page: Any, name: str) -> None:
    """Open one of a run page's tabs (the UI draws them as buttons named by their text)."""
    page.get_by_text(name, exact=True).first.click()


def test_a_run_with_failures_reads_right_in_the_prefect_ui(tmp_path: Path) -> None:
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the dev extra has it)")
    port = _free_port()
    ui, api = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port}/api"
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PREFECT_", "LLM_DISPATCH_"))}
    env |= {"PREFECT_HOME": str(tmp_path / "prefect-home"), "LLM_DISPATCH_BATCH_MAX_REQUESTS": "10",
            "LLM_DISPATCH_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'ui.db'}"}
    records = []
    for i in range(40):
        marker = {3: "[[sim:400]]", 5: "[[sim:refuse]]", 6: "[[sim:refuse]]", 26: "[[sim:refuse]]",
                  25: "[[sim:line_error]]", 27: "[[sim:line_error]]"}.get(i, "")
        records.append({"id": f"q{i}", "prompt": f"question {i} {marker}", "model": "gpt-4o-mini",
                        "urgency": "urgent" if i < 20 else "bulk"})
    prompts = write_prompts(tmp_path / "mixed.jsonl", records)
    try:
        started = cli("server", "start", "--port", str(port), env=env, cwd=tmp_path, timeout=300)
        assert started.returncode == 0, started.stderr[-2000:]
        ran = cli("run", str(prompts), "--simulate", "--wait", env=env, cwd=tmp_path, timeout=600)
        assert ran.returncode == 1, ran.stderr[-3000:]  # failed prompts: the run ends Failed

        [run] = _api(f"{api}/flow_runs/filter", {"flow_runs": {"name": {"any_": ["mixed.jsonl"]}}})
        [wait] = _api(f"{api}/flow_runs/filter", {"flow_runs": {"parent_task_run_id": {"is_null_": False}}})
        artifacts = _api(f"{api}/artifacts/filter", {"artifacts": {"type": {"any_": ["progress"]}}})
        [routes] = _api(f"{api}/artifacts/filter", {"artifacts": {"key": {"any_": ["dispatch-mixed-jsonl-routes"]}}})
        # Both progress artifacts (the real-time half's, the polling sub-flow's) ended at 100%.
        assert sorted(a["description"].split(":")[0].split(" of ")[0] for a in artifacts) == ["2", "real-time"]
        assert [a["data"] for a in artifacts] == [100.0, 100.0]

        with sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1440, "height": 1000})
            page.set_default_timeout(PAGE_TIMEOUT_MS)

            page.goto(f"{ui}/runs/flow-run/{run['id']}")
            page.get_by_text("mixed.jsonl").first.wait_for()
            page.get_by_text("Failed", exact=True).first.wait_for()  # the run's state badge
            _tab(page, "Task Runs")
            page.get_by_text("send chunk 1/1 (20 prompts)").wait_for()
            assert "1 Failed" in page.inner_text("body")  # the chunk with the failed request
            _tab(page, "Subflow Runs")
            page.get_by_text("wait for 2 batches of job").wait_for()

            page.goto(f"{ui}/runs/flow-run/{wait['id']}")
            _tab(page, "Task Runs")
            page.get_by_text("ingest batch 1 of job").wait_for()
            page.get_by_text("ingest batch 2 of job").wait_for()
            assert "(1 Completed, 1 Failed)" in page.inner_text("body")  # the batch with failing lines is Failed

            page.goto(f"{ui}/artifacts/artifact/{routes['id']}")
            page.get_by_text("estimate", exact=True).wait_for()
            widths = page.evaluate("() => [...document.querySelectorAll('table')]"
                                   ".map(t => [t.scrollWidth, t.parentElement.clientWidth])")
            assert widths and all(table <= room for table, room in widths)  # every column shows, none cut
            browser.close()
    finally:
        cli("server", "stop", env=env, cwd=tmp_path)
