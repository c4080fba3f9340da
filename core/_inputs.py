"""Reads prompt files (JSONL, CSV) or lists of dicts into validated prompt specs.

The whole input is validated before anything is sent or written, known request parameters and,
given the model table, each prompt against its model's context window included. Every bad line is a
problem of its own: the check goes on to the end and raises one ``InputError`` naming up to
``MAX_PROBLEMS`` of them (file, line and field each), so a file is fixed in one go. ``check_prompts``
does so in one streaming pass, holding 16 bytes per prompt (hashes of ids and requests), so that a job
of millions of prompts is checked and then read again as a stream (``iter_prompts``) while it is stored.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ._endpoints import DEFAULT_ENDPOINT, endpoint_problem
from ._embeddings import embedding_param_problem, embedding_text
from ._exceptions import InputError
from ._openai_responses import RESPONSES_PARAMS, response_param_problem
from ._input_files import PromptSource, Record, lone_surrogate_at, records
from ._hashes import HashBag, RepeatedKeys, key_hash, text_hash
from ._anthropic import anthropic_param_problem, anthropic_params, has_max_tokens
from ._message_shapes import anthropic_messages_refusal, openai_messages_refusal
from ._model_rules import DEFAULT_THINKING_MAX_TOKENS, anthropic_max_tokens, anthropic_refusal, anthropic_thinks, \
    is_openai_model, openai_params, openai_refusal
from ._params import misspelling, param_problem, shown
from ._structured import response_format_problem
from ._pricing import ModelLimits, PriceTable
from ._providers import provider_lookup
from ._routing import URGENCIES, parse_deadline
from ._settings import DEFAULT_ANTHROPIC_VERSION, DEFAULT_MAX_TOKENS
from ._tokens import estimate_input_tokens, input_tokens_at_most, reply_cap
from ._types import ChatRequest, dedupe_key

__all__ = [
    "MAX_PROBLEMS",
    "InputCheck",
    "PromptSource",
    "PromptSpec",
    "RepeatedKeys",
    "check_prompts",
    "fingerprint",
    "iter_prompts",
    "parse_prompt_dicts",
    "read_prompts",
]

logger = logging.getLogger(__name__)

JSONL_FIELDS = frozenset({"id", "prompt", "messages", "model", "params", "metadata", "urgency", "deadline", "endpoint",
                          "input"})
# Bad lines named by one failed check: enough to fix a file in one go, few enough to read.
MAX_PROBLEMS = 20
# Keys the dispatcher sets itself; a prompt may not override them through params.
FORBIDDEN_PARAMS = frozenset({"model", "messages", "stream", "n"})


@dataclass(slots=True)
class PromptSpec:
    """One validated prompt, as it will be recorded. A value: nothing changes one once made (not frozen, since a
    frozen dataclass costs three times as much to make, twice per prompt)."""

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
    # The provider endpoint it goes to (``_endpoints.ENDPOINTS``).
    endpoint: str = DEFAULT_ENDPOINT

    def __post_init__(self) -> None:
        if not self.dedupe_key:
            self.dedupe_key = dedupe_key(model=self.model, messages=self.messages, params=self.params,
                                         endpoint=self.endpoint)


def fingerprint(specs: Iterable[PromptSpec]) -> str:
    """A hash of the whole prompt set, so that running the same input again finds its job."""
    digest = hashlib.sha256()
    for spec in specs:
        _add_to_fingerprint(digest, spec)
    return digest.hexdigest()


def _add_to_fingerprint(digest: Any, spec: PromptSpec) -> None:
    digest.update(spec.custom_id.encode())
    digest.update(b"\x00")
    digest.update(spec.dedupe_key.encode())
    # Only when set, so fingerprints of inputs without them stay what they were.
    if spec.urgency is not None:
        digest.update(b"\x00urgency=" + spec.urgency.encode())
    if spec.deadline is not None:
        digest.update(b"\x00deadline=" + spec.deadline.encode())
    if spec.endpoint != DEFAULT_ENDPOINT:
        digest.update(b"\x00endpoint=" + spec.endpoint.encode())
    digest.update(b"\n")


@dataclass(frozen=True, slots=True)
class InputCheck:
    """What ``check_prompts`` found in a valid input."""

    count: int
    fingerprint: str
    repeated_keys: RepeatedKeys
    # Said once per check (and logged when ``warn``), a line each: Anthropic prompts given the default
    # max_tokens, deadlines already past, models whose shutdown is announced.
    warnings: tuple[str, ...] = ()
    # The providers the prompts go to (``provider_for`` of each model): their clients need keys.
    providers: frozenset[str] = frozenset()


class _Problems:
    """The bad lines of one pass: the first ``MAX_PROBLEMS`` kept, the rest counted."""

    def __init__(self) -> None:
        self.kept: list[InputError] = []
        self.total = 0

    def add(self, problem: InputError) -> None:
        self.total += 1
        if len(self.kept) < MAX_PROBLEMS:
            self.kept.append(problem)

    def raise_any(self) -> None:
        if self.total:
            kept = sorted(self.kept, key=lambda problem: problem.line or 0)
            raise InputError.several(kept, total=self.total)


def check_prompts(
    source: PromptSource,
    *,
    default_model: str,
    default_params: Mapping[str, Any] | None = None,
    default_endpoint: str = DEFAULT_ENDPOINT,
    table: PriceTable | None = None,
    model_providers: Mapping[str, str] | None = None,
    default_max_tokens: int = DEFAULT_MAX_TOKENS,
    anthropic_version: str = DEFAULT_ANTHROPIC_VERSION,
    warn: bool = True,
) -> InputCheck:
    """Validate the whole input as ``read_prompts`` does, in one streaming pass (a second one only
    when two ids may be the same): its count, fingerprint and repeated requests, no prompt held.

    Each prompt is refused what its model refuses (``_model_rules``; Anthropic's under ``anthropic_version``),
    and one whose provider (``model_providers``, then claude-* -> anthropic) is Anthropic any parameter Anthropic
    cannot take. Anthropic prompts with no max_tokens make one warning for the whole input, and deadlines already
    past another, returned as ``warnings`` and logged unless ``warn`` is false (a caller that checks twice warns
    once). Raises ``InputError`` naming every bad line (up to ``MAX_PROBLEMS``)."""
    digest = hashlib.sha256()
    ids, keys = HashBag(), HashBag()
    count = uncapped = thinking = past = 0
    thinking_default = max(default_max_tokens, DEFAULT_THINKING_MAX_TOKENS)
    first_past: tuple[int, str] | None = None
    problems = _Problems()
    where, _ = records(source)
    provider_of = provider_lookup(model_providers)
    providers: set[str] = set()
    now = datetime.now(timezone.utc)
    # Model -> prompts, for models whose provider has announced a shutdown.
    retiring: dict[str, int] = {}
    for line, spec in _iter_specs(source, default_model=default_model, default_params=default_params,
                                  default_endpoint=default_endpoint, table=table,
                                  model_providers=model_providers, now=now, anthropic_version=anthropic_version):
        if isinstance(spec, InputError):
            problems.add(spec)
            continue
        if spec.deadline is not None and parse_deadline(spec.deadline, now=now) < now:
            past += 1
            first_past = first_past or (line, spec.deadline)
        provider = provider_of(spec.model)
        if provider == "anthropic" and not has_max_tokens(spec.params):
            cap = anthropic_max_tokens(spec.model, spec.params, default=default_max_tokens,
                                       thinking_default=thinking_default)
            most = table.limits_for(spec.model) if table is not None else None
            if most is not None and most.max_output_tokens and cap > most.max_output_tokens:
                problems.add(InputError(
                    f"{spec.model} replies with at most {most.max_output_tokens:,} tokens but the default max_tokens "
                    f"is {cap:,}; set params.max_tokens or lower LLM_DISPATCH_DEFAULT_MAX_TOKENS",
                    path=where, line=line, field="params.max_tokens"))
                continue
            uncapped += 1
            thinking += anthropic_thinks(spec.model, spec.params)
        _add_to_fingerprint(digest, spec)
        ids.add(text_hash(spec.custom_id))
        keys.add(key_hash(spec.dedupe_key))
        count += 1
        providers.add(provider)
        if table is not None and table.shutdown_ahead(spec.model) is not None:
            retiring[spec.model] = retiring.get(spec.model, 0) + 1
    clashes = ids.repeated()
    if clashes:
        for problem in _duplicate_ids(source, clashes=clashes, where=where, default_model=default_model,
                                      default_params=default_params, default_endpoint=default_endpoint,
                                      model_providers=model_providers,
                                      anthropic_version=anthropic_version):
            problems.add(problem)
    problems.raise_any()
    if not count:
        raise InputError("no prompts found; each line needs a 'prompt' or 'messages'", path=where)
    warnings: list[str] = []
    if uncapped:
        sent = f"max_tokens={default_max_tokens:,}" if thinking < uncapped else ""
        if thinking:
            those = "them" if thinking == uncapped else f"the {thinking:,} that think"
            sent += f"{', and ' if sent else ''}{thinking_default:,} to {those} (thinking counts against it)"
        warnings.append(
            f"{where}: {uncapped:,} Anthropic prompt{'s' if uncapped > 1 else ''} set no max_tokens, which "
            f"Anthropic requires; sending {sent} (set params.max_tokens, or LLM_DISPATCH_DEFAULT_MAX_TOKENS)")
    if first_past is not None:
        line, deadline = first_past
        warnings.append(
            f"{where}: {past:,} prompt{'s have' if past > 1 else ' has'} a deadline already past (the first on line "
            f"{line}: {shown(deadline)}); sending {'them' if past > 1 else 'it'} real-time now")
    for model, prompts in sorted(retiring.items()):
        assert table is not None
        info, day = table.info_for(model), table.shutdown_ahead(model)
        assert info is not None and day is not None and table.priced_on is not None
        instead = f"move them to {info.replacement}" if info.replacement else "move them to a current model"
        warnings.append(f"{where}: {prompts:,} prompt{'s use' if prompts > 1 else ' uses'} {model}, which shuts down "
                        f"on {day.isoformat()} (in {(day - table.priced_on).days} days); {instead} before then")
    if warn:
        for warning in warnings:
            logger.warning("%s", warning)
    return InputCheck(count=count, fingerprint=digest.hexdigest(), repeated_keys=RepeatedKeys(keys.repeated()),
                      warnings=tuple(warnings), providers=frozenset(providers))


def _duplicate_ids(
    source: PromptSource,
    *,
    clashes: set[int],
    where: str,
    default_model: str,
    default_params: Mapping[str, Any] | None,
    default_endpoint: str = DEFAULT_ENDPOINT,
    model_providers: Mapping[str, str] | None = None,
    anthropic_version: str,
) -> Iterator[InputError]:
    """Each prompt whose id an earlier one has, among those whose hashes clash (two ids may share a hash)."""
    seen: dict[str, int] = {}
    for line, spec in _iter_specs(source, default_model=default_model, default_params=default_params,
                                  default_endpoint=default_endpoint, table=None,
                                  model_providers=model_providers, now=datetime.now(timezone.utc),
                                  anthropic_version=anthropic_version):
        if isinstance(spec, InputError) or text_hash(spec.custom_id) not in clashes:
            continue
        if spec.custom_id in seen:
            yield _duplicate(spec.custom_id, first=seen[spec.custom_id], where=where, line=line)
        else:
            seen[spec.custom_id] = line


def _duplicate(custom_id: str, *, first: int, where: str, line: int) -> InputError:
    return InputError(f"duplicate id {shown(custom_id)} (first on line {first}); ids must be unique",
                      path=where, line=line, field="id")


def iter_prompts(
    source: PromptSource,
    *,
    default_model: str,
    default_params: Mapping[str, Any] | None = None,
    default_endpoint: str = DEFAULT_ENDPOINT,
    table: PriceTable | None = None,
    model_providers: Mapping[str, str] | None = None,
    anthropic_version: str = DEFAULT_ANTHROPIC_VERSION,
) -> Iterator[PromptSpec]:
    """The prompts of ``source`` one at a time, in input order, each validated as it is read.

    Repeated ids are not looked for: read an input checked by ``check_prompts`` first. Without ``table``
    the model-limit checks (the token estimate) are skipped; every other check runs, so an input that
    changed since it was checked still gets its file:line error (the first one).
    """
    for _, spec in _iter_specs(source, default_model=default_model, default_params=default_params,
                               default_endpoint=default_endpoint, table=table,
                               model_providers=model_providers, now=datetime.now(timezone.utc),
                               anthropic_version=anthropic_version):
        if isinstance(spec, InputError):
            raise spec
        yield spec


def _iter_specs(
    source: PromptSource,
    *,
    default_model: str,
    default_params: Mapping[str, Any] | None,
    default_endpoint: str = DEFAULT_ENDPOINT,
    table: PriceTable | None,
    model_providers: Mapping[str, str] | None = None,
    now: datetime,
    anthropic_version: str = DEFAULT_ANTHROPIC_VERSION,
) -> Iterator[tuple[int, PromptSpec | InputError]]:
    """Each record's line number and its spec, or the ``InputError`` that says why it cannot be one."""
    where, lines = records(source)
    provider_of = provider_lookup(model_providers)
    from_file = isinstance(source, (str, Path))
    for position, (number, record) in enumerate(lines):
        if isinstance(record, InputError):
            yield number, record
            continue
        try:
            yield number, _spec(record, where=where, line=number, position=position, default_model=default_model,
                                default_params=default_params, default_endpoint=default_endpoint, table=table,
                                provider_of=provider_of, now=now,
                                from_file=from_file, anthropic_version=anthropic_version)
        except InputError as problem:
            yield number, problem


def read_prompts(
    path: str | Path,
    *,
    default_model: str,
    default_params: Mapping[str, Any] | None = None,
    default_endpoint: str = DEFAULT_ENDPOINT,
    table: PriceTable | None = None,
    model_providers: Mapping[str, str] | None = None,
    anthropic_version: str = DEFAULT_ANTHROPIC_VERSION,
) -> list[PromptSpec]:
    """Read and validate a ``.jsonl`` or ``.csv`` prompt file, every prompt in a list.

    With ``table``, a prompt to a model whose limits it knows is refused when its estimated input
    tokens plus its reply cap exceed the context window, or its cap exceeds the model's maximum output.
    """
    return _specs(Path(path), default_model=default_model, default_params=default_params,
                  default_endpoint=default_endpoint, table=table,
                  model_providers=model_providers, anthropic_version=anthropic_version)


def parse_prompt_dicts(
    items: Iterable[Mapping[str, Any]],
    *,
    default_model: str,
    default_params: Mapping[str, Any] | None = None,
    default_endpoint: str = DEFAULT_ENDPOINT,
    table: PriceTable | None = None,
    model_providers: Mapping[str, str] | None = None,
    anthropic_version: str = DEFAULT_ANTHROPIC_VERSION,
) -> list[PromptSpec]:
    """Validate prompts given as dicts (programmatic use), as ``read_prompts`` does; errors name the item number (1-based)."""
    return _specs(items, default_model=default_model, default_params=default_params,
                  default_endpoint=default_endpoint, table=table,
                  model_providers=model_providers, anthropic_version=anthropic_version)


def _specs(
    source: PromptSource,
    *,
    default_model: str,
    default_params: Mapping[str, Any] | None,
    default_endpoint: str = DEFAULT_ENDPOINT,
    table: PriceTable | None,
    model_providers: Mapping[str, str] | None = None,
    anthropic_version: str = DEFAULT_ANTHROPIC_VERSION,
) -> list[PromptSpec]:
    where, _ = records(source)
    specs: list[PromptSpec] = []
    seen: dict[str, int] = {}
    problems = _Problems()
    for number, spec in _iter_specs(source, default_model=default_model, default_params=default_params,
                                    default_endpoint=default_endpoint, table=table,
                                    model_providers=model_providers, now=datetime.now(timezone.utc),
                                    anthropic_version=anthropic_version):
        if isinstance(spec, InputError):
            problems.add(spec)
        elif spec.custom_id in seen:
            problems.add(_duplicate(spec.custom_id, first=seen[spec.custom_id], where=where, line=number))
        else:
            seen[spec.custom_id] = number
            specs.append(spec)
    problems.raise_any()
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
    default_endpoint: str = DEFAULT_ENDPOINT,
    table: PriceTable | None,
    provider_of: Callable[[str], str],
    now: datetime,
    from_file: bool,
    anthropic_version: str,
) -> PromptSpec:
    def fail(message: str, field_name: str | None = None) -> InputError:
        return InputError(message, path=where, line=line, field=field_name)

    if not isinstance(record, Mapping):
        raise fail(f"expected an object, got {type(record).__name__}")
    if not JSONL_FIELDS.issuperset(record):
        unknown = sorted(set(record) - JSONL_FIELDS, key=str)
        raise fail(f"unknown field; allowed: {', '.join(sorted(JSONL_FIELDS))}", str(unknown[0]))
    if not from_file:  # a file's lines were read as text already (``records``); dicts may hold anything
        at = lone_surrogate_at(record)
        if at is not None:
            raise fail("holds a lone surrogate (\\ud800-\\udfff), which is not text; fix the string", at)

    if "input" in record:
        # An embeddings prompt's text, named as the API names it: the same as 'prompt'.
        if "prompt" in record:
            raise fail("give one of 'prompt' or 'input' (the same text)", "input")
        record = {("prompt" if name == "input" else name): value for name, value in record.items()}
        if record.get("endpoint", default_endpoint) != "embeddings":
            raise fail("'input' is an embeddings prompt's text: set endpoint embeddings, or give it as 'prompt'",
                       "input")
    has_prompt, has_messages = "prompt" in record, "messages" in record
    if has_prompt == has_messages:
        raise fail("give exactly one of 'prompt' or 'messages'", "prompt" if not has_prompt else "messages")

    raw_id = record.get("id", f"line-{line}")
    if isinstance(raw_id, bool) or not isinstance(raw_id, (str, int)) or str(raw_id).strip() == "":
        raise fail("must be a non-empty string or integer", "id")

    model = record.get("model", default_model)
    if not isinstance(model, str) or not model.strip():
        raise fail("must be a non-empty string", "model")
    model = model.strip()
    provider = provider_of(model)
    anthropic = provider == "anthropic"
    endpoint = record.get("endpoint", default_endpoint)
    problem = endpoint_problem(endpoint, provider=provider)
    if problem is not None:
        raise fail(problem, "endpoint")

    if has_prompt:
        prompt = record["prompt"]
        if not isinstance(prompt, str) or not prompt.strip():
            raise fail("must be a non-empty string", "prompt")
        messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    else:
        # OpenAI's shapes, to the letter for OpenAI's own models; other content kinds are left to the provider (and
        # to the check of the translated body for Anthropic's).
        parts = "openai" if not anthropic and is_openai_model(model) else "any"
        shape = openai_messages_refusal(record["messages"], parts=parts)
        if shape is not None:
            raise fail(shape.message, shape.field)
        messages = [dict(message) for message in record["messages"]]

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
    problem = response_format_problem(params.get("response_format"))
    if problem is not None:
        raise fail(problem, "params.response_format")
    shut = table.shutdown_problem(model) if table is not None else None
    if shut is not None:
        raise fail(shut, "model")
    if endpoint == "embeddings":
        return _embedding_spec(record, custom_id=str(raw_id), messages=messages, params=params, model=model,
                               position=position, fail=fail, now=now, has_prompt=has_prompt)
    if anthropic:
        for name, value in params.items():
            problem = anthropic_param_problem(name, value)
            if problem is not None:
                raise fail(problem, f"params.{name}")
        try:  # what is left to go wrong is in the messages (a tool call's arguments, say)
            body = anthropic_params(ChatRequest(model=model, messages=messages, params=params), default_max_tokens=1)
        except (ValueError, TypeError, AttributeError) as exc:
            raise fail(f"cannot be sent to Anthropic: {exc}", "prompt" if has_prompt else "messages") from None
        refusal = anthropic_refusal(body, version=anthropic_version) or anthropic_messages_refusal(
            body, version=anthropic_version)
    elif endpoint == "responses":
        for name, value in params.items():
            problem = response_param_problem(name, value)
            if problem is not None:
                raise fail(problem, f"params.{name}")
        # What the model refuses is the same in both APIs: checked on the parameters chat names too.
        refusal = openai_refusal(model, openai_params(model, {name: value for name, value in params.items()
                                                              if name not in RESPONSES_PARAMS}))
    else:
        for name in params:
            problem = misspelling(name)
            if problem is not None:
                raise fail(problem, f"params.{name}")
        refusal = openai_refusal(model, openai_params(model, params))
    if refusal is not None:
        raise fail(refusal.message, refusal.field)
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
        deadline=_deadline(record.get("deadline"), now=now, fail=fail),
        endpoint=endpoint,
    )


