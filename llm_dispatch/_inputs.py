"""Reads prompt files (JSONL, CSV) or lists of dicts into validated prompt specs.

The whole input is validated before anything is sent or written, known request parameters and,
given the model table, each prompt against its model's context window included; the first problem
raises an ``InputError`` that names the file, the line and the field.
"""

from __future__ import annotations

import csv
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ._exceptions import InputError
from ._params import param_problem
from ._pricing import ModelLimits, PriceTable
from ._routing import URGENCIES, parse_deadline
from ._tokens import estimate_input_tokens, reply_cap
from ._types import ChatRequest, dedupe_key

__all__ = ["PromptSpec", "fingerprint", "read_prompts", "parse_prompt_dicts"]

JSONL_FIELDS = frozenset({"id", "prompt", "messages", "model", "params", "metadata", "urgency", "deadline"})
CSV_RESERVED = frozenset({"id", "prompt", "model", "urgency", "deadline"})
# Relative deadlines are resolved when the prompt is recorded; validation only needs some instant.
_ANY_NOW = datetime(2000, 1, 1, tzinfo=timezone.utc)
ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
# Keys the dispatcher sets itself; a prompt may not override them through params.
FORBIDDEN_PARAMS = frozenset({"model", "messages", "stream", "n"})


@dataclass(frozen=True, slots=True)
class PromptSpec:
    """One validated prompt, as it will be recorded."""

    custom_id: str
    position: int
    model: str
    messages: list[dict[str, Any]]
    params: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] | None = None
    # Hashed once here: the fingerprint, the stored row and the planner all read it.
    dedupe_key: str = ""
    # "urgent" or "bulk"; None leaves the choice to the deadline or the job's policy.
    urgency: str | None = None
    # The deadline as given (stripped): a relative one ("2h") would otherwise make the
    # fingerprint depend on the clock. Resolve it with ``_routing.parse_deadline`` when recording.
    deadline: str | None = None

    def __post_init__(self) -> None:
        if not self.dedupe_key:
            object.__setattr__(self, "dedupe_key", dedupe_key(model=self.model, messages=self.messages, params=self.params))


def fingerprint(specs: Sequence[PromptSpec]) -> str:
    """A hash of the whole prompt set, so that running the same input again finds its job."""
    digest = hashlib.sha256()
    for spec in specs:
        digest.update(spec.custom_id.encode())
        digest.update(b"\x00")
        digest.update(spec.dedupe_key.encode())
        # Only when set, so fingerprints of inputs without them stay what they were.
        if spec.urgency is not None:
            digest.update(b"\x00urgency=" + spec.urgency.encode())
        if spec.deadline is not None:
            digest.update(b"\x00deadline=" + spec.deadline.encode())
        digest.update(b"\n")
    return digest.hexdigest()


def read_prompts(
    path: str | Path,
    *,
    default_model: str,
    default_params: Mapping[str, Any] | None = None,
    table: PriceTable | None = None,
) -> list[PromptSpec]:
    """Read and validate a ``.jsonl`` or ``.csv`` prompt file.

    With ``table``, a prompt to a model whose limits it knows is refused when its estimated input
    tokens plus its reply cap exceed the context window, or its cap exceeds the model's maximum output.
    """
    path = Path(path)
    where = str(path)
    if not path.is_file():
        raise InputError("no such file; give the path of a .jsonl or .csv prompt file", path=where)
    suffix = path.suffix.lower()
    try:
        with path.open(encoding="utf-8", newline="") as handle:
            if suffix in (".jsonl", ".ndjson", ".json"):
                records = _jsonl_records(handle, where=where)
                specs = _specs(records, where=where, default_model=default_model, default_params=default_params,
                               table=table)
            elif suffix == ".csv":
                records = _csv_records(handle, where=where)
                specs = _specs(records, where=where, default_model=default_model, default_params=default_params,
                               table=table)
            else:
                raise InputError(f"unsupported file type {suffix or '(none)'!r}; use .jsonl or .csv", path=where)
    except UnicodeDecodeError as exc:
        raise InputError(f"not UTF-8 text ({exc.reason} at byte {exc.start})", path=where) from exc
    return specs


def parse_prompt_dicts(
    items: Iterable[Mapping[str, Any]],
    *,
    default_model: str,
    default_params: Mapping[str, Any] | None = None,
    table: PriceTable | None = None,
) -> list[PromptSpec]:
    """Validate prompts given as dicts (programmatic use), as ``read_prompts`` does; errors name the item number (1-based)."""
    records = ((number, item) for number, item in enumerate(items, start=1))
    return _specs(records, where="prompts", default_model=default_model, default_params=default_params, table=table)


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


def _specs(
    records: Iterable[tuple[int, Any]],
    *,
    where: str,
    default_model: str,
    default_params: Mapping[str, Any] | None,
    table: PriceTable | None,
) -> list[PromptSpec]:
    specs: list[PromptSpec] = []
    seen: dict[str, int] = {}
    for number, record in records:
        spec = _spec(record, where=where, line=number, position=len(specs), default_model=default_model,
                     default_params=default_params, table=table)
        if spec.custom_id in seen:
            raise InputError(
                f"duplicate id {spec.custom_id!r} (first on line {seen[spec.custom_id]}); ids must be unique",
                path=where, line=number, field="id",
            )
        seen[spec.custom_id] = number
        specs.append(spec)
    if not specs:
        raise InputError("no prompts found; each line needs a 'prompt' or 'messages'", path=where)
    return specs


