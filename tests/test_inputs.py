"""Prompt files are validated whole before anything is sent; errors name file, line and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llm_dispatch.jobs import PromptInput
from llm_dispatch.core import InputError, Settings
from llm_dispatch.core.inputs._inputs import fingerprint, iter_prompts, parse_prompt_dicts, read_prompts
from llm_dispatch.core.pricing._pricing import PriceTable


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def jsonl(*records: object) -> str:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records)


def test_jsonl_prompt_and_messages_forms(tmp_path: Path) -> None:
    path = write(tmp_path, "p.jsonl", jsonl(
        {"id": "a", "prompt": "hi", "params": {"temperature": 0}, "metadata": {"k": 1}},
        "",
        {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "ü"}], "model": "m2"},
    ))
    specs = read_prompts(path, default_model="m1")
    assert [s.custom_id for s in specs] == ["a", "line-3"]
    assert specs[0].messages == [{"role": "user", "content": "hi"}]
    assert specs[0].model == "m1" and specs[1].model == "m2"
    assert specs[0].params == {"temperature": 0} and specs[0].metadata == {"k": 1}
    assert [s.position for s in specs] == [0, 1]


def test_csv_keeps_other_columns_as_metadata(tmp_path: Path) -> None:
    path = write(tmp_path, "p.csv", 'id,prompt,lang\n1,"Hello, world",en\n2,Bonjour,fr\n')
    specs = read_prompts(path, default_model="m")
    assert [(s.custom_id, s.messages[0]["content"], s.metadata) for s in specs] == [
        ("1", "Hello, world", {"lang": "en"}),
        ("2", "Bonjour", {"lang": "fr"}),
    ]


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("p.jsonl", jsonl({"prompt": "ok"}, "{not json"), "p.jsonl:2: invalid JSON"),
        ("p.jsonl", jsonl({"prompt": "ok"}, {"promt": "typo"}), "p.jsonl:2: unknown field; allowed"),
        ("p.jsonl", jsonl({"prompt": ""}), "p.jsonl:1: must be a non-empty string (field 'prompt')"),
        ("p.jsonl", jsonl({"id": "x"}), "p.jsonl:1: give exactly one of 'prompt' or 'messages'"),
        ("p.jsonl", jsonl({"prompt": "a", "messages": []}), "give exactly one of"),
        ("p.jsonl", jsonl({"messages": [{"role": "robot", "content": "x"}]}), "(field 'messages[0].role')"),
        ("p.jsonl", jsonl({"messages": [{"role": "user"}]}), "(field 'messages[0].content')"),
        ("p.jsonl", jsonl({"prompt": "a", "params": {"stream": True}}), "'stream' cannot be set per prompt"),
        ("p.jsonl", jsonl({"prompt": "a", "params": [1]}), "(field 'params')"),
        ("p.jsonl", jsonl({"prompt": "a", "model": 3}), "(field 'model')"),
        ("p.jsonl", jsonl({"id": "x", "prompt": "a"}, {"id": "x", "prompt": "b"}), "p.jsonl:2: duplicate id 'x' (first on line 1)"),
        ("p.jsonl", jsonl([1, 2]), "p.jsonl:1: expected an object, got list"),
        ("p.jsonl", "\n\n", "no prompts found"),
        ("p.csv", "question\nhi\n", "p.csv:1: CSV header has no 'prompt' column (columns: question)"),
        ("p.csv", "prompt\n\"\"\n", "p.csv:2: must be a non-empty string (field 'prompt')"),
        ("p.txt", "hello", "unsupported file type '.txt'"),
    ],
)
def test_bad_input_names_file_line_and_field(tmp_path: Path, name: str, text: str, expected: str) -> None:
    path = write(tmp_path, name, text)
    with pytest.raises(InputError) as info:
        read_prompts(path, default_model="m")
    message = str(info.value)
    assert expected in message
    assert "\n" not in message


def test_missing_file_and_bad_encoding(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        read_prompts(tmp_path / "nope.jsonl", default_model="m")
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"prompt": "caf\xe9"}\n')
    with pytest.raises(InputError, match="not UTF-8"):
        read_prompts(path, default_model="m")


def test_dicts_are_validated_like_files() -> None:
    with pytest.raises(InputError, match=r"prompts:2: .*\(field 'prompt'\)"):
        parse_prompt_dicts([{"prompt": "a"}, {"prompt": 5}], default_model="m")


def test_fingerprint_follows_content_not_metadata() -> None:
    base = parse_prompt_dicts([{"id": 1, "prompt": "a", "metadata": {"x": 1}}], default_model="m")
    same = parse_prompt_dicts([{"id": 1, "prompt": "a", "metadata": {"x": 2}}], default_model="m")
    other_model = parse_prompt_dicts([{"id": 1, "prompt": "a"}], default_model="m2")
    other_params = parse_prompt_dicts([{"id": 1, "prompt": "a", "params": {"temperature": 1}}], default_model="m")
    assert fingerprint(base) == fingerprint(same)
    assert len({fingerprint(base), fingerprint(other_model), fingerprint(other_params)}) == 3


def test_examples_file_is_valid() -> None:
    specs = read_prompts(Path(__file__).parent.parent / "examples" / "prompts.jsonl", default_model=Settings().model)
    assert len(specs) >= 50


def test_urgency_and_deadline_in_jsonl_and_csv(tmp_path: Path) -> None:
    path = write(tmp_path, "p.jsonl", jsonl(
        {"id": "a", "prompt": "x", "urgency": " Urgent "},
        {"id": "b", "prompt": "x", "urgency": "bulk", "deadline": "2026-11-21T20:00Z"},
        {"id": "c", "prompt": "x", "deadline": " 1h30m ", "urgency": None},
        {"id": "d", "prompt": "x"},
    ))
    specs = read_prompts(path, default_model="m")
    assert [(s.urgency, s.deadline) for s in specs] == [
        ("urgent", None), ("bulk", "2026-11-21T20:00Z"), (None, "1h30m"), (None, None),
    ]
    path = write(tmp_path, "p.csv", "id,prompt,urgency,deadline,lang\n1,hi,urgent,,en\n2,yo,,PT2H,fr\n3,ok,,,de\n")
    specs = read_prompts(path, default_model="m")
    assert [(s.urgency, s.deadline, s.metadata) for s in specs] == [
        ("urgent", None, {"lang": "en"}), (None, "PT2H", {"lang": "fr"}), (None, None, {"lang": "de"}),
    ]


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        ({"prompt": "x", "deadline": "3 weeks-ish"},
         "p.jsonl:1: '3 weeks-ish' is not a timestamp or a duration like 2h, 30m, 1d (field 'deadline')"),
        ({"prompt": "x", "deadline": 7200}, "p.jsonl:1: 7200 is not a timestamp or a duration like 2h, 30m, 1d; "
                                            "give it as a string (field 'deadline')"),
        ({"prompt": "x", "deadline": ""}, "(field 'deadline')"),
        ({"prompt": "x", "urgency": "asap"},
         "p.jsonl:1: 'asap' is not an urgency; use 'urgent' (real-time) or 'bulk' (Batch API) (field 'urgency')"),
        ({"prompt": "x", "urgency": ["urgent"]}, "(field 'urgency')"),
    ],
)
def test_bad_urgency_or_deadline_names_line_and_field(tmp_path: Path, record: dict[str, object], expected: str) -> None:
    path = write(tmp_path, "p.jsonl", jsonl(record))
    with pytest.raises(InputError) as info:
        read_prompts(path, default_model="m")
    assert expected in str(info.value)


def test_bad_deadline_in_csv_names_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, "p.csv", "prompt,deadline\nok,2h\nok,soonish\n")
    with pytest.raises(InputError, match=r"p.csv:3: 'soonish' is not a timestamp .* \(field 'deadline'\)"):
        read_prompts(path, default_model="m")


def test_urgency_and_deadline_change_fingerprint_but_not_dedupe_key() -> None:
    plain = parse_prompt_dicts([{"id": 1, "prompt": "a"}], default_model="m")
    urgent = parse_prompt_dicts([{"id": 1, "prompt": "a", "urgency": "urgent"}], default_model="m")
    due = parse_prompt_dicts([{"id": 1, "prompt": "a", "deadline": "2h"}], default_model="m")
    due_later = parse_prompt_dicts([{"id": 1, "prompt": "a", "deadline": "3h"}], default_model="m")
    assert plain[0].dedupe_key == urgent[0].dedupe_key == due[0].dedupe_key
    assert len({fingerprint(plain), fingerprint(urgent), fingerprint(due), fingerprint(due_later)}) == 4
    # A relative deadline is kept as text, so the same input fingerprints the same at any time.
    assert fingerprint(due) == fingerprint(parse_prompt_dicts([{"id": 1, "prompt": "a", "deadline": "2h"}],
                                                              default_model="m"))


def test_fingerprint_without_urgency_or_deadline_is_unchanged() -> None:
    # Pinned (computed before urgency/deadline existed) so that old jobs are still found on a re-run.
    specs = parse_prompt_dicts([{"id": "a", "prompt": "hi"}, {"id": "b", "prompt": "yo"}], default_model="m")
    assert fingerprint(specs) == "01d2d1b032acefeb5ea0f0c69f1e72b7351b921b2fc03649950be654fc5fcdbc"


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"max_tokens": -5}, "must be an integer >= 1, got -5 (field 'params.max_tokens')"),
        ({"max_tokens": True}, "must be an integer >= 1, got true (field 'params.max_tokens')"),
        ({"max_completion_tokens": 12.5}, "must be an integer >= 1, got 12.5 (field 'params.max_completion_tokens')"),
        ({"temperature": "hot"}, "must be a number from 0 to 2, got \"hot\" (field 'params.temperature')"),
        ({"temperature": 2.5}, "must be a number from 0 to 2, got 2.5"),
        ({"temperature": float("nan")}, "p.jsonl:2: invalid JSON: NaN is not a JSON number; no provider accepts it"),
        ({"top_p": 1.5}, "must be a number from 0 to 1, got 1.5 (field 'params.top_p')"),
        ({"presence_penalty": -3}, "must be a number from -2 to 2, got -3 (field 'params.presence_penalty')"),
        ({"frequency_penalty": False}, "(field 'params.frequency_penalty')"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "must be a string or a list of up to 4 strings"),
        ({"stop": [1]}, "(field 'params.stop')"),
        ({"seed": "42"}, "must be an integer, got \"42\" (field 'params.seed')"),
        ({"logprobs": 1}, "must be true or false, got 1 (field 'params.logprobs')"),
        ({"top_logprobs": 21}, "must be an integer from 0 to 20, got 21"),
        ({"logit_bias": {"50256": -101}}, "must be an object of token id -> number from -100 to 100, got "),
        ({"response_format": {"schema": {}}}, "must be an object with a 'type' string, got {\"schema\": {}} (field 'params.response_format')"),
        ({"response_format": "json"}, "(field 'params.response_format')"),
        ({"user": 7}, "must be a string, got 7 (field 'params.user')"),
        ({"tools": {"type": "function"}}, "must be a list of tool objects, got {\"type\": \"function\"} (field 'params.tools')"),
        ({"tool_choice": 1}, "(field 'params.tool_choice')"),
        ({"reasoning_effort": 3}, "(field 'params.reasoning_effort')"),
        ({"service_tier": ["flex"]}, "(field 'params.service_tier')"),
        ({"parallel_tool_calls": "yes"}, "must be true or false"),
        ({"parallel_tool_calls": None}, "must be true or false, got null"),
        ({"metadata": {"run": 3}}, "must be an object of at most 16 string values (keys up to 64 characters, values up to 512), got "
         "{\"run\": 3} (field 'params.metadata')"),
    ],
)
def test_known_parameters_are_checked_for_type_and_range(tmp_path: Path, params: dict, expected: str) -> None:
    # json.dumps writes NaN as the bare literal that json.loads reads back.
    path = write(tmp_path, "p.jsonl", jsonl({"prompt": "fine"}, {"prompt": "a", "params": params}))
    with pytest.raises(InputError) as info:
        read_prompts(path, default_model="m")
    assert str(info.value).startswith(f"{path}:2: ")
    assert expected in str(info.value)


def test_good_unknown_and_null_parameters_pass_through() -> None:
    params = {"max_tokens": 1, "temperature": 0, "top_p": 1, "presence_penalty": -2, "frequency_penalty": 2.0,
              "stop": "END", "seed": -1, "logprobs": True, "top_logprobs": 0, "logit_bias": {"50256": -100},
              "response_format": {"type": "json_object"}, "user": "u-1", "tools": [{"type": "function"}],
              "tool_choice": "auto", "reasoning_effort": "low", "service_tier": "flex", "parallel_tool_calls": False,
              "metadata": {"run": "3"}, "top_k": "a provider's own", "verbosity": 5, "max_completion_tokens": None}
    [spec] = parse_prompt_dicts([{"prompt": "a", "params": params}], default_model="m")
    assert spec.params == params


BIG_PROMPT = "Tell me about the quiet river by the old mill. " * 62_500  # 3 MB of English


def test_a_prompt_over_its_models_context_window_is_refused_with_the_file(tmp_path: Path) -> None:
    table = PriceTable.load()
    path = write(tmp_path, "p.jsonl", jsonl({"prompt": "short"}, {"id": "big", "prompt": BIG_PROMPT, "model": "gpt-4o"}))
    with pytest.raises(InputError) as info:
        read_prompts(path, default_model="gpt-4o-mini", table=table)
    message = str(info.value)
    assert message.startswith(f"{path}:2: is about ") and message.endswith(
        "tokens (estimated), more than gpt-4o's context window of 128,000; shorten it or send it to a model "
        "with a larger window (field 'prompt')")
    # The same prompt fits gpt-4.1's window of 1,047,576; a model the table does not know is not checked.
    for model in ("gpt-4.1", "my-local-llama"):
        roomy = write(tmp_path, "r.jsonl", jsonl({"prompt": BIG_PROMPT, "model": model}))
        assert len(read_prompts(roomy, default_model="m", table=table)) == 1
    # Without the table (programmatic use of the core) nothing is checked against windows.
    assert len(read_prompts(path, default_model="m")) == 2


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        ({"prompt": "hi", "model": "gpt-4o", "params": {"max_tokens": 20_000}},
         "max_tokens 20,000 is above gpt-4o's maximum output of 16,384 tokens; lower it (field 'params.max_tokens')"),
        ({"prompt": "hi", "model": "gpt-4o-2024-08-06", "params": {"max_completion_tokens": 16_385}},
         "above gpt-4o-2024-08-06's maximum output of 16,384 tokens"),
        ({"prompt": "word " * 120_000, "model": "gpt-4o", "params": {"max_tokens": 16_000}},
         "prompt tokens (estimated) + max_tokens 16,000 exceed gpt-4o's context window of 128,000; lower max_tokens to"),
        ({"messages": [{"role": "user", "content": "word " * 200_000}], "model": "gpt-4o-mini"},
         "more than gpt-4o-mini's context window of 128,000; shorten it or send it to a model with a larger window "
         "(field 'messages')"),
    ],
)
def test_reply_caps_and_prompts_beyond_the_model_are_refused(record: dict, expected: str) -> None:
    with pytest.raises(InputError) as info:
        parse_prompt_dicts([record], default_model="m", table=PriceTable.load())
    assert str(info.value).startswith("prompts:1: ")
    assert expected in str(info.value)


def test_a_users_price_file_adds_a_models_window(tmp_path: Path) -> None:
    prices = write(tmp_path, "prices.json", json.dumps(
        {"models": {"my-vllm": {"input": 0, "output": 0, "context_window": 4096, "max_output_tokens": 1024}}}))
    table = PriceTable.load(path=prices)
    assert parse_prompt_dicts([{"prompt": "hi", "params": {"max_tokens": 1024}}], default_model="my-vllm", table=table)
    with pytest.raises(InputError, match="my-vllm's context window of 4,096"):
        parse_prompt_dicts([{"prompt": "word " * 5000}], default_model="my-vllm", table=table)
    # Too long to pass on its length alone (3 tokens a character), short enough by its estimate: accepted.
    words = "word " * 500
    assert 3 * len(words) + 1024 > 4096
    assert parse_prompt_dicts([{"prompt": words, "params": {"max_tokens": 1024}}], default_model="my-vllm", table=table)
    with pytest.raises(InputError, match="exceed my-vllm's context window of 4,096"):
        parse_prompt_dicts([{"prompt": "word " * 3000, "params": {"max_tokens": 1024}}], default_model="my-vllm",
                           table=table)


def test_a_checked_input_reads_again_as_the_very_specs_validation_made(tmp_path: Path) -> None:
    """The second pass over a checked input (no token estimates) makes what the check made."""
    path = write(tmp_path, "p.jsonl", jsonl(
        {"id": 7, "prompt": "hi", "params": {"temperature": 0, "max_tokens": 5}, "metadata": {"k": [1]}},
        {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "ü"}], "model": " m2 "},
        {"prompt": "later", "urgency": " Bulk ", "deadline": " 2h "},
    ))
    csv_path = write(tmp_path, "p.csv", "id,prompt,urgency,lang\n1,Hello,URGENT,en\n2,Bonjour,,fr\n")
    for source in (path, csv_path, Path(__file__).parents[1] / "examples" / "mixed.jsonl"):
        prompts = PromptInput(source=source, default_model="m1")
        prompts.check(warn=False)
        validated = list(iter_prompts(source, default_model="m1", table=PriceTable.load()))
        assert list(prompts.specs()) == validated
        assert fingerprint(validated) == fingerprint(prompts.specs())


@pytest.mark.parametrize(("changed", "error"), [
    ({"prompt": "ok", "params": {"n": 8}}, r"p.jsonl:2: .*'n' cannot be set per prompt"),
    ({"prompt": "ok", "params": {"stream": True}}, r"p.jsonl:2: .*'stream' cannot be set per prompt"),
    ({"id": "x"}, r"p.jsonl:2: .*give exactly one of 'prompt' or 'messages'"),
    ({"prompt": "ok", "urgency": "soonish"}, r"p.jsonl:2: .*urgency"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, r"p.jsonl:2: .*role"),
])
def test_an_input_changed_after_its_check_is_refused_on_the_second_pass(
    tmp_path: Path, changed: dict[str, object], error: str
) -> None:
    """The file is read again while the job is sent: a record edited in between is checked again, not sent as is."""
    path = write(tmp_path, "p.jsonl", jsonl({"prompt": "first"}, {"prompt": "second"}))
    prompts = PromptInput(source=path, default_model="gpt-4o-mini")
    assert prompts.check(warn=False).count == 2
    path.write_text(jsonl({"prompt": "first"}, changed), encoding="utf-8")
    with pytest.raises(InputError, match=error):
        list(prompts.specs())


@pytest.mark.parametrize(("name", "text"), [("p.csv", "\ufeffid,prompt\nq1,hi\n"), ("p.jsonl", '\ufeff{"id": "q1", "prompt": "hi"}\n')])
def test_a_byte_order_mark_is_not_part_of_the_first_column_or_line(tmp_path: Path, name: str, text: str) -> None:
    path = write(tmp_path, name, text)
    assert [spec.custom_id for spec in read_prompts(path, default_model="m")] == ["q1"]


def test_every_bad_line_is_a_problem_of_its_own(tmp_path: Path) -> None:
    path = write(tmp_path, "p.jsonl", jsonl({"prompt": ""}, {"prompt": "ok"}, "{oops", {"prompt": "x", "model": 1}))
    with pytest.raises(InputError) as info:
        PromptInput(source=path, default_model="m").check()
    assert [(problem.line, problem.field) for problem in info.value.problems] == [(1, "prompt"), (3, None), (4, "model")]
    assert (info.value.line, info.value.field) == (1, "prompt")
    assert str(info.value).splitlines() == [str(problem) for problem in info.value.problems]


def test_a_lone_surrogate_in_prompts_given_as_dicts_is_refused_with_its_field() -> None:
    with pytest.raises(InputError, match=r"prompts:2: holds a lone surrogate .* \(field 'metadata.note'\)"):
        parse_prompt_dicts([{"prompt": "a"}, {"prompt": "b", "metadata": {"note": "\ud800"}}], default_model="m")


def test_an_input_error_line_is_bounded_whatever_the_values() -> None:
    error = InputError("x" * 5000, path="/" + "d" * 5000 + "/p.jsonl", line=7, field="params." + "f" * 5000)
    text = str(error)
    assert len(text) < 450 and "\n" not in text and text.startswith("...") and "p.jsonl:7: xxx" in text
