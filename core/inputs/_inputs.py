"""Reads prompt files (JSONL, CSV) or lists of dicts into validated prompt specs, each record checked by
``_prompt_spec.prompt_spec``; this module holds the passes over a whole input.

The whole input is validated before anything is sent or written, known request parameters and,
given the model table, each prompt against its model's context window included. Every bad line is a
problem of its own: the check goes on to the end and raises one ``InputError`` naming up to
``MAX_PROBLEMS`` of them (file, line and field each), so a file is fixed in one go. ``check_prompts``
does so in one streaming pass, holding 16 bytes per prompt (hashes of ids and requests) and, when asked, keeping
the prompts for the store (``KeptPrompts``: past a few thousand, in a temporary file), so that a job of millions of
prompts is parsed once; ``iter_prompts`` reads an input again as a stream when nothing was kept.
"""

from __future__ import annotations

import difflib
import hashlib
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .._endpoints import DEFAULT_ENDPOINT
from .._exceptions import InputError
from ._input_files import PromptSource, records
from ._kept import KeptPrompts
from .._hashes import HashBag, RepeatedKeys, key_hash, text_hash
from ..wire._anthropic import has_max_tokens
from ..rules._model_rules import DEFAULT_THINKING_MAX_TOKENS, thinking_room
from ..rules._claude_rules import anthropic_max_tokens, anthropic_thinks
from .._params import counted, shown
from ..pricing._pricing import PriceTable
from ._prompt_spec import PromptSpec, prompt_spec
from .._providers import ProviderTable, table_of
from ..pricing._routing import parse_deadline
from .._settings import DEFAULT_ANTHROPIC_VERSION, DEFAULT_MAX_TOKENS

__all__ = [
    "MAX_PROBLEMS",
    "InputCheck",
    "PromptSource",
    "RepeatedKeys",
    "check_prompts",
    "fingerprint",
    "iter_prompts",
    "parse_prompt_dicts",
    "read_prompts",
]

logger = logging.getLogger(__name__)

