"""Input checks for prompts that go to Anthropic: refused parameters, and one max_tokens warning per check."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from llm_dispatch.core import InputError, check_prompts, iter_prompts


def prompts(tmp_path: Path, *records: dict) -> Path:
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


@pytest.mark.parametrize("param", ["logprobs", "logit_bias", "presence_penalty", "frequency_penalty", "seed",
                                   "response_format"])
def test_an_openai_only_parameter_is_refused_for_claude_in_one_line(tmp_path: Path, param: str) -> None:
    value = {"logprobs": True, "logit_bias": {"1": 2}, "seed": 3,
             "response_format": {"type": "json_object"}}.get(param, 0.5)
    path = prompts(tmp_path, {"prompt": "a", "model": "gpt-4o-mini", "params": {param: value}},
                   {"prompt": "b", "model": "claude-haiku-4-5", "params": {param: value, "max_tokens": 5}})
    with pytest.raises(InputError) as caught:
        check_prompts(path, default_model="gpt-4o-mini")
    message = str(caught.value)
    assert message.startswith(f"{path}:2: ") and message.endswith(f"(field 'params.{param}')")
    assert "Anthropic" in message and "\n" not in message


def test_the_users_mapping_decides_which_prompts_are_checked_as_anthropic(tmp_path: Path) -> None:
    path = prompts(tmp_path, {"prompt": "a", "model": "corp-model", "params": {"seed": 1, "max_tokens": 3}})
    check_prompts(path, default_model="x")
    with pytest.raises(InputError, match="params.seed"):
        check_prompts(path, default_model="x", model_providers={"corp-*": "anthropic"})
    with pytest.raises(InputError, match="params.seed"):
        list(iter_prompts(path, default_model="x", model_providers={"corp-*": "anthropic"}))


def test_a_missing_max_tokens_warns_once_for_the_whole_input(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = prompts(tmp_path, *({"prompt": str(i), "model": "claude-haiku-4-5"} for i in range(3)),
                   {"prompt": "capped", "model": "claude-haiku-4-5", "params": {"max_completion_tokens": 9}},
                   {"prompt": "openai", "model": "gpt-4o-mini"})
    caplog.set_level(logging.WARNING)
    check = check_prompts(path, default_model="gpt-4o-mini", default_max_tokens=2048)
    assert check.count == 5
    [warning] = check.warnings
    assert "3 Anthropic prompts set no max_tokens" in warning and "max_tokens=2,048" in warning
    assert [record.getMessage() for record in caplog.records] == [warning]
    caplog.clear()
    again = check_prompts(path, default_model="gpt-4o-mini", warn=False)
    assert len(again.warnings) == 1 and caplog.records == []


def test_no_warning_when_every_claude_prompt_has_a_cap(tmp_path: Path) -> None:
    path = prompts(tmp_path, {"prompt": "a", "model": "claude-haiku-4-5", "params": {"max_tokens": 4}})
    assert check_prompts(path, default_model="gpt-4o-mini").warnings == ()


def test_a_tool_call_whose_arguments_are_not_json_is_refused_for_claude(tmp_path: Path) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{oops"}}
    path = prompts(tmp_path, {"model": "claude-haiku-4-5", "params": {"max_tokens": 5}, "messages": [
        {"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "1"}]})
    with pytest.raises(InputError, match=r"in.jsonl:1: cannot be sent to Anthropic: .*not JSON.*\(field 'messages'\)"):
        check_prompts(path, default_model="gpt-4o-mini")


def test_a_default_max_tokens_above_the_models_maximum_is_refused(tmp_path: Path) -> None:
    from llm_dispatch.core import PriceTable

    path = prompts(tmp_path, {"prompt": "a", "model": "claude-3-haiku-20240307"})
    table = PriceTable.load()
    check_prompts(path, default_model="x", table=table, default_max_tokens=4096)
    with pytest.raises(InputError, match=r"in.jsonl:1: .*at most 4,096 tokens.*\(field 'params.max_tokens'\)"):
        check_prompts(path, default_model="x", table=table, default_max_tokens=8192)
