"""Model rules as the providers document them: a prompt a model would refuse with a 400 is refused with the file
(one line naming the model and what to do), one it accepts is not, and the request builders send what each model
needs (``max_tokens`` as ``max_completion_tokens`` to OpenAI's reasoning models; room for Claude's thinking)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import respx

from llm_dispatch.core import ChatRequest, InputError
from llm_dispatch.core.wire._anthropic import anthropic_params
from llm_dispatch.core.inputs._inputs import parse_prompt_dicts
from llm_dispatch.core.batches._batch_files import write_batch_files
from llm_dispatch.core.rules._model_rules import openai_body, openai_refusal
from llm_dispatch.core.rules._claude_rules import anthropic_refusal

from conftest import FakeTime, make_client

USER = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}


def refused(model: str, params: dict[str, Any], *, version: str = "2023-06-01") -> str:
    """The one line the input check gives a prompt to ``model`` with ``params``."""
    with pytest.raises(InputError) as info:
        parse_prompt_dicts([{"prompt": "hi", "model": model, "params": params}], default_model="m",
                           anthropic_version=version)
    [line] = str(info.value).splitlines()
    return line


def accepted(model: str, params: dict[str, Any], *, version: str = "2023-06-01") -> bool:
    [spec] = parse_prompt_dicts([{"prompt": "hi", "model": model, "params": params}], default_model="m",
                                anthropic_version=version)
    return spec.params == params


# --- OpenAI --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "params", "expected"),
    [
        # Sampling parameters are refused at any effort but none: the request's own, else the model's default.
        ("gpt-6-luna", {"temperature": 0.2},
         "gpt-6-luna takes no temperature at its default reasoning_effort: set reasoning_effort to 'none' or remove "
         "temperature (field 'params.temperature')"),
        ("gpt-5.6-terra", {"top_p": 0.5},
         "gpt-5.6-terra takes no top_p at its default reasoning_effort 'medium': set reasoning_effort to 'none' or "
         "remove top_p (field 'params.top_p')"),
        ("gpt-5.1", {"reasoning_effort": "high", "logprobs": True},
         "gpt-5.1 takes no logprobs at reasoning_effort 'high'"),
        ("gpt-6.1-terra", {"reasoning_effort": "low", "top_logprobs": 3}, "gpt-6.1-terra takes no top_logprobs"),
        ("gpt-5.4-mini", {"reasoning_effort": "high", "temperature": 0},
         "gpt-5.4-mini takes no temperature at reasoning_effort 'high'"),
        # Models that always reason (no 'none' effort) refuse them outright.
        ("gpt-5-mini", {"temperature": 0}, "gpt-5-mini takes no temperature (it always reasons): remove temperature"),
        ("o3-mini", {"top_p": 0.1}, "o3-mini takes no top_p (it always reasons)"),
        ("gpt-6-astra", {"temperature": 0.7}, "gpt-6-astra takes no temperature (it always reasons)"),
        ("gpt-6.2-sol-2026-11-17", {"temperature": 0.7}, "gpt-6.2-sol-2026-11-17 takes no temperature"),
        ("ft:o4-mini-2025-04-16:acme::abc", {"temperature": 0.3}, "takes no temperature (it always reasons)"),
        # Effort values a model does not take.
        ("gpt-5.1", {"reasoning_effort": "minimal"},
         "gpt-5.1 takes reasoning_effort 'none', 'low', 'medium', or 'high', not 'minimal'"),
        ("gpt-5", {"reasoning_effort": "none"}, "gpt-5 takes reasoning_effort 'minimal', 'low', 'medium', or 'high'"),
        ("gpt-6-astra", {"reasoning_effort": "none"}, "gpt-6-astra always reasons: give a reasoning_effort other "
                                                      "than 'none'"),
        ("gpt-4o-mini", {"reasoning_effort": "low"}, "gpt-4o-mini does not reason: remove reasoning_effort"),
        # Function tools on Chat Completions: only at effort none, or not at all.
        ("gpt-5.6-luna", {"tools": [TOOL]},
         "gpt-5.6-luna takes function tools on Chat Completions only with reasoning_effort 'none' (this prompt runs "
         "at its default reasoning_effort 'medium'): set reasoning_effort to 'none' (field 'params.tools')"),
        ("gpt-5.4", {"tools": [TOOL], "reasoning_effort": "medium"}, "gpt-5.4 takes function tools on Chat "
                                                                     "Completions only with reasoning_effort 'none'"),
        ("gpt-6-sol", {"tools": [TOOL]}, "gpt-6-sol takes function tools on Chat Completions only"),
        ("gpt-6.1-sol", {"tools": [TOOL], "reasoning_effort": "low"},
         "gpt-6.1-sol calls tools only through OpenAI's Responses API, which llm-dispatch does not use"),
        # stop, and a prompt that gives both token caps.
        ("o4-mini", {"stop": ["\n"]}, "o4-mini takes no stop sequences: remove stop (field 'params.stop')"),
        ("gpt-5-nano", {"stop": "END"}, "gpt-5-nano takes no stop sequences"),
        ("gpt-5", {"max_tokens": 10, "max_completion_tokens": 20},
         "gpt-5 takes max_completion_tokens (llm-dispatch sends max_tokens as it); this prompt sets both: remove "
         "max_tokens (field 'params.max_tokens')"),
    ],
)
def test_what_an_openai_model_refuses_is_refused_with_the_file(model: str, params: dict, expected: str) -> None:
    line = refused(model, params)
    assert line.startswith("prompts:1: ") and expected in line


@pytest.mark.parametrize(
    ("model", "params"),
    [
        ("gpt-6-luna", {"max_tokens": 50}),  # sent as max_completion_tokens
        ("gpt-6-luna", {"temperature": 0.2, "reasoning_effort": "none", "tools": [TOOL]}),
        ("gpt-5.6-luna", {"temperature": 0, "top_p": 0.5, "logprobs": True, "top_logprobs": 2,
                          "reasoning_effort": "none"}),
        ("gpt-5.1", {"temperature": 0.3, "tools": [TOOL]}),  # its default effort is none; tools at any effort
        ("gpt-5.1", {"reasoning_effort": "high", "tools": [TOOL]}),
        ("gpt-5", {"temperature": 1, "logprobs": False}),  # the defaults are not "non-default"
        ("gpt-5.4-mini", {"temperature": 0.3}),  # its default effort is not documented: the provider decides
        ("gpt-5.1-chat-latest", {"temperature": 0.3, "stop": "x"}),
        ("gpt-4o", {"temperature": 0.3, "stop": "x", "max_tokens": 9}),
        ("o1", {"stop": "x"}),  # the SDK names only o3 and o4-mini
        ("llama-3.1-70b", {"reasoning_effort": "low", "temperature": 0.3, "top_k": 40, "min_p": 0.1}),
    ],
)
def test_what_a_model_takes_is_not_refused(model: str, params: dict) -> None:
    assert accepted(model, params)


@pytest.mark.parametrize(
    ("model", "sent"),
    [
        ("gpt-6-luna", {"max_completion_tokens": 50}),
        ("o3", {"max_completion_tokens": 50}),
        ("gpt-5-2025-08-07", {"max_completion_tokens": 50}),
        ("gpt-4o-mini", {"max_tokens": 50}),  # not a reasoning model: as given
        ("qwen2.5:7b", {"max_tokens": 50}),  # another server's model: as given
    ],
)
def test_max_tokens_goes_as_max_completion_tokens_to_reasoning_models(model: str, sent: dict) -> None:
    body = openai_body(ChatRequest(model=model, messages=USER, params={"max_tokens": 50, "seed": 1}))
    assert body == {**sent, "seed": 1, "model": model, "messages": USER}


async def test_the_client_sends_max_completion_tokens_to_a_reasoning_model(
    router: respx.Router, fake_time: FakeTime
) -> None:
    answer = {"id": "c", "object": "chat.completion", "model": "gpt-6-luna",
              "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
              "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
    route = router.post("/chat/completions").respond(200, json=answer)
    async with make_client(router, fake_time) as client:
        await client.chat(ChatRequest(model="gpt-6-luna", messages=USER, params={"max_tokens": 50}))
    assert json.loads(route.calls.last.request.content) == {"max_completion_tokens": 50, "model": "gpt-6-luna",
                                                           "messages": USER}


def test_a_batch_line_carries_max_completion_tokens_for_a_reasoning_model(tmp_path: Path) -> None:
    request = ChatRequest(model="gpt-6-luna", messages=USER, params={"max_tokens": 50})
    [file] = write_batch_files([("a", request)], directory=tmp_path)
    line = json.loads(file.path.read_text())
    assert line["body"] == {"max_completion_tokens": 50, "model": "gpt-6-luna", "messages": USER}


def test_the_refusal_carries_openais_own_400() -> None:
    refusal = openai_refusal("gpt-6", {"max_tokens": 10})
    assert refusal is not None and refusal.api_param == "max_tokens" and refusal.api_code == "unsupported_parameter"
    assert refusal.api_message == ("Unsupported parameter: 'max_tokens' is not supported with this model. "
                                   "Use 'max_completion_tokens' instead.")
    refusal = openai_refusal("gpt-5", {"temperature": 0})
    assert refusal is not None and refusal.api_message == (
        "Unsupported value: 'temperature' does not support 0 with this model. Only the default (1) value is supported.")


# --- Anthropic -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "params", "expected"),
    [
        ("claude-haiku-4-5", {"temperature": 0.2, "top_p": 0.9},
         "claude-haiku-4-5 takes temperature or top_p, not both: remove one (field 'params.top_p')"),
        ("claude-sonnet-4-5-20250929", {"temperature": 0.5, "top_p": 0.5}, "takes temperature or top_p, not both"),
        ("claude-opus-4-7", {"temperature": 0.2},
         "claude-opus-4-7 takes no temperature (its sampling is fixed): remove it (field 'params.temperature')"),
        ("claude-haiku-5-5", {"top_k": 40}, "claude-haiku-5-5 takes no top_k (its sampling is fixed)"),
        ("claude-sonnet-5-5", {"tool_choice": "required", "tools": [TOOL]},
         "claude-sonnet-5-5 refuses forced tool use (tool_choice 'required', 'any' or a named tool): use 'auto' with "
         "the tool marked strict, or output_config.format (field 'params.tool_choice')"),
        ("claude-opus-5-5", {"tool_choice": {"type": "function", "function": {"name": "lookup"}}, "tools": [TOOL]},
         "claude-opus-5-5 refuses forced tool use"),
        ("claude-fable-5-1", {"tool_choice": {"type": "any"}, "tools": [TOOL]}, "claude-fable-5-1 refuses forced"),
        ("claude-sonnet-4-5", {"tool_choice": "required", "tools": [TOOL],
                               "thinking": {"type": "enabled", "budget_tokens": 2048}},
         "claude-sonnet-4-5 refuses forced tool use with thinking on"),
        ("claude-opus-4-8", {"thinking": {"type": "enabled", "budget_tokens": 2048}},
         "claude-opus-4-8 takes no extended thinking (type 'enabled'): use {'type': 'adaptive'} with "
         "output_config.effort"),
        ("claude-haiku-4-5", {"thinking": {"type": "adaptive"}}, "claude-haiku-4-5 takes only extended thinking"),
        ("claude-opus-5-5", {"thinking": {"type": "disabled"}}, "claude-opus-5-5 cannot turn thinking off"),
        ("claude-haiku-4-5", {"output_config": {"effort": "low"}}, "claude-haiku-4-5 takes no output_config.effort"),
        ("claude-haiku-4-5", {"service_tier": "flex"},
         "Anthropic's service_tier is 'auto' or 'standard_only', not 'flex' (flex, priority and fast are OpenAI's)"),
        ("claude-haiku-4-5", {"reasoning_effort": "high"},
         "'reasoning_effort' has no Anthropic equivalent; give output_config: {effort: ...} instead"),
        ("claude-haiku-4-5", {"max_token": 5}, "'max_token' is not a parameter of Anthropic's Messages API; did you "
                                               "mean 'max_tokens'?"),
    ],
)
def test_what_a_claude_model_refuses_is_refused_with_the_file(model: str, params: dict, expected: str) -> None:
    line = refused(model, params)
    assert line.startswith("prompts:1: ") and expected in line


@pytest.mark.parametrize("name", ["temperature", "top_p", "top_k"])
def test_api_version_2026_10_21_takes_no_sampling_parameter_for_any_model(name: str) -> None:
    line = refused("claude-haiku-4-5", {name: 0.5 if name != "top_k" else 5}, version="2026-10-21")
    assert (f"anthropic-version 2026-10-21 takes no {name} for any model: remove it (or set "
            "LLM_DISPATCH_ANTHROPIC_VERSION=2023-06-01, where older models still take it)") in line


@pytest.mark.parametrize(
    ("model", "params"),
    [
        ("claude-haiku-4-5", {"temperature": 0.2}),  # under 2023-06-01, one of the two is fine
        ("claude-opus-4-7", {"temperature": 1}),  # its default
        ("claude-sonnet-5", {"tool_choice": "required", "tools": [TOOL]}),  # forced tool use is 5.5's refusal
        ("claude-opus-5", {"tool_choice": {"type": "tool", "name": "lookup"}, "tools": [TOOL]}),
        ("claude-sonnet-5-5", {"thinking": {"type": "between_tools"}}),
        # Anthropic's own parameters pass through.
        ("claude-opus-5-5", {"output_config": {"effort": "low"}, "cache_control": {"type": "ephemeral", "ttl": "1h"},
                             "container": "cntr_1", "inference_geo": "us", "service_tier": "standard_only",
                             "speed": "fast", "thinking": {"type": "adaptive", "display": "summarized"}}),
    ],
)
def test_what_a_claude_model_takes_is_not_refused(model: str, params: dict) -> None:
    assert accepted(model, params)


@pytest.mark.parametrize(
    ("model", "params", "sent"),
    [
        ("claude-haiku-4-5", {}, 4096),
        ("claude-opus-5-5", {}, 16_000),  # always thinks: thinking counts against max_tokens
        ("claude-sonnet-5", {"thinking": {"type": "disabled"}}, 4096),
        ("claude-haiku-4-5", {"thinking": {"type": "adaptive"}}, 16_000),
        ("claude-haiku-4-5", {"thinking": {"type": "enabled", "budget_tokens": 20_000}}, 24_096),
        ("claude-opus-5-5", {"max_tokens": 300}, 300),
    ],
)
def test_a_claude_request_that_thinks_gets_room_for_it(model: str, params: dict, sent: int) -> None:
    body = anthropic_params(ChatRequest(model=model, messages=USER, params=params), default_max_tokens=4096)
    assert body["max_tokens"] == sent


def test_a_raised_default_max_tokens_applies_to_thinking_requests_too() -> None:
    body = anthropic_params(ChatRequest(model="claude-opus-5-5", messages=USER, params={}), default_max_tokens=32_000)
    assert body["max_tokens"] == 32_000


def test_the_input_warning_says_what_max_tokens_thinking_prompts_get(tmp_path: Path) -> None:
    from llm_dispatch.core import check_prompts

    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"prompt": "x", "model": model}) + "\n"
                            for model in ("claude-opus-5-5", "claude-haiku-4-5", "claude-sonnet-5-5")))
    [warning] = check_prompts(path, default_model="m", warn=False).warnings
    assert warning.endswith("3 Anthropic prompts set no max_tokens, which Anthropic requires; sending "
                            "max_tokens=4,096, and 16,000 to the 2 that think (thinking counts against it) "
                            "(set params.max_tokens, or LLM_DISPATCH_DEFAULT_MAX_TOKENS)")


def test_the_anthropic_refusal_carries_its_400_text() -> None:
    refusal = anthropic_refusal({"model": "claude-sonnet-5-5", "tool_choice": {"type": "any"}}, version="2023-06-01")
    assert refusal is not None and refusal.api_message == (
        'tool_choice: type "tool" and "any" are not supported for this model.')


# --- batch metadata ------------------------------------------------------------------------------------------


def test_batch_metadata_past_what_openai_takes_is_refused_before_anything_is_built() -> None:
    from llm_dispatch.core import batch_metadata_problem

    assert batch_metadata_problem({f"k{i}": "v" for i in range(14)}, added=2) is None
    assert batch_metadata_problem({f"k{i}": "v" for i in range(15)}, added=2) == (
        "OpenAI takes 16 metadata keys on a batch and llm-dispatch sets 2: give at most 14, not 15")
    assert "at most 64 characters" in (batch_metadata_problem({"k" * 65: "v"}, added=2) or "")
    assert "at most 512 characters" in (batch_metadata_problem({"k": "v" * 513}, added=2) or "")
