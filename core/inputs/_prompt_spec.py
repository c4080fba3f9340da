"""One prompt record checked and made a ``PromptSpec``: its fields, model and endpoint, its messages in the shapes its
provider takes, its parameters, what its model refuses and can hold, its urgency and deadline. A record that cannot
be one raises the ``InputError`` that names its file, line and field (the passes over a whole input:
``core._inputs``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .._endpoints import DEFAULT_ENDPOINT, endpoint_problem
from ..wire._embeddings import embedding_param_problem, embedding_text
from ..wire._gemini_embeddings import gemini_embedding_param_problem
from .._exceptions import InputError
from ..wire._openai_responses import RESPONSES_PARAMS, response_param_problem
from ._input_files import lone_surrogate_at
from ..wire._anthropic import anthropic_param_problem, anthropic_params
from ..wire._gemini import gemini_body, gemini_param_problem
from ..rules._message_shapes import PartRules, anthropic_messages_refusal, openai_messages_refusal
from ..rules._model_rules import is_openai_model, openai_params, openai_refusal
from ..rules._claude_rules import anthropic_refusal
from ..rules._gemini_rules import gemini_refusal
from .._params import misspelling, param_problem, shown
from ..wire._structured import response_format_problem
from ..pricing._pricing import ModelLimits, PriceTable
from ..pricing._routing import URGENCIES, parse_deadline
from ..pricing._tokens import estimate_input_tokens, input_tokens_at_most, reply_cap
from .._providers import ModelRoute
from .._types import ChatRequest, dedupe_key

# Parameters a provider bounds otherwise than OpenAI does, checked by its own rules instead of ``param_problem``'s:
# Gemini takes up to 5 stop sequences (``_model_rules.gemini_refusal``), OpenAI 4.
_OWN_RULES: dict[str, frozenset[str]] = {"gemini": frozenset({"stop"})}

__all__ = ["PromptSpec", "prompt_spec"]

JSONL_FIELDS = frozenset({"id", "prompt", "messages", "model", "params", "metadata", "urgency", "deadline", "endpoint",
                          "input"})
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
    # The provider that serves it (``core.ProviderTable``): a built-in one's name, or one a providers file declares.
    provider: str = "openai"

    def __post_init__(self) -> None:
        if not self.dedupe_key:
            self.dedupe_key = dedupe_key(model=self.model, messages=self.messages, params=self.params,
                                         endpoint=self.endpoint)



def prompt_spec(
    record: Any,
    *,
    where: str,
    line: int,
    position: int,
    default_model: str,
    default_params: Mapping[str, Any] | None,
    default_endpoint: str = DEFAULT_ENDPOINT,
    table: PriceTable | None,
    resolve: Callable[[str], ModelRoute],
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
    try:
        route = resolve(model.strip())
    except ValueError as exc:  # a name two declared providers serve
        raise fail(str(exc), "model") from None
    # Recorded under its provider's qualified name (``model``); its wire's rules apply to the name it is sent under.
    model, provider, sent = route.model, route.wire, route.upstream
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
        parts: PartRules = "openai" if not anthropic and is_openai_model(sent) else "any"
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
    own_rules = _OWN_RULES.get(provider, frozenset())
    for name, value in params.items():
        problem = param_problem(name, value) if name not in own_rules else None
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
                               position=position, fail=fail, now=now, has_prompt=has_prompt, provider=route.provider,
                               wire=provider)
    if anthropic:
        for name, value in params.items():
            problem = anthropic_param_problem(name, value)
            if problem is not None:
                raise fail(problem, f"params.{name}")
        try:  # what is left to go wrong is in the messages (a tool call's arguments, say)
            body = anthropic_params(ChatRequest(model=sent, messages=messages, params=params), default_max_tokens=1)
        except (ValueError, TypeError, AttributeError) as exc:
            raise fail(f"cannot be sent to Anthropic: {exc}", "prompt" if has_prompt else "messages") from None
        refusal = anthropic_refusal(body, version=anthropic_version) or anthropic_messages_refusal(
            body, version=anthropic_version)
    elif provider == "gemini":
        for name, value in params.items():
            problem = gemini_param_problem(name, value)
            if problem is not None:
                raise fail(problem, f"params.{name}")
        try:  # what is left to go wrong is in the messages, or an effort the model cannot take
            gemini = gemini_body(ChatRequest(model=sent, messages=messages, params=params))
        except (ValueError, TypeError, AttributeError) as exc:
            field = "params.reasoning_effort" if "reasoning_effort" in str(exc) or "thinking" in str(exc) else (
                "prompt" if has_prompt else "messages")
            raise fail(f"cannot be sent to Gemini: {exc}", field) from None
        refusal = gemini_refusal(sent, gemini)
    elif endpoint == "responses":
        for name, value in params.items():
            problem = response_param_problem(name, value)
            if problem is not None:
                raise fail(problem, f"params.{name}")
        # What the model refuses is the same in both APIs: checked on the parameters chat names too.
        refusal = openai_refusal(sent, openai_params(sent, {name: value for name, value in params.items()
                                                            if name not in RESPONSES_PARAMS}))
    else:
        for name in params:
            problem = misspelling(name)
            if problem is not None:
                raise fail(problem, f"params.{name}")
        refusal = openai_refusal(sent, openai_params(sent, params))
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
        provider=route.provider,
    )


def _embedding_spec(record: Mapping[str, Any], *, custom_id: str, messages: list[dict[str, Any]], params: dict[str, Any], model: str,
                    position: int, fail: Any, now: datetime, has_prompt: bool, provider: str, wire: str) -> PromptSpec:
    """An embeddings prompt: one text, and only the parameters its provider's endpoint (its ``wire``) takes."""
    if embedding_text(messages) is None:
        raise fail("an embeddings prompt holds one text: give it as 'input' (or 'prompt')",
                   "prompt" if has_prompt else "messages")
    param_check = gemini_embedding_param_problem if wire == "gemini" else embedding_param_problem
    for name, value in params.items():
        problem = param_check(name, value)
        if problem is not None:
            raise fail(problem, f"params.{name}")
    metadata = record.get("metadata")
    if metadata is not None and not isinstance(metadata, Mapping):
        raise fail("must be an object", "metadata")
    return PromptSpec(
        custom_id=custom_id, position=position, model=model, messages=messages, params=params,
        metadata=dict(metadata) if metadata is not None else None,
        urgency=_urgency(record.get("urgency"), fail=fail),
        deadline=_deadline(record.get("deadline"), now=now, fail=fail), endpoint="embeddings", provider=provider,
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
