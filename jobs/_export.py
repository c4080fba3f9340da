"""A job as a table for scoring: one row per prompt in input order, with what a scorer joins on and reads (the
user's id, the prompt, the answer, status, error, tokens, cost, latency, the prompt's metadata as columns), so that
no scorer has to join back to the input file. Written a page at a time in any of ``EXPORT_FORMATS``.

A column is a field: a name and how it is read from a stored row (``EXPORT_FIELDS``), or one key of the prompts'
metadata. A format is a writer of rows of those columns. Both are tables, so a new field (an answer's parsed value)
or a new format is one entry more.
"""

from __future__ import annotations

import csv
import json
import math
import operator
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any, Final, Literal, NamedTuple, TextIO

from llm_dispatch import storage
from llm_dispatch.core import PICO_PER_USD, TRUNCATED_FINISH_REASONS, ConfigError, stored_json, vector_floats


__all__ = ["BINARY_FORMATS", "DEFAULT_FIELDS", "EXPORT_FIELDS", "EXPORT_FORMATS", "ExportColumn", "ExportPlan", "export_columns",
           "plan_export"]

Convert = Callable[[Any], Any]


class Field(NamedTuple):
    """A built-in column: the one field of a stored row (``storage.ExportRow``) it is read from, and what is made of
    that field's value (None: written as it is). A column is converted a page at a time, value by value."""

    field: str
    convert: Convert | None = None


def _prompt_text(messages: list[dict[str, Any]] | None) -> str | None:
    """The question a prompt asks: the text of its one message (a prompt given as ``prompt``), else of its last
    user message; text parts of a multi-part message joined by newlines."""
    messages = messages or []
    asked = messages if len(messages) == 1 else [m for m in messages if m.get("role") == "user"]
    if not asked:
        return None
    content = asked[-1].get("content")
    if isinstance(content, list):
        return "\n".join(part["text"] for part in content if isinstance(part, dict) and part.get("type") == "text")
    return content if isinstance(content, str) else None


def _usd(pico: int | None) -> float | None:
    # As stored with the answer: 0 for a failure or a reused answer, None when unknown (no price) or not answered.
    return None if pico is None else pico / PICO_PER_USD


def _truncated(finish_reason: str | None) -> bool | None:
    # Cut at the request's cap or the model's window: the text is all there is, not all the model would say.
    return None if finish_reason is None else finish_reason in TRUNCATED_FINISH_REASONS


def _embedding(stored: bytes | None) -> list[float] | None:
    return None if stored is None else vector_floats(stored)


_stored = Field


# Every built-in column, in the order ``--fields all`` writes them.
EXPORT_FIELDS: Final[Mapping[str, Field]] = {
    "id": _stored("custom_id"),
    "prompt": Field("messages", _prompt_text),
    "messages": _stored("messages"),
    "answer": _stored("text"),
    "status": _stored("status"),
    "error": _stored("error_message"),
    "error_class": _stored("error_class"),
    "model": _stored("model"),
    "prompt_tokens": _stored("prompt_tokens"),
    "completion_tokens": _stored("completion_tokens"),
    "cached_tokens": _stored("cached_tokens"),
    "cache_creation_tokens": _stored("cache_creation_tokens"),
    "cache_creation_extended_tokens": _stored("cache_creation_extended_tokens"),
    "reasoning_tokens": _stored("reasoning_tokens"),
    "service_tier": _stored("service_tier"),
    "cost_usd": Field("cost_pico_usd", _usd),
    "latency_ms": _stored("latency_ms"),
    # Attempts of the call the provider may have billed, and the start of a 2xx that was no answer.
    "maybe_billed": _stored("maybe_billed"),
    "raw_body": _stored("raw_body"),
    "finish_reason": _stored("finish_reason"),
    "truncated": Field("finish_reason", _truncated),
    "tool_calls": _stored("tool_calls"),
    "refusal": _stored("refusal"),
    "route": _stored("route"),
    "planned_route": _stored("planned_route"),
    "route_reason": _stored("route_reason"),
    "discount": _stored("discount"),
    "prices_as_of": _stored("prices_as_of"),
    "cost_basis": _stored("cost_basis"),
    "position": _stored("position"),
    "prompt_id": _stored("prompt_id"),
    "metadata": _stored("metadata"),
    # A structured answer: its value, or the first thing wrong with it; how often it was asked again; and what the
    # prompt cost with its re-asks (cost_usd is its last answer's).
    "parsed": _stored("parsed"),
    "violation": _stored("violation"),
    "reasks": _stored("reask"),
    "prompt_cost_usd": Field("prompt_cost_pico_usd", _usd),
    # An embeddings answer's vector (as floats; float32 in a typed format).
    "embedding": Field("embedding", _embedding),
}
# Added to the defaults for a job whose prompts have a schema, before a column per property of the schema.
STRUCTURED_FIELDS: Final = ("violation", "reasks", "prompt_cost_usd")
# How a column is typed in a typed format (Parquet): "json" columns are written as JSON text.
ColumnKind = Literal["string", "int", "float", "bool", "json", "vector"]
_KINDS: Final[Mapping[str, ColumnKind]] = {
    "position": "int", "prompt_id": "int", "prompt_tokens": "int", "completion_tokens": "int", "cached_tokens": "int",
    "cache_creation_tokens": "int", "cache_creation_extended_tokens": "int", "reasoning_tokens": "int",
    "maybe_billed": "int", "reasks": "int", "cost_usd": "float", "prompt_cost_usd": "float", "latency_ms": "float",
    "truncated": "bool", "messages": "json", "tool_calls": "json", "metadata": "json", "parsed": "json",
    "embedding": "vector",
}
_SCHEMA_KINDS: Final[Mapping[str, ColumnKind]] = {"string": "string", "integer": "int", "number": "float",
                                                  "boolean": "bool"}


