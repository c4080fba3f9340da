"""Batch input files (split by count, bytes and model) and batch output files (results, errors, garbled lines)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from llm_dispatch.core import BatchFileWriter
from llm_dispatch.core.batches._batch_files import INVALID_OUTPUT_LINE, UNUSABLE_ANSWER, read_batch_output, write_batch_files
from llm_dispatch.core._batch_types import BatchLimits
from llm_dispatch.core._types import ChatRequest


def request(text: str, *, model: str = "gpt-4o-mini") -> ChatRequest:
    return ChatRequest(model=model, messages=[{"role": "user", "content": text}], params={"max_tokens": 50})


def numbered(count: int, *, model: str = "gpt-4o-mini") -> Iterator[tuple[str, ChatRequest]]:
    return ((f"id-{i}", request(f"question {i}", model=model)) for i in range(count))


# --- writing ----------------------------------------------------------------------------------


def test_lines_are_openai_batch_requests_encoded_like_a_chat_call(tmp_path: Path) -> None:
    chat = ChatRequest(model="gpt-4o-mini", messages=[{"role": "user", "content": "Grüße 👋"}], params={"n": 2})
    [batch_file] = write_batch_files([("only", chat)], directory=tmp_path)
    raw = batch_file.path.read_bytes()
    record = json.loads(raw)
    assert record == {"custom_id": "only", "method": "POST", "url": "/v1/chat/completions", "body": chat.body()}
    # The body's bytes are the ones httpx would send in real time, so the simulator answers both alike.
    assert httpx.Request("POST", "https://x", json=chat.body()).content in raw
    assert (batch_file.model, batch_file.custom_ids, batch_file.requests, batch_file.bytes) == (
        "gpt-4o-mini", ["only"], 1, len(raw))


def test_split_by_request_count(tmp_path: Path) -> None:
    files = write_batch_files(numbered(7), directory=tmp_path, limits=BatchLimits(max_requests=3))
    assert [f.requests for f in files] == [3, 3, 1]
    assert [cid for f in files for cid in f.custom_ids] == [f"id-{i}" for i in range(7)]
    for f in files:
        lines = f.path.read_bytes().splitlines()
        assert [json.loads(line)["custom_id"] for line in lines] == f.custom_ids
        assert f.bytes == f.path.stat().st_size


def test_split_by_bytes_never_passes_the_limit(tmp_path: Path) -> None:
    line_size = len(write_batch_files(numbered(1), directory=tmp_path / "probe")[0].path.read_bytes())
    limit = line_size * 2 + line_size // 2  # room for two lines, not three
    files = write_batch_files(numbered(5), directory=tmp_path / "out", limits=BatchLimits(max_bytes=limit))
    assert [f.requests for f in files] == [2, 2, 1]
    assert all(f.bytes <= limit and f.bytes == f.path.stat().st_size for f in files)


def test_one_model_per_file_in_creation_order(tmp_path: Path) -> None:
    mixed = [
        ("a1", request("x", model="gpt-4o-mini")),
        ("b1", request("x", model="org/llama-3")),
        ("a2", request("y", model="gpt-4o-mini")),
        ("a3", request("z", model="gpt-4o-mini")),
        ("b2", request("y", model="org/llama-3")),
    ]
    files = write_batch_files(mixed, directory=tmp_path, limits=BatchLimits(max_requests=2))
    assert [(f.model, f.custom_ids) for f in files] == [
        ("gpt-4o-mini", ["a1", "a2"]),
        ("org/llama-3", ["b1", "b2"]),
        ("gpt-4o-mini", ["a3"]),
    ]
    for f in files:
        assert f.path.parent == tmp_path  # a "/" in a model name does not make a directory
        assert {json.loads(line)["body"]["model"] for line in f.path.read_bytes().splitlines()} == {f.model}


def test_duplicate_custom_id_raises_and_leaves_no_files(tmp_path: Path) -> None:
    requests = [*numbered(4), ("id-1", request("again"))]
    with pytest.raises(ValueError, match="duplicate custom_id 'id-1'"):
        write_batch_files(requests, directory=tmp_path, limits=BatchLimits(max_requests=2))
    assert list(tmp_path.iterdir()) == []


def test_a_streaming_writer_hands_back_each_file_as_it_closes(tmp_path: Path) -> None:
    writer = BatchFileWriter(directory=tmp_path, limits=BatchLimits(max_requests=2))
    closed = [writer.add(custom_id, req) for custom_id, req in numbered(3)]
    assert closed[:2] == [None, None] and closed[2] is not None
    assert closed[2].custom_ids == ["id-0", "id-1"] and closed[2].path.is_file()
    assert writer.add("other", request("x", model="gpt-4o")) is None  # another model, its own file
    assert [(f.model, f.custom_ids) for f in writer.close()] == [("gpt-4o-mini", ["id-2"]), ("gpt-4o", ["other"])]

    # discard removes only the files still open: those handed back belong to the caller.
    writer = BatchFileWriter(directory=tmp_path / "second", limits=BatchLimits(max_requests=1))
    writer.add("a", request("a"))
    [done] = [f for f in (writer.add("b", request("b")),) if f is not None]
    writer.discard()
    assert list((tmp_path / "second").iterdir()) == [done.path]


@pytest.mark.parametrize("custom_id", ["", None])
def test_empty_custom_id_is_refused(tmp_path: Path, custom_id: object) -> None:
    with pytest.raises(ValueError, match="non-empty"):
        write_batch_files([(custom_id, request("x"))], directory=tmp_path)  # type: ignore[list-item]


def test_a_request_larger_than_a_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="send it in real time"):
        write_batch_files([("big", request("x" * 1000))], directory=tmp_path, limits=BatchLimits(max_bytes=500))


_MEASURE_SCRIPT = """
import json, sys, time
from pathlib import Path
from llm_dispatch.core.batches._batch_files import write_batch_files
from llm_dispatch.core._types import ChatRequest

