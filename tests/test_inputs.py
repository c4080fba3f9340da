"""Prompt files are validated whole before anything is sent; errors name file, line and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llm_dispatch import InputError
from llm_dispatch._inputs import fingerprint, parse_prompt_dicts, read_prompts


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
    specs = read_prompts(Path(__file__).parent.parent / "examples" / "prompts.jsonl", default_model="gpt-4o-mini")
    assert len(specs) >= 50