def schema_kind(spec: Any) -> ColumnKind:
    """The column kind of one property of an answer schema: its scalar type (nullable or not), else JSON."""
    kind = spec.get("type") if isinstance(spec, Mapping) else None
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        kind = kinds[0] if len(kinds) == 1 else None
    if kind is None and isinstance(spec, Mapping) and isinstance(spec.get("enum"), list):
        values = spec["enum"]
        kind = "string" if values and all(isinstance(v, str) for v in values) else None
    return _SCHEMA_KINDS.get(kind, "json") if isinstance(kind, str) else "json"
# Without --fields: what a scorer reads, then every metadata key of the job as a column of its own (and the whole
# conversation after the prompt, when some prompt is more than one question).
DEFAULT_FIELDS: Final = ("id", "prompt", "answer", "status", "error", "model", "prompt_tokens", "completion_tokens",
                         "cost_usd", "latency_ms")
METADATA_PREFIX: Final = "metadata."
PARSED_PREFIX: Final = "parsed."
ALL: Final = "all"


@dataclass(frozen=True, slots=True)
class ExportColumn:
    name: str
    # The field of ``storage.ExportRow`` it is read from, and what is made of each value (None: as it is).
    field: str
    convert: Convert | None = None
    kind: ColumnKind = "string"
    # Whether a value may be a list or an object from the user's data (metadata, an answer's value): a scalar
    # column of a typed format checks each value (``_scalar``); CSV writes such a value as JSON.
    free: bool = False

    def values(self, stored: Sequence[Any]) -> Sequence[Any]:
        """The column's values from its field's values, a page at a time."""
        return stored if self.convert is None else list(map(self.convert, stored))


_FREE_FIELDS: Final = frozenset({"messages", "tool_calls", "metadata", "parsed"})


def _builtin(name: str) -> ExportColumn:
    field = EXPORT_FIELDS[name]
    return ExportColumn(name, field.field, field.convert, _KINDS.get(name, "string"), free=field.field in _FREE_FIELDS)


def _parsed_column(key: str, spec: Any, *, name: str) -> ExportColumn:
    return ExportColumn(name=name, field="parsed", kind=schema_kind(spec), free=True,
                        convert=lambda parsed: parsed.get(key) if isinstance(parsed, dict) else None)


def _metadata_column(key: str, *, name: str) -> ExportColumn:
    return ExportColumn(name=name, field="metadata", free=True, convert=lambda metadata: (metadata or {}).get(key))


