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
