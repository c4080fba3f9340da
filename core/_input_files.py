"""Reading prompt files: their records (a JSON object per line, or a CSV row as one) by line number, unchecked."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from ._exceptions import InputError

__all__ = ["CSV_RESERVED", "PromptSource", "records"]

# CSV columns that are fields of a prompt; the others become its metadata.
CSV_RESERVED = frozenset({"id", "prompt", "model", "urgency", "deadline"})
# A prompt file, or prompts given as dicts (a sequence: a second pass reads it again).
PromptSource = str | Path | Iterable[Mapping[str, Any]]


def records(source: PromptSource) -> tuple[str, Iterator[tuple[int, Any]]]:
    """Where the prompts come from (for messages) and their records by line (or item) number."""
    if not isinstance(source, (str, Path)):
        return "prompts", enumerate(source, start=1)
    path = Path(source)
    where = str(path)
    if not path.is_file():
        raise InputError("no such file; give the path of a .jsonl or .csv prompt file", path=where)
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson", ".json"):
        return where, _read_file(path, _jsonl_records, where=where)
    if suffix == ".csv":
        return where, _read_file(path, _csv_records, where=where)
    raise InputError(f"unsupported file type {suffix or '(none)'!r}; use .jsonl or .csv", path=where)


def _read_file(path: Path, parse: Any, *, where: str) -> Iterator[tuple[int, Any]]:
    try:
        with path.open(encoding="utf-8", newline="") as handle:
            yield from parse(handle, where=where)
    except UnicodeDecodeError as exc:
        raise InputError(f"not UTF-8 text ({exc.reason} at byte {exc.start})", path=where) from exc


def _jsonl_records(lines: Iterable[str], *, where: str) -> Iterable[tuple[int, Any]]:
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"invalid JSON ({exc.msg} at column {exc.colno})", path=where, line=number) from exc


def _csv_records(handle: Iterable[str], *, where: str) -> Iterable[tuple[int, Any]]:
    reader = csv.DictReader(handle)
    header = reader.fieldnames or []
    if "prompt" not in header:
        raise InputError(f"CSV header has no 'prompt' column (columns: {', '.join(header) or 'none'})", path=where, line=1)
    for row in reader:
        number = reader.line_num
        if None in row:
            raise InputError("more cells than header columns", path=where, line=number)
        record: dict[str, Any] = {"prompt": row["prompt"]}
        if row.get("id"):
            record["id"] = row["id"]
        # An empty cell means "not given", like a missing column.
        for name in ("model", "urgency", "deadline"):
            if row.get(name):
                record[name] = row[name]
        extra = {key: value for key, value in row.items() if key not in CSV_RESERVED}
        if extra:
            record["metadata"] = extra
        yield number, record