def export_columns(shape: storage.ExportShape, fields: Sequence[str] | None = None) -> list[ExportColumn]:
    """The columns of a job's export: ``fields`` in their order (a built-in name, ``metadata.KEY``, a metadata key
    that is not a built-in name, or ``all``), else the defaults. A metadata key named like a built-in column is
    written as ``metadata.KEY``. An unknown field is a ``ConfigError`` naming the fields there are."""
    keys = shape.metadata_keys
    by_key = {key: _metadata_column(key, name=key if key not in EXPORT_FIELDS else METADATA_PREFIX + key)
              for key in keys}
    taken = {*EXPORT_FIELDS, *by_key}
    by_property = {key: _parsed_column(key, spec, name=key if key not in taken else PARSED_PREFIX + key)
                   for key, spec in shape.schema_properties.items()}
    if not fields:
        names = list(DEFAULT_FIELDS)
        if shape.conversations:
            names.insert(names.index("prompt") + 1, "messages")
        if by_property:
            names += STRUCTURED_FIELDS
        if shape.embeddings:
            names.remove("answer")
            names.insert(names.index("status"), "embedding")
        return [*(_builtin(name) for name in names), *by_property.values(), *by_key.values()]
    columns: list[ExportColumn] = []
    for field in fields:
        if field == ALL:
            columns += [_builtin(name) for name in EXPORT_FIELDS if name != "metadata"]
            columns += [*by_property.values(), *by_key.values()]
        elif field in EXPORT_FIELDS:
            columns.append(_builtin(field))
        elif field.removeprefix(PARSED_PREFIX) in by_property and (field.startswith(PARSED_PREFIX)
                                                                    or field not in by_key):
            columns.append(by_property[field.removeprefix(PARSED_PREFIX)])
        elif field.removeprefix(METADATA_PREFIX) in by_key:
            columns.append(by_key[field.removeprefix(METADATA_PREFIX)])
        else:
            known = ", ".join([*EXPORT_FIELDS, ALL])
            meta = f"; this job's metadata keys: {', '.join(keys)}" if keys else "; this job's prompts have no metadata"
            raise ConfigError(f"--fields: no field {field!r}; fields: {known}{meta}")
    repeated = sorted({c.name for c in columns if sum(other.name == c.name for other in columns) > 1})
    if repeated:
        raise ConfigError(f"--fields: {', '.join(repeated)} given twice")
    return columns


# json.dumps(value, ensure_ascii=False), one C encoder for every value.
_json: Final = stored_json


class _Csv:
    """One header line, then a line per row; a list or an object (metadata, messages) as JSON in its cell."""

    def __init__(self, handle: TextIO, columns: Sequence[ExportColumn]) -> None:
        self._writer = csv.writer(handle)
        self._writer.writerow([c.name for c in columns])
        # A list or an object can only come from these columns; every other one is written as it is (None: empty).
        self._nested = [c.free or c.kind in ("json", "vector") for c in columns]

    def write_page(self, columns: Sequence[Sequence[Any]]) -> None:
        cells = [_cells(values) if nested else values for values, nested in zip(columns, self._nested)]
        self._writer.writerows(zip(*cells))

    def close(self) -> None:
        pass


def _cell(value: Any) -> Any:
    return _json(value) if isinstance(value, (dict, list)) else value


_NoneType: Final = type(None)
# Types a cell is written as it is, by ``_cell`` too.
_PLAIN: Final = frozenset({str, int, float, bool, _NoneType})


def _cells(values: Sequence[Any]) -> Sequence[Any]:
    """``_cell`` of each value; a column of plain values (the common case) as it is."""
    return values if set(map(type, values)) <= _PLAIN else list(map(_cell, values))


_string: Final = json.encoder.encode_basestring  # what the encoder writes a string with (ensure_ascii=False)
_NOT_FINITE: Final = frozenset({"nan", "inf", "-inf"})


def _json_values(values: Sequence[Any]) -> list[str]:
    """``_json`` of each value, a column at a time: a column of strings, of ints or of finite floats (each or None)
    by the encoder's own way with that type, the rest value by value; the same text either way."""
    types = set(map(type, values))
    if types <= {str, _NoneType}:
        return ["null" if v is None else _string(v) for v in values]
    if types <= {int, _NoneType}:
        return ["null" if v is None else int.__repr__(v) for v in values]
    if types <= {float, _NoneType}:
        texts = ["null" if v is None else float.__repr__(v) for v in values]
        if _NOT_FINITE.isdisjoint(texts):  # NaN and infinities the encoder writes its own way
            return texts
    return list(map(_json, values))


def _object_template(columns: Sequence[ExportColumn]) -> str:
    """``str.format`` text of a row's JSON object, the JSON text of each of its values in order: what ``_json`` writes
    for the row as a dict of the columns' names."""
    keys = (_json(c.name).replace("{", "{{").replace("}", "}}") for c in columns)
    return "{{" + ", ".join(f"{key}: {{}}" for key in keys) + "}}"


