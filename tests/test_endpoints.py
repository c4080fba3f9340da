"""Endpoints other than chat: named per prompt or per job, refused where they cannot go, and a batch only created
for an endpoint whose output lines can be read back (issue 27)."""

from __future__ import annotations

from pathlib import Path

import pytest
import respx

from llm_dispatch.core import ConfigError, InputError, check_prompts, parse_prompt_dicts

from conftest import FakeTime, cli, make_client, write_prompts


async def test_a_batch_to_an_endpoint_whose_lines_cannot_be_read_is_refused_before_anything_is_sent(
    router: respx.Router, fake_time: FakeTime
) -> None:
    # No route: any request would fail the test (the router is strict).
    async with make_client(router, fake_time) as client:
        with pytest.raises(ConfigError, match="/v1/moderations cannot be read back by llm-dispatch"):
            await client.create_batch(input_file_id="file-abc", endpoint="/v1/moderations")


def test_the_endpoint_is_named_per_prompt_and_defaults_to_the_jobs() -> None:
    [plain, named] = parse_prompt_dicts([{"prompt": "a"}, {"prompt": "b", "endpoint": "chat"}],
                                        default_model="gpt-6-luna")
    assert plain.endpoint == named.endpoint == "chat"


def test_embeddings_to_anthropic_are_refused_at_the_input_check_in_one_line(tmp_path: Path) -> None:
    path = write_prompts(tmp_path / "p.jsonl", [
        {"id": 1, "prompt": "a", "model": "claude-haiku-5-5", "endpoint": "embeddings"},
        {"id": 2, "prompt": "b", "endpoint": "moderations"},
    ])
    with pytest.raises(InputError) as caught:
        check_prompts(path, default_model="gpt-6-luna")
    message = str(caught.value)
    assert "p.jsonl:1: Anthropic has no embeddings endpoint" in message
    assert "p.jsonl:2: 'moderations' is not an endpoint; use chat, responses, embeddings" in message


def test_the_jobs_endpoint_names_the_endpoint_of_prompts_that_name_none(tmp_path: Path) -> None:
    path = write_prompts(tmp_path / "p.jsonl", [{"id": 1, "prompt": "a", "model": "claude-haiku-5-5"}])
    with pytest.raises(InputError, match="Anthropic has no embeddings endpoint"):
        check_prompts(path, default_model="gpt-6-luna", default_endpoint="embeddings")


@pytest.mark.prefect
def test_run_with_endpoint_embeddings_to_a_claude_model_exits_2_in_one_line(
    cli_env: dict[str, str], tmp_path: Path
) -> None:
    path = write_prompts(tmp_path / "p.jsonl", [{"id": 1, "prompt": "a"}])
    done = cli("run", str(path), "--simulate", "--endpoint", "embeddings", "--model", "claude-haiku-5-5",
               env=cli_env, cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    errors = [line for line in (done.stdout + done.stderr).splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Anthropic has no embeddings endpoint" in errors[0]
    assert "Traceback" not in done.stderr
