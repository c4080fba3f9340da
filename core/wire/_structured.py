"""Structured answers: the schema a prompt asks its answer to follow, checked before anything is sent, and
every answer checked against it after, with the first violation in words and the message that asks again.

A schema is a prompt's ``params.response_format`` in OpenAI's ``json_schema`` form; a job's schema
(``--schema FILE`` or ``--schema module:Model``) becomes every prompt's default ``response_format``.
Answers are checked against Draft 2020-12 (the draft Pydantic writes), with two validators per distinct schema,
built once: an answer ``jsonschema-rs`` (compiled) passes is valid; one it does not pass is checked by
``jsonschema``, which says its first violation in words, or finds none (a ``pattern`` written for Python's ``re``
that the compiled one reads as ECMA 262 does: word and digit classes beyond ASCII, ``$`` before a final newline) and
lets it through. A ``multipleOf`` a fraction is judged exactly, as the draft says (0.07 is a multiple of 0.01),
where jsonschema's float division alone would refuse it.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from .._exceptions import ConfigError
from .._json import canonical_json
from .._types import TRUNCATED_FINISH_REASONS, ChatResult

if TYPE_CHECKING:
    # jsonschema is loaded where a schema is checked, not with the module: a report never checks one.
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError, ValidationError

__all__ = [
    "STRUCTURED_TOOL",
    "AnswerCheck",
    "answer_schema",
    "answer_text",
    "check_answer",
    "checked",
    "load_schema",
    "pydantic_schema",
    "reask_messages",
    "response_format_for",
    "response_format_problem",
]

# The tool a Claude model that has no output_config.format is made to call, its input being the answer.
STRUCTURED_TOOL: Final = "structured_answer"
# OpenAI's strict-mode limits ("Supported schemas", platform.openai.com/docs/guides/structured-outputs, read through
# secondary copies of that page): root an object, not anyOf; every object additionalProperties false and all its
# properties required; at most 5,000 properties and 10 levels of nesting; allOf, oneOf, not, if/then/else and the
# dependent/pattern keywords refused.
STRICT_MAX_PROPERTIES: Final = 5_000
STRICT_MAX_DEPTH: Final = 10
_STRICT_UNSUPPORTED: Final = ("allOf", "oneOf", "not", "if", "then", "else", "dependentRequired", "dependentSchemas",
                              "patternProperties", "unevaluatedProperties", "propertyNames")
_NAME: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
_VALIDATORS_KEPT: Final = 256
REASK_TEMPLATE: Final = ("Your answer did not follow the required JSON schema: {violation}. Answer again with only "
                         "JSON that follows the schema.")


def answer_schema(params: Mapping[str, Any]) -> dict[str, Any] | None:
    """The JSON Schema a prompt's answer must follow (its ``response_format`` of type ``json_schema``, or for
    Claude its own ``output_config.format``), or None."""
    response_format = params.get("response_format")
    if isinstance(response_format, Mapping) and response_format.get("type") == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, Mapping) else None
        return schema if isinstance(schema, dict) else None
    output_config = params.get("output_config")
    spec = output_config.get("format") if isinstance(output_config, Mapping) else None
    if isinstance(spec, Mapping) and spec.get("type") == "json_schema":
        schema = spec.get("schema")
        return schema if isinstance(schema, dict) else None
    return None


def response_format_for(schema: dict[str, Any], *, name: str, strict: bool = True) -> dict[str, Any]:
    """``schema`` as OpenAI's ``response_format`` (the form every prompt's schema is stored in)."""
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": strict}}


def load_schema(spec: str | Mapping[str, Any]) -> dict[str, Any]:
    """A job's schema as a strict ``response_format``: a JSON Schema file or ``module:Model`` (a Pydantic model)
    as ``--schema`` names them, or a JSON Schema itself (from Python: ``pydantic_schema(Model)``); raises
    ``ConfigError`` saying what to fix (a schema a provider would refuse included)."""
    where = f"--schema {spec}" if isinstance(spec, str) else "the answer schema"
    response_format = _load(spec) if isinstance(spec, str) else _named(dict(spec), default="answer", where=where)
    problem = response_format_problem(response_format)
    if problem is not None:
        raise ConfigError(f"{where}: {problem}")
    return response_format


def pydantic_schema(model: Any) -> dict[str, Any]:
    """The JSON Schema of a Pydantic model class as strict mode takes it: every object closed
    (``additionalProperties: false``) and every property required, as openai-python's ``to_strict_json_schema``
    makes it (a field with a default is answered, never left out); its ``title`` is the class's name."""
    to_schema = getattr(model, "model_json_schema", None)
    if not callable(to_schema):
        raise ConfigError(f"{getattr(model, '__name__', model)!r} is not a Pydantic model class (it has no "
                          "model_json_schema); give a subclass of pydantic.BaseModel")
    schema: dict[str, Any] = _strict(to_schema())
    return schema