class _JsonLines:
    """One JSON object a line."""

    def __init__(self, handle: TextIO, columns: Sequence[ExportColumn]) -> None:
        self._handle, self._row = handle, (_object_template(columns) + "\n").format

    def write_page(self, columns: Sequence[Sequence[Any]]) -> None:
        self._handle.write("".join(map(self._row, *map(_json_values, columns))))

    def close(self) -> None:
        pass


class _JsonArray:
    """One JSON array of the rows, written a page at a time so that a large job is never held whole."""

    def __init__(self, handle: TextIO, columns: Sequence[ExportColumn]) -> None:
        self._handle, self._row, self._count = handle, _object_template(columns).format, 0
        handle.write("[")

    def write_page(self, columns: Sequence[Sequence[Any]]) -> None:
        rows = list(map(self._row, *map(_json_values, columns)))
        if rows:
            self._handle.write(("," if self._count else "") + "\n" + ",\n".join(rows))
            self._count += len(rows)

    def close(self) -> None:
        self._handle.write("\n]\n")


PARQUET_ROWS_PER_GROUP: Final = 10_000
PARQUET_INSTALL: Final = "pip install 'llm-dispatch[parquet]' (it adds pyarrow)"


def _json_text(value: Any) -> str | None:
    return None if value is None else _json(value)


class _Parquet:
    """A Parquet file (pyarrow, the optional ``parquet`` extra), a row group per ``PARQUET_ROWS_PER_GROUP`` rows or
    more (whole pages), so a job of any size is written in flat memory. Each column typed by its kind and built as an
    Arrow array a page at a time; JSON columns as JSON text."""

    binary = True

    def __init__(self, handle: IO[bytes], columns: Sequence[ExportColumn]) -> None:
        pa, pq = parquet_modules()
        types = {"string": pa.string(), "int": pa.int64(), "float": pa.float64(), "bool": pa.bool_(),
                 "json": pa.string(), "vector": pa.list_(pa.float32())}
        self._pa = pa
        self._schema = pa.schema([pa.field(c.name, types[c.kind]) for c in columns])
        # The database's own columns come typed; only the user's data (metadata, an answer's value) is checked.
        self._convert: list[Convert | None] = [
            _json_text if c.kind == "json" else None if c.kind == "vector" or not c.free else _scalar(c.kind)
            for c in columns]
        # A page of a checked column whose values all have these types is what ``_scalar`` would make of it.
        self._as_is = [_SCALAR_AS_IS.get(c.kind, frozenset()) for c in columns]
        self._writer = pq.ParquetWriter(handle, self._schema)
        self._batches: list[Any] = []
        self._rows = 0

    def write_page(self, columns: Sequence[Sequence[Any]]) -> None:
        arrays = [self._pa.array(values if convert is None or set(map(type, values)) <= as_is
                                 else list(map(convert, values)), type=f.type)
                  for values, convert, as_is, f in zip(columns, self._convert, self._as_is, self._schema)]
        batch = self._pa.record_batch(arrays, schema=self._schema)
        self._batches.append(batch)
        self._rows += batch.num_rows
        if self._rows >= PARQUET_ROWS_PER_GROUP:
            self._flush()

    def _flush(self) -> None:
        if self._rows:
            self._writer.write_table(self._pa.Table.from_batches(self._batches, schema=self._schema),
                                     row_group_size=self._rows)
            self._batches, self._rows = [], 0

    def close(self) -> None:
        self._flush()
        self._writer.close()