def _spec(
    record: Any,
    *,
    where: str,
    line: int,
    position: int,
    default_model: str,
    default_params: Mapping[str, Any] | None,
    table: PriceTable | None,
) -> PromptSpec:
    def fail(message: str, field_name: str | None = None) -> InputError:
        return InputError(message, path=where, line=line, field=field_name)

    if not isinstance(record, Mapping):
        raise fail(f"expected an object, got {type(record).__name__}")
    if not JSONL_FIELDS.issuperset(record):
        unknown = sorted(set(record) - JSONL_FIELDS)
        raise fail(f"unknown field; allowed: {', '.join(sorted(JSONL_FIELDS))}", unknown[0])

    has_prompt, has_messages = "prompt" in record, "messages" in record
    if has_prompt == has_messages:
        raise fail("give exactly one of 'prompt' or 'messages'", "prompt" if not has_prompt else "messages")
    if has_prompt:
        prompt = record["prompt"]
        if not isinstance(prompt, str) or not prompt.strip():
            raise fail("must be a non-empty string", "prompt")
        messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    else:
        messages = _messages(record["messages"], fail=fail)

    raw_id = record.get("id", f"line-{line}")
    if isinstance(raw_id, bool) or not isinstance(raw_id, (str, int)) or str(raw_id).strip() == "":
        raise fail("must be a non-empty string or integer", "id")

    model = record.get("model", default_model)
    if not isinstance(model, str) or not model.strip():
        raise fail("must be a non-empty string", "model")

    params = dict(default_params or {})
    if "params" in record:
        given = record["params"]
        if not isinstance(given, Mapping):
            raise fail("must be an object of request parameters", "params")
        bad = sorted(FORBIDDEN_PARAMS & set(given))
        if bad:
            raise fail(f"'{bad[0]}' cannot be set per prompt (llm-dispatch sets it)", "params")
        params.update(given)
    for name, value in params.items():
        problem = param_problem(name, value)
        if problem is not None:
            raise fail(problem, f"params.{name}")
    model = model.strip()
    limits = table.limits_for(model) if table is not None else None
    if limits is not None:
        _check_limits(ChatRequest(model=model, messages=messages, params=params), limits,
                      prompt_field="prompt" if has_prompt else "messages", fail=fail)

    metadata = record.get("metadata")
    if metadata is not None and not isinstance(metadata, Mapping):
        raise fail("must be an object", "metadata")

    return PromptSpec(
        custom_id=str(raw_id),
        position=position,
        model=model,
        messages=messages,
        params=params,
        metadata=dict(metadata) if metadata is not None else None,
        urgency=_urgency(record.get("urgency"), fail=fail),
        deadline=_deadline(record.get("deadline"), fail=fail),
    )


def _check_limits(request: ChatRequest, limits: ModelLimits, *, prompt_field: str, fail: Any) -> None:
    """Refuse a request its model cannot take: a reply cap above the model's maximum output, or an
    estimated prompt that with its cap does not fit the context window (the provider would refuse it)."""
    model, params = request.model, request.params
    cap = reply_cap(params)
    cap_name = "max_completion_tokens" if params.get("max_completion_tokens") else "max_tokens"
    most = limits.max_output_tokens
    if cap is not None and most is not None and cap > most:
        raise fail(f"{cap_name} {cap:,} is above {model}'s maximum output of {most:,} tokens; lower it",
                   f"params.{cap_name}")
    window = limits.context_window
    if window is None:
        return
    prompt = estimate_input_tokens(request)
    if prompt > window:
        raise fail(f"is about {prompt:,} tokens (estimated), more than {model}'s context window of {window:,}; "
                   "shorten it or send it to a model with a larger window", prompt_field)
    if cap is not None and prompt + cap > window:
        raise fail(f"about {prompt:,} prompt tokens (estimated) + {cap_name} {cap:,} exceed {model}'s context "
                   f"window of {window:,}; lower {cap_name} to {window - prompt:,} or less", f"params.{cap_name}")


def _urgency(value: Any, *, fail: Any) -> str | None:
    if value is None:
        return None
    urgency = value.strip().lower() if isinstance(value, str) else None
    if urgency not in URGENCIES:
        raise fail(f"{value!r} is not an urgency; use 'urgent' (real-time) or 'bulk' (Batch API)", "urgency")
    return urgency


def _deadline(value: Any, *, fail: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise fail(f"{value!r} is not a timestamp or a duration like 2h, 30m, 1d; give it as a string", "deadline")
    try:
        parse_deadline(value, now=_ANY_NOW)
    except ValueError as exc:
        raise fail(str(exc), "deadline") from exc
    return value.strip()


def _messages(value: Any, *, fail: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise fail("must be a non-empty list of {role, content} objects", "messages")
    messages = []
    for index, message in enumerate(value):
        name = f"messages[{index}]"
        if not isinstance(message, Mapping):
            raise fail("must be an object with 'role' and 'content'", name)
        role = message.get("role")
        if role not in ROLES:
            raise fail(f"role must be one of {', '.join(sorted(ROLES))}", f"{name}.role")
        content = message.get("content")
        if not (isinstance(content, str) or (isinstance(content, list) and content)):
            raise fail("content must be a string or a list of content parts", f"{name}.content")
        messages.append(dict(message))
    return messages