# Bad lines named by one failed check: enough to fix a file in one go, few enough to read.
MAX_PROBLEMS = 20


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
    # The checked prompts themselves, in input order, when the check was asked to keep them (``keep``) and there
    # were no more, or to spill them (``spill``): storing them needs no second pass over the input.
    specs: KeptPrompts | None = field(default=None, repr=False, compare=False)


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
    model_providers: Mapping[str, str] | ProviderTable | None = None,
    default_max_tokens: int = DEFAULT_MAX_TOKENS,
    anthropic_version: str = DEFAULT_ANTHROPIC_VERSION,
    warn: bool = True,
    keep: int = 0,
    spill: bool = False,
    allow_unknown_model: bool = False,
    each: Callable[[PromptSpec], object] | None = None,
) -> InputCheck:
    """Validate the whole input as ``read_prompts`` does, in one streaming pass (a second one only
    when two ids may be the same): its count, fingerprint and repeated requests, no prompt held.

    Each prompt is refused what its model refuses (``_model_rules``; Anthropic's under ``anthropic_version``),
    and one whose provider (``model_providers``, then claude-* -> anthropic) is Anthropic any parameter Anthropic
    cannot take. Anthropic prompts with no max_tokens make one warning for the whole input, and deadlines already
    past another, returned as ``warnings`` and logged unless ``warn`` is false (a caller that checks twice warns
    once). Raises ``InputError`` naming every bad line (up to ``MAX_PROBLEMS``). An input of at most ``keep`` prompts
    comes back with them (``InputCheck.specs``); with ``spill``, any input does, those past ``keep`` kept in a temporary
    file (``KeptPrompts``), so that storing them parses the input no second time. ``each`` is called with every prompt
    that passes its checks, in input order, in the same pass (a caller that routes or prices them reads the input once); an input that turns out
    bad raises all the same, so whatever ``each`` summed is to be thrown away then.

    With ``table``, a model it does not name (its own names, aliases and dated snapshots; the user's price file
    merged in) is refused unless the user declared it (a pattern of ``model_providers`` matches it) or
    ``allow_unknown_model``: then a warning says its cost is unknown. A misspelt model is never sent."""
    digest = hashlib.sha256()
    ids, keys = HashBag(), HashBag()
    count = uncapped = thinking = past = 0
    thinking_default = max(default_max_tokens, DEFAULT_THINKING_MAX_TOKENS)
    first_past: tuple[int, str] | None = None
    problems = _Problems()
    where, _ = records(source)
    resolve = table_of(model_providers).resolve
    providers: set[str] = set()
    now = datetime.now(timezone.utc)
    # Model -> prompts, for models whose provider has announced a shutdown.
    retiring: dict[str, int] = {}
    # Model -> [prompts, first line], for models the catalog does not name and the user did not declare.
    unknown: dict[str, list[int]] = {}
    # Model -> whether the user declared it theirs (``_declared``), found once each.
    declared: dict[str, bool] = {}
    # Reasoning prompts whose reply cap leaves too little room for their thinking: how many, the first line, and
    # the cap that leaves room for the largest.
    cramped, first_cramped, room = 0, 0, 0
    kept: KeptPrompts | None = KeptPrompts(in_memory=keep, spill=spill) if keep > 0 or spill else None
    for line, spec in _iter_specs(source, default_model=default_model, default_params=default_params,
                                  default_endpoint=default_endpoint, table=table,
                                  model_providers=model_providers, now=now, anthropic_version=anthropic_version):
        if isinstance(spec, InputError):
            problems.add(spec)
            continue
        if spec.deadline is not None and parse_deadline(spec.deadline, now=now) < now:
            past += 1
            first_past = first_past or (line, spec.deadline)
        # Its provider's name, and the wire whose rules its model (as sent, ``upstream``) follows.
        provider, wire, _, upstream = resolve(spec.model)
        if wire == "anthropic" and not has_max_tokens(spec.params):
            cap = anthropic_max_tokens(upstream, spec.params, default=default_max_tokens,
                                       thinking_default=thinking_default)
            most = table.limits_for(spec.model) if table is not None else None
            if most is not None and most.max_output_tokens and cap > most.max_output_tokens:
                problems.add(InputError(
                    f"{spec.model} replies with at most {most.max_output_tokens:,} tokens but the default max_tokens "
                    f"is {cap:,}; set params.max_tokens or lower LLM_DISPATCH_DEFAULT_MAX_TOKENS",
                    path=where, line=line, field="params.max_tokens"))
                continue
            uncapped += 1
            thinking += anthropic_thinks(upstream, spec.params)
        _add_to_fingerprint(digest, spec)
        ids.add(text_hash(spec.custom_id))
        keys.add(key_hash(spec.dedupe_key))
        count += 1
        if each is not None:
            each(spec)
        if kept is not None and not kept.add(spec):
            kept.close()
            kept = None
        providers.add(provider)
        if table is not None and table.model_name(spec.model) is None:
            if spec.model not in declared:
                declared[spec.model] = _declared(spec.model, table_of(model_providers), table=table)
            if not declared[spec.model]:
                seen = unknown.setdefault(spec.model, [0, line])
                seen[0] += 1
        needs = thinking_room(upstream, spec.params, provider=wire)
        if needs is not None:
            cramped += 1
            first_cramped = first_cramped or line
            room = max(room, needs)
        if table is not None and table.shutdown_ahead(spec.model) is not None:
            retiring[spec.model] = retiring.get(spec.model, 0) + 1
    clashes = ids.repeated()
    if clashes:
        for problem in _duplicate_ids(source, clashes=clashes, where=where, default_model=default_model,
                                      default_params=default_params, default_endpoint=default_endpoint,
                                      model_providers=model_providers,
                                      anthropic_version=anthropic_version):
            problems.add(problem)
    if problems.total and kept is not None:
        kept.close()
    problems.raise_any()
    if not count:
        raise InputError("no prompts found; each line needs a 'prompt' or 'messages'", path=where)
    warnings: list[str] = []
    if unknown and not allow_unknown_model:
        refused = [_unknown_model(model, prompts=prompts, line=line, table=table, where=where)
                   for model, (prompts, line) in unknown.items()]
        raise InputError.several(refused, total=len(refused))
    for model, (prompts, line) in unknown.items():
        warnings.append(f"{where}: {counted(prompts, 'prompt')} use{'s' if prompts == 1 else ''} {model}, which is "
                        f"not in the price catalog (first on line {line}): sent as given, its cost unknown")
    if cramped:
        warnings.append(
            f"{where}: {counted(cramped, 'prompt')} to a reasoning model leave{'s' if cramped == 1 else ''} too "
            f"little room for its thinking (the first on line {first_cramped}): their answers may be cut at "
            f"max_completion_tokens; raise it to {room:,} or set reasoning_effort lower ('none' where the model "
            "takes it)")
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
                      warnings=tuple(warnings), providers=frozenset(providers),
                      specs=kept if kept is not None and kept.done() else None)