class _Npy:
    """The embedding vectors alone as one NumPy ``.npy`` array (float32, a row per prompt in input order), written
    a row at a time: the header's shape is written again at the end, in the room kept for it. A prompt with no
    vector is a row of NaN; vectors of different lengths cannot be one array (``ConfigError``)."""

    binary = True
    _HEADER = 128  # bytes kept for the header: room for any shape

    def __init__(self, handle: IO[bytes], columns: Sequence[ExportColumn]) -> None:
        self._handle = handle
        self._rows = 0
        self._width: int | None = None
        self._missing = 0  # rows with no vector before the first one (its width unknown until then)
        names = [c.name for c in columns]
        self._at = names.index("embedding") if "embedding" in names else None
        handle.write(b" " * self._HEADER)

    def write_page(self, columns: Sequence[Sequence[Any]]) -> None:
        if self._at is None:
            self._missing_rows(len(columns[0]) if columns else 0)
            return
        for vector in columns[self._at]:
            self._write(vector)

    def _missing_rows(self, count: int) -> None:
        for _ in range(count):
            self._write(None)

    def _write(self, vector: list[float] | None) -> None:
        if vector is None:
            if self._width is None:
                self._missing += 1
            else:
                self._handle.write(struct.pack(f"<{self._width}f", *([math.nan] * self._width)))
            self._rows += 1
            return
        if self._width is None:
            self._width = len(vector)
            self._handle.write(struct.pack(f"<{self._width}f", *([math.nan] * self._width)) * self._missing)
        elif len(vector) != self._width:
            raise ConfigError(f"--format npy: vectors of {self._width} and {len(vector)} dimensions cannot be one "
                              "array; export the job as parquet or jsonl")
        self._handle.write(struct.pack(f"<{self._width}f", *vector))
        self._rows += 1

    def close(self) -> None:
        header = repr({"descr": "<f4", "fortran_order": False, "shape": (self._rows, self._width or 0)}).encode()
        preamble = b"\x93NUMPY\x01\x00" + struct.pack("<H", self._HEADER - 10)
        self._handle.seek(0)
        self._handle.write(preamble + header.ljust(self._HEADER - len(preamble) - 1) + b"\n")


_SCALAR_AS_IS: Final[Mapping[ColumnKind, frozenset[type]]] = {
    "string": frozenset({str, _NoneType}), "int": frozenset({int, _NoneType}),
    "float": frozenset({int, float, _NoneType}), "bool": frozenset({bool, _NoneType})}


def _scalar(kind: ColumnKind) -> Callable[[Any], Any]:
    """A value for a typed column: as it is when it has the column's type, else None (a value that broke its schema
    is in the ``parsed`` and ``answer`` columns, not in a typed one)."""
    accepted: tuple[type, ...] = {"string": (str,), "int": (int,), "float": (int, float), "bool": (bool,)}[kind]

    def convert(value: Any) -> Any:
        if value is None or (isinstance(value, bool) and kind in ("int", "float")):
            return None
        if kind == "string" and isinstance(value, (dict, list)):
            return _json(value)
        if kind == "string" and not isinstance(value, str):
            return str(value)
        return value if isinstance(value, accepted) else None

    return convert


def parquet_modules() -> tuple[Any, Any]:
    """pyarrow and pyarrow.parquet; a ``ConfigError`` saying how to install them when they are not."""
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError as exc:
        raise ConfigError(f"--format parquet needs pyarrow: {PARQUET_INSTALL}") from exc
    return pyarrow, pyarrow.parquet


EXPORT_FORMATS: Final[Mapping[str, Callable[[Any, Sequence[ExportColumn]], Any]]] = {
    "jsonl": _JsonLines, "csv": _Csv, "json": _JsonArray, "parquet": _Parquet, "npy": _Npy,
}
# Formats written to a binary file (never to stdout).
BINARY_FORMATS: Final = frozenset({"parquet", "npy"})


@dataclass(frozen=True, slots=True)
class ExportPlan:
    """What an export writes: the job, its columns, the format."""

    job_id: str
    columns: list[ExportColumn]
    fmt: str

    async def write(self, *, sessions: storage.Sessions, handle: TextIO | IO[bytes]) -> int:
        """Every prompt of the job, in input order, to ``handle``, a page at a time, column by column; returns how
        many rows."""
        writer = EXPORT_FORMATS[self.fmt](handle, self.columns)
        at = [storage.EXPORT_ROW_FIELDS.index(column.field) for column in self.columns]
        count = 0
        async for page in storage.export_pages(sessions, job_id=self.job_id, fields={c.field for c in self.columns}):
            writer.write_page([column.values(page[i]) for column, i in zip(self.columns, at)])
            count += len(page[0])
        writer.close()
        return count


async def plan_export(*, sessions: storage.Sessions, job_id: str, fmt: str, fields: Sequence[str] | None = None) -> ExportPlan:
    """The export of a job as ``fmt`` with ``fields`` (see ``export_columns``), checked before anything is written:
    its metadata keys are read first, in one pass over that column."""
    if fmt not in EXPORT_FORMATS:
        raise ConfigError(f"no export format {fmt!r}; formats: {', '.join(EXPORT_FORMATS)}")
    if fmt == "parquet":
        parquet_modules()  # before the database is read: installed, or one line saying how
    columns = export_columns(await storage.export_shape(sessions, job_id=job_id), fields)
    return ExportPlan(job_id=job_id, columns=columns, fmt=fmt)