def _load(spec: str) -> dict[str, Any]:
    path = Path(spec)
    if path.is_file() or ":" not in spec or spec.endswith((".json", ".JSON")):
        try:
            schema = json.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"--schema {spec}: cannot read it ({exc.strerror}); give a JSON Schema file or "
                              "module:Model") from exc
        except ValueError as exc:
            raise ConfigError(f"--schema {spec}: not JSON ({exc})") from exc
        return _named(schema, default=path.stem, where=f"--schema {spec}")
    module_name, _, attribute = spec.partition(":")
    try:
        model = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"--schema {spec}: cannot import it ({exc}); give module:Model with the module "
                          "importable here") from exc
    if not callable(getattr(model, "model_json_schema", None)):
        raise ConfigError(f"--schema {spec}: {attribute} is not a Pydantic model (no model_json_schema)")
    return response_format_for(pydantic_schema(model), name=_safe_name(attribute))


def _named(schema: Any, *, default: str, where: str) -> dict[str, Any]:
    """A JSON Schema as a strict ``response_format`` named by its ``title`` (else ``default``)."""
    if not isinstance(schema, dict):
        raise ConfigError(f"{where}: a JSON Schema is an object, got {type(schema).__name__}")
    title = schema.get("title")
    name = title if isinstance(title, str) else default
    return response_format_for(schema, name=_safe_name(name))


def _safe_name(name: str) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9_-]", "_", name)[:64]
    return cleaned or "answer"


# Keywords whose value maps names to schemas (the mapping itself is no schema).
_SCHEMA_MAPS: Final = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")


def _strict(schema: Any) -> Any:
    """A Pydantic model's schema with ``additionalProperties: false`` on each object that does not say (a model
    keeps only its fields, and strict mode requires it said) and every property of an object required."""
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    strict = {key: ({name: _strict(sub) for name, sub in value.items()}
                    if key in _SCHEMA_MAPS and isinstance(value, dict) else _strict(value))
              for key, value in schema.items()}
    if strict.get("type") == "object" and "additionalProperties" not in strict:
        strict["additionalProperties"] = False
    if isinstance(strict.get("properties"), dict):
        strict["required"] = list(strict["properties"])
    return strict


def response_format_problem(value: Any) -> str | None:
    """Why a ``response_format`` of type ``json_schema`` cannot be sent (a provider would refuse it, or no answer
    could be checked against it), or None. Other types are the provider's to judge."""
    if not isinstance(value, Mapping) or value.get("type") != "json_schema":
        return None
    # A job's prompts mostly share one schema: it is checked once, not once per prompt.
    try:
        key = canonical_json(value)
    except (TypeError, ValueError):
        return "the response_format must be JSON (objects, arrays, strings, numbers, booleans, null)"
    return _format_problem(key)


@functools.lru_cache(maxsize=_VALIDATORS_KEPT)
def _format_problem(key: str) -> str | None:
    value = json.loads(key)
    spec = value.get("json_schema")
    if not isinstance(spec, Mapping):
        return "a json_schema response_format needs 'json_schema': {name, schema, strict}"
    name = spec.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        return "json_schema.name must be 1-64 letters, digits, '_' or '-'"
    schema = spec.get("schema")
    if not isinstance(schema, dict):
        return "json_schema.schema must be a JSON Schema object"
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        return f"json_schema.schema is not a valid JSON Schema: {_words(exc)}"
    if spec.get("strict") is True:
        return strict_problem(schema)
    return None


def strict_problem(schema: dict[str, Any]) -> str | None:
    """What OpenAI's strict mode refuses in ``schema``, or None (the limits above)."""
    if schema.get("type") != "object" or "anyOf" in schema:
        return "strict mode needs the root to be {'type': 'object'} (not anyOf): wrap the answer in an object"
    properties = 0

    def walk(node: Any, where: str, depth: int) -> str | None:
        nonlocal properties
        if isinstance(node, list):
            for index, item in enumerate(node):
                found = walk(item, f"{where}[{index}]", depth)
                if found:
                    return found
            return None
        if not isinstance(node, dict):
            return None
        for keyword in _STRICT_UNSUPPORTED:
            if keyword in node:
                return f"strict mode does not take '{keyword}' (at {where})"
        props = node.get("properties")
        if node.get("type") == "object" or isinstance(props, dict):
            if depth > STRICT_MAX_DEPTH:
                return f"strict mode takes at most {STRICT_MAX_DEPTH} levels of nested objects (at {where})"
            if node.get("additionalProperties") is not False:
                return f"strict mode needs \"additionalProperties\": false on every object (at {where})"
            names = list(props) if isinstance(props, dict) else []
            properties += len(names)
            missing = [name for name in names if name not in (node.get("required") or ())]
            if missing:
                return (f"strict mode needs every property required (at {where}: '{missing[0]}'); make an optional "
                        "one nullable instead: {\"type\": [\"string\", \"null\"]}")
        for key, child in node.items():
            if isinstance(child, (dict, list)) and key not in ("enum", "const", "required", "examples", "default"):
                deeper = depth + 1 if key == "properties" else depth
                found = walk(child, f"{where}.{key}" if key != "properties" else where, deeper)
                if found:
                    return found
        return None

    found = walk(schema, "$", 1)
    if found is None and properties > STRICT_MAX_PROPERTIES:
        return f"strict mode takes at most {STRICT_MAX_PROPERTIES} properties in a schema, this one has {properties}"
    return found