def _declared(model: str, providers: ProviderTable, *, table: PriceTable) -> bool:
    """Whether ``model`` is the user's own though the catalog does not name it: a declared provider's, mapped in
    ``model_providers`` (its exact name or a glob matching it), or a fine-tune of a catalog model (OpenAI's
    ``ft:BASE:ORG::ID``: no typo makes one)."""
    if model.startswith("ft:") and table.model_name(model.split(":")[1]) is not None:
        return True
    return providers.declared_model(model)


def _unknown_model(model: str, *, prompts: int, line: int, table: PriceTable | None, where: str) -> InputError:
    """The line refusing ``model``: how many prompts use it, where first, the catalog's nearest names, and how to
    send it anyway."""
    names = [] if table is None else [*table.models, *table.aliases]
    near = difflib.get_close_matches(model, names, n=1, cutoff=0.75)
    hint = f"did you mean {near[0]}?" if near else "`llm-dispatch models` lists the catalog"
    return InputError(f"unknown model {shown(model)} ({counted(prompts, 'prompt')}, first on line {line}); {hint} "
                      "(your own model: give it in --prices-file or LLM_DISPATCH_MODEL_PROVIDERS, or pass "
                      "--allow-unknown-model)", path=where)


def _duplicate_ids(
    source: PromptSource,
    *,
    clashes: set[int],
    where: str,
    default_model: str,
    default_params: Mapping[str, Any] | None,
    default_endpoint: str = DEFAULT_ENDPOINT,
    model_providers: Mapping[str, str] | ProviderTable | None = None,
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
    model_providers: Mapping[str, str] | ProviderTable | None = None,
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
    model_providers: Mapping[str, str] | ProviderTable | None = None,
    now: datetime,
    anthropic_version: str = DEFAULT_ANTHROPIC_VERSION,
) -> Iterator[tuple[int, PromptSpec | InputError]]:
    """Each record's line number and its spec, or the ``InputError`` that says why it cannot be one."""
    where, lines = records(source)
    resolve = table_of(model_providers).resolve
    from_file = isinstance(source, (str, Path))
    for position, (number, record) in enumerate(lines):
        if isinstance(record, InputError):
            yield number, record
            continue
        try:
            yield number, prompt_spec(record, where=where, line=number, position=position, default_model=default_model,
                                default_params=default_params, default_endpoint=default_endpoint, table=table,
                                resolve=resolve, now=now,
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
    model_providers: Mapping[str, str] | ProviderTable | None = None,
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
    model_providers: Mapping[str, str] | ProviderTable | None = None,
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
    model_providers: Mapping[str, str] | ProviderTable | None = None,
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
