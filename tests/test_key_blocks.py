"""API keys from Prefect Secret blocks: each provider's key from the block named for it, in the run and in the
batches' sub-flows, and a missing block stopping a run before anything is sent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import SecretStr

from conftest import successes_per_prompt
from llm_dispatch.core import to_json
from llm_dispatch.flows.dispatch import dispatch
from llm_dispatch.core import ConfigError, Settings, check_provider_key
from llm_dispatch.simulator import Simulator, SimulatorConfig, anthropic_base_url

pytestmark = [pytest.mark.prefect]

ROOT = Path(__file__).parent.parent
EXAMPLE = ROOT / "examples" / "mixed.jsonl"
OPENAI_KEY = "sk-from-block-openai-4f1c"
ANTHROPIC_KEY = "sk-ant-from-block-9d2e"


def _clear_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(("LLM_DISPATCH_", "OPENAI_", "ANTHROPIC_")) and name != "LLM_DISPATCH_BATCH_DIR":
            monkeypatch.delenv(name)


async def test_each_providers_key_comes_from_its_block_in_the_run_and_its_batch_sub_flows(
    prefect_api: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefect.blocks.system import Secret

    await Secret(value=OPENAI_KEY).save("test-openai-key", overwrite=True)
    await Secret(value=ANTHROPIC_KEY).save("test-anthropic-key", overwrite=True)
    _clear_keys(monkeypatch)
    monkeypatch.setenv("LLM_DISPATCH_API_KEY_BLOCK", "test-openai-key")
    monkeypatch.setenv("LLM_DISPATCH_ANTHROPIC_API_KEY_BLOCK", "test-anthropic-key")
    db = f"sqlite+aiosqlite:///{tmp_path / 'keys.db'}"
    # Two servers, each taking only its own provider's key: a key sent to the wrong one is refused (401).
    openai = SimulatorConfig(api_key=OPENAI_KEY, latency=0.01, batch_processing_seconds=0.2)
    anthropic = SimulatorConfig(api_key=ANTHROPIC_KEY, latency=0.01, batch_processing_seconds=0.2)
    with Simulator.in_thread(openai) as openai_url, Simulator.in_thread(anthropic) as anthropic_url:
        summary = to_json(await dispatch(prompts=str(EXAMPLE), base_url=openai_url, anthropic_base_url=anthropic_base_url(anthropic_url),
                                         database_url=SecretStr(db), wait=True, batch_poll_interval=0.1))
    prompts = sum(1 for line in EXAMPLE.read_text().splitlines() if line.strip())
    assert summary["counts"] == {"succeeded": prompts}
    assert set(successes_per_prompt(db).values()) == {1}
    assert set(summary["cost"]["providers"]) == {"openai", "anthropic"}
    # The keys went to request headers only: not into the summary or anywhere in the database file.
    stored = b"".join(p.read_bytes() for p in tmp_path.glob("keys.db*"))
    for key in (OPENAI_KEY, ANTHROPIC_KEY):
        assert key not in json.dumps(summary, default=str) and key.encode() not in stored


def test_a_named_block_stands_for_the_anthropic_key_until_the_flow_reads_it() -> None:
    remote = "https://api.anthropic.com"
    with pytest.raises(ConfigError, match="No Anthropic API key"):
        check_provider_key(Settings(anthropic_base_url=remote), provider="anthropic")
    check_provider_key(Settings(anthropic_base_url=remote, anthropic_api_key_block="some-block"), provider="anthropic")


def test_a_missing_block_stops_the_cli_with_its_name_before_anything_is_written(prefect_api: str, tmp_path: Path) -> None:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("LLM_DISPATCH_", "OPENAI_", "ANTHROPIC_"))}
    env |= {"PREFECT_API_URL": prefect_api, "LLM_DISPATCH_API_KEY_BLOCK": "no-such-block"}
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "a", "prompt": "hi"}) + "\n")
    done = subprocess.run([sys.executable, "-m", "llm_dispatch.cli.main", "run", str(prompts)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 2, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "no Prefect Secret block named 'no-such-block'" in errors[0], done.stderr[-2000:]
    assert "LLM_DISPATCH_API_KEY_BLOCK" in errors[0]
    assert not (tmp_path / "llm_dispatch.db").exists()