def status_kb(field):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])

def requests():
    for i in range(100_000):
        text = f"Summarise item {i}: a short paragraph about lighthouses and ships."
        yield f"req-{i:06d}", ChatRequest(model="gpt-4o-mini", messages=[{"role": "user", "content": text}])

Path("/proc/self/clear_refs").write_text("5")  # resets the peak (VmHWM) to the current RSS
before = status_kb("VmRSS")
started = time.perf_counter()
files = write_batch_files(requests(), directory=Path(sys.argv[1]))
seconds = time.perf_counter() - started
print(json.dumps({"seconds": seconds, "rss_growth_kb": status_kb("VmHWM") - before,
                  "files": [f.requests for f in files], "bytes": sum(f.bytes for f in files)}))
"""


def test_measure_100k_requests(tmp_path: Path) -> None:
    """Not a benchmark gate: prints how long 100,000 requests take to write and the peak memory they add.

    In a child process, so the peak RSS it reports is this write's alone and not the test session's
    (Linux only: it reads /proc).
    """
    if not Path("/proc/self/clear_refs").exists():
        pytest.skip("needs Linux /proc to measure peak memory")
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE_SCRIPT, str(tmp_path)], capture_output=True, text=True, check=True,
        cwd=Path(__file__).parent.parent,
    )
    figures = json.loads(done.stdout)
    print(
        f"\nwrite_batch_files: 100,000 requests -> files of {figures['files']} requests, "
        f"{figures['bytes'] / 1e6:.1f} MB in {figures['seconds']:.2f} s; "
        f"peak RSS grew {figures['rss_growth_kb'] / 1024:.1f} MB"
    )
    assert figures["files"] == [50_000, 50_000]


# --- reading ----------------------------------------------------------------------------------


def completion(text: str = "Hi!") -> dict:
    return {
        "id": "chatcmpl-1", "object": "chat.completion", "model": "gpt-4o-mini-2024-07-18",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 1300, "completion_tokens": 3, "total_tokens": 1303,
                  "prompt_tokens_details": {"cached_tokens": 1280}},
    }


def response_line(custom_id: str, status: int, body: dict) -> str:
    return json.dumps({"id": "batch_req_1", "custom_id": custom_id,
                       "response": {"status_code": status, "request_id": "req_1", "body": body}, "error": None})


def error_body(message: str, code: str | None = None, kind: str = "invalid_request_error") -> dict:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def test_output_lines_become_results_and_errors(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    path.write_text("\n".join([
        response_line("ok", 200, completion("Hello there")),
        response_line("limited", 429, error_body("slow down", "rate_limit_exceeded", "requests")),
        response_line("broken", 500, error_body("oops", kind="server_error")),
        response_line("refused", 400, error_body("bad max_tokens", "invalid_value")),
        json.dumps({"id": "batch_req_2", "custom_id": "late", "response": None,
                    "error": {"code": "batch_expired", "message": "not executed in time"}}),
        json.dumps({"id": "batch_req_3", "custom_id": "odd", "response": None,
                    "error": {"code": "simulated_line_error", "message": "lost"}}),
    ]) + "\n")
    lines = {line.custom_id: line for line in read_batch_output(path)}

    ok = lines["ok"]
    assert ok.ok and ok.status_code == 200 and not ok.retryable and ok.error_code is None
    assert ok.result is not None
    assert (ok.result.text, ok.result.finish_reason, ok.result.model, ok.result.response_id) == (
        "Hello there", "length", "gpt-4o-mini-2024-07-18", "chatcmpl-1")
    assert (ok.result.prompt_tokens, ok.result.completion_tokens, ok.result.cached_tokens) == (1300, 3, 1280)
    assert (ok.result.latency_s, ok.result.attempts) == (0.0, 1)

    summary = {cid: (line.status_code, line.error_code, line.retryable) for cid, line in lines.items() if cid != "ok"}
    assert summary == {
        "limited": (429, "rate_limit_exceeded", True),
        "broken": (500, "server_error", True),
        "refused": (400, "invalid_value", False),
        "late": (None, "batch_expired", True),
        "odd": (None, "simulated_line_error", False),
    }
    assert lines["limited"].error_message == "slow down"
    assert [line.line for line in lines.values()] == [1, 2, 3, 4, 5, 6]


def test_garbled_lines_are_reported_without_losing_the_others(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    path.write_bytes(b"\n".join([
        response_line("first", 200, completion()).encode(),
        b'{"custom_id": "cut", "response": {"status_co',
        b"",
        json.dumps({"response": {"status_code": 200, "body": completion()}}).encode(),
        response_line("hollow", 200, {"object": "chat.completion", "choices": []}).encode(),
        b"\xff\xfe not utf-8",
        json.dumps({"custom_id": "neither"}).encode(),
        response_line("last", 200, completion()).encode(),
    ]) + b"\n")
    lines = list(read_batch_output(path))

    assert [(line.line, line.custom_id, line.error_code) for line in lines] == [
        (1, "first", None),
        (2, None, INVALID_OUTPUT_LINE),
        (4, None, INVALID_OUTPUT_LINE),
        (5, "hollow", UNUSABLE_ANSWER),
        (6, None, INVALID_OUTPUT_LINE),
        (7, "neither", INVALID_OUTPUT_LINE),
        (8, "last", None),
    ]
    assert all("line" in (line.error_message or "line") for line in lines)
    # An answer that was lost in transit can be asked for again when we know whose it was; a 200 that carried no
    # answer was billed, and is not sent again.
    assert [line.retryable for line in lines if line.error_code] == [False, False, False, False, True]
    assert [line.billed for line in lines if line.error_code] == [False, False, True, False, False]


@pytest.mark.parametrize(("code", "retryable", "billed"), [
    ("batch_expired", True, False),  # documented: not completed, not charged
    ("batch_cancelled", True, False),  # seen in practice: never ran
    ("request_timeout", True, None),  # seen in practice: ran, billing not said
    ("something_new", False, False),  # undocumented: not sent again blindly
])
def test_each_openai_line_error_code_is_sent_again_or_not_as_documented(
    tmp_path: Path, code: str, retryable: bool, billed: bool | None
) -> None:
    path = tmp_path / "errors.jsonl"
    path.write_text(json.dumps({"id": "batch_req_1", "custom_id": "x", "response": None,
                                "error": {"code": code, "message": "stopped"}}) + "\n")
    [line] = read_batch_output(path)
    assert (line.error_code, line.retryable, line.billed) == (code, retryable, billed)
