"""Reading prompt files: their records (a JSON object per line, or a CSV row as one) by line number, unchecked.

What spreadsheets and editors put in real files is read as the user meant it or refused with the line: a
UTF-8 byte-order mark (Excel's "CSV UTF-8") is dropped, a column or key given twice is refused (never the
last one silently taken), and a line that JSON cannot hold as text (a lone surrogate escape, NaN, nesting
deeper than Python reads, a number too long to convert) is a problem of that line, never a traceback.
"""

from __future__ import annotations

import csv
import json
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from .._exceptions import InputError
from .._params import shown

__all__ = ["CSV_RESERVED", "PromptSource", "Record", "lone_surrogate_at", "records"]

# CSV columns that are fields of a prompt; the others become its metadata.
CSV_RESERVED = frozenset({"id", "prompt", "model", "urgency", "deadline"})
# A prompt file, or prompts given as dicts (a sequence: a second pass reads it again).
PromptSource = str | Path | Iterable[Mapping[str, Any]]
# A record as read (a dict for a prompt, anything else for the checks to refuse), or why its line cannot be read.
Record = Any
# Excel and Notepad write one before the first byte of a UTF-8 file; "utf-8-sig" reads it as nothing.
_ENCODING = "utf-8-sig"
# A JSON escape of a UTF-16 surrogate: only a line holding one can decode to text that is not Unicode.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abcdefABCDEF]")


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    made = dict(pairs)
    if len(made) != len(pairs):
        key = next(key for key, count in Counter(key for key, _ in pairs).items() if count > 1)
        raise _DuplicateKey(key)
    return made


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number; no provider accepts it")


# Built once: each line is decoded by the C scanner, every object through ``_object``.
_DECODER = json.JSONDecoder(object_pairs_hook=_object, parse_constant=_no_constant)


def records(source: PromptSource) -> tuple[str, Iterator[tuple[int, Record]]]:
    """Where the prompts come from (for messages) and their records by line (or item) number.

    A line that cannot be read comes as an ``InputError`` in its record's place, so that a check can report
    it and go on; a file that cannot be read at all raises ``InputError`` here or when iterated."""
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
    raise InputError(f"unsupported file type {shown(suffix or '(none)')}; use .jsonl or .csv", path=where)


def lone_surrogate_at(value: Any) -> str | None:
    """Where in ``value`` (a record) a string holds a lone surrogate, which is not Unicode (no UTF-8 can carry
    it), as a field path (``messages[0].content``); None when every string is text."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return where or "(the record)"
        elif isinstance(item, Mapping):
            for key, child in item.items():
                if isinstance(key, str) and not _encodes(key):
                    return where or "(a key)"
                stack.append((f"{where}.{key}" if where else str(key), child))
        elif isinstance(item, list):
            stack.extend((f"{where}[{index}]", child) for index, child in enumerate(item))
    return None


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _read_file(path: Path, parse: Any, *, where: str) -> Iterator[tuple[int, Record]]:
    try:
        with path.open(encoding=_ENCODING, newline="") as handle:
            yield from parse(handle, where=where)
    except UnicodeDecodeError as exc:
        raise InputError(f"not UTF-8 text ({exc.reason} at byte {exc.start})", path=where) from exc


def _jsonl_records(lines: Iterable[str], *, where: str) -> Iterator[tuple[int, Record]]:
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = _DECODER.decode(line)
        except _DuplicateKey as exc:
            yield number, InputError(f"key {shown(exc.key)} is given twice in one object; keep one",
                                     path=where, line=number)
            continue
        except json.JSONDecodeError as exc:
            # Some of json's messages end in "at" ("Invalid control character at"): the column follows once.
            # A line cut short is faulted past its line ending: at its end, not at "column 1" of a next line.
            column = exc.colno if exc.lineno == 1 else len(line.rstrip("\r\n")) + 1
            yield number, InputError(f"invalid JSON ({exc.msg.removesuffix(' at')} at column {column})", path=where,
                                     line=number)
            continue
        except RecursionError:
            yield number, InputError("JSON nested too deep to read; flatten it", path=where, line=number)
            continue
        except ValueError as exc:  # NaN or Infinity, a number of more digits than int() converts
            yield number, InputError(f"invalid JSON: {exc}", path=where, line=number)
            continue
        if _SURROGATE_ESCAPE.search(line):
            at = lone_surrogate_at(record)
            if at is not None:
                yield number, InputError("holds a lone surrogate escape (\\ud800-\\udfff), which is not text; "
                                         "fix the string", path=where, line=number, field=at)
                continue
        yield number, record


def _csv_records(handle: Iterable[str], *, where: str) -> Iterator[tuple[int, Record]]:
    reader = csv.DictReader(handle)
    try:
        header = reader.fieldnames or []
    except csv.Error as exc:
        raise InputError(f"CSV header cannot be read ({exc})", path=where, line=1) from None
    repeated = [name for name, count in Counter(header).items() if count > 1]
    if repeated:
        raise InputError(f"CSV header has column {shown(repeated[0])} twice; rename or remove one", path=where, line=1)
    if "prompt" not in header:
        columns = ", ".join(header) or "none"
        columns = columns if len(columns) <= 80 else columns[:77] + "..."
        raise InputError(f"CSV header has no 'prompt' column (columns: {columns})", path=where, line=1)
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:  # a cell over the csv module's size limit, a NUL byte: the rest cannot be read
            raise InputError(f"CSV row cannot be read ({exc}); for long prompts use JSONL", path=where,
                             line=reader.line_num) from None
        number = reader.line_num
        if None in row:
            yield number, InputError("more cells than header columns", path=where, line=number)
            continue
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