def _embedding_spec(record: Mapping[str, Any], *, custom_id: str, messages: list[dict[str, Any]], params: dict[str, Any], model: str,
                    position: int, fail: Any, now: datetime, has_prompt: bool) -> PromptSpec:
    """An embeddings prompt: one text, and only the parameters that endpoint takes."""
    if embedding_text(messages) is None:
        raise fail("an embeddings prompt holds one text: give it as 'input' (or 'prompt')",
                   "prompt" if has_prompt else "messages")
    for name, value in params.items():
        problem = embedding_param_problem(name, value)
        if problem is not None:
            raise fail(problem, f"params.{name}")
    metadata = record.get("metadata")
    if metadata is not None and not isinstance(metadata, Mapping):
        raise fail("must be an object", "metadata")
    return PromptSpec(
        custom_id=custom_id, position=position, model=model, messages=messages, params=params,
        metadata=dict(metadata) if metadata is not None else None,
        urgency=_urgency(record.get("urgency"), fail=fail),
        deadline=_deadline(record.get("deadline"), now=now, fail=fail), endpoint="embeddings",
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
    window, most_in = limits.context_window, limits.max_input_tokens
    if window is None and most_in is None:
        return
    at_most = input_tokens_at_most(request)
    if at_most is not None and (window is None or at_most + (cap or 0) <= window) and (
            most_in is None or at_most <= most_in):
        return  # fits even at its most: no need to estimate it
    prompt = estimate_input_tokens(request)
    if most_in is not None and prompt > most_in:
        raise fail(f"is about {prompt:,} tokens (estimated), more than {model}'s maximum input of {most_in:,}; "
                   "shorten it or send it to a model that takes more", prompt_field)
    if window is None:
        return
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
        raise fail(f"{shown(value)} is not an urgency; use 'urgent' (real-time) or 'bulk' (Batch API)", "urgency")
    return urgency


def _deadline(value: Any, *, now: datetime, fail: Any) -> str | None:
    """The deadline as given, once it reads as one from ``now`` (a relative one is resolved when recorded)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise fail(f"{shown(value)} is not a timestamp or a duration like 2h, 30m, 1d; give it as a string", "deadline")
    try:
        parse_deadline(value, now=now)
    except ValueError as exc:
        raise fail(str(exc), "deadline") from None
    return value.strip()