@dataclass(frozen=True, slots=True)
class AnswerCheck:
    """An answer checked against its schema: the parsed value when valid, else the first violation in words."""

    parsed: Any = None
    violation: str | None = None

    @property
    def valid(self) -> bool:
        return self.violation is None


@dataclass(frozen=True, slots=True)
class _Validators:
    """One schema's validators: ``passes`` (compiled; None for a schema it cannot build offline, where ``words``
    decides alone) and ``words``, which finds the first violation of an answer ``passes`` did not let through."""

    passes: Callable[[Any], bool] | None
    words: Draft202012Validator


def _validator(schema: dict[str, Any]) -> _Validators:
    return _validators_of(canonical_json(schema))


@functools.lru_cache(maxsize=_VALIDATORS_KEPT)
def _validators_of(key: str) -> _Validators:
    import jsonschema_rs
    from jsonschema import Draft202012Validator

    # Answers of one job share a handful of schemas: each validator is built (its refs resolved) once. Formats are
    # annotations in 2020-12, as jsonschema has them; nothing is fetched (a remote $ref is for jsonschema to refuse).
    schema = json.loads(key)
    try:
        passes = jsonschema_rs.Draft202012Validator(schema, validate_formats=False, offline=True).is_valid
    except (jsonschema_rs.ValidationError, jsonschema_rs.ReferencingError, ValueError):
        passes = None
    return _Validators(passes=passes, words=Draft202012Validator(schema))


def check_answer(
    schema: dict[str, Any],
    *,
    text: str | None,
    finish_reason: str | None = None,
    refusal: str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
) -> AnswerCheck:
    """``text`` (or, for a Claude model made to call ``STRUCTURED_TOOL``, that call's arguments) checked against
    ``schema``: a refusal, a truncated answer, text that is not JSON and a schema violation are each invalid."""
    if refusal is not None:
        return AnswerCheck(violation=f"the model refused: {_cut(refusal)}")
    if finish_reason in TRUNCATED_FINISH_REASONS:
        return AnswerCheck(violation=f"the answer was cut off (finish_reason {finish_reason!r}) before its JSON ended")
    if not text and tool_calls:
        call = next((c for c in tool_calls if (c.get("function") or {}).get("name") == STRUCTURED_TOOL), None)
        if call is not None:
            text = call["function"].get("arguments")
    if not text:
        return AnswerCheck(violation="the answer is empty, not JSON")
    try:
        value = json.loads(text)
    except ValueError as exc:
        return AnswerCheck(violation=f"the answer is not JSON ({exc})")
    validators = _validator(schema)
    if validators.passes is not None and validators.passes(value):
        return AnswerCheck(parsed=value)
    error = next(validators.words.iter_errors(value), None)
    if error is not None:
        return AnswerCheck(violation=_words(error))
    return AnswerCheck(parsed=value)


def _words(error: ValidationError | SchemaError) -> str:
    from jsonschema.exceptions import ValidationError

    where = error.json_path if isinstance(error, ValidationError) else "$"
    return f"at {where}: {_cut(error.message, limit=200)}"


def _cut(text: str, *, limit: int = 120) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def checked(result: ChatResult, schema: dict[str, Any] | None) -> ChatResult:
    """``result`` with its ``parsed`` value or ``violation`` against ``schema`` (its request's ``answer_schema``);
    as it is when there is none."""
    if schema is None:
        return result
    check = check_answer(schema, text=result.text, finish_reason=result.finish_reason, refusal=result.refusal,
                         tool_calls=result.tool_calls)
    return dataclasses.replace(result, parsed=check.parsed, violation=check.violation)


def answer_text(result: ChatResult) -> str | None:
    """What an answer said, to give back in a re-ask: its text, else its structured tool call's arguments, else
    its refusal."""
    if result.text:
        return result.text
    for call in result.tool_calls or ():
        if (call.get("function") or {}).get("name") == STRUCTURED_TOOL:
            arguments: str | None = call["function"].get("arguments")
            return arguments
    return result.refusal


def reask_messages(messages: list[dict[str, Any]], *, answer: str | None, violation: str) -> list[dict[str, Any]]:
    """The conversation asked again: the prompt's messages, the invalid answer, and a message naming what was wrong."""
    return [*messages, {"role": "assistant", "content": answer or "(no answer)"},
            {"role": "user", "content": REASK_TEMPLATE.format(violation=violation)}]
