"""A run's options, declared once: every door that starts a run (the ``run`` command, ``run_prompts``, the
``dispatch``, ``realtime-dispatch`` and ``dispatch-directory`` flows, and the parameters ``dispatch`` hands each
real-time shard) takes the options this table gives it, under its name, type and default there;
``tests/test_run_options.py`` fails when a door drifts from it. The settings a door's values override, and the values
a flow run or a shard is given, are built from it too (``setting_overrides``, ``flow_parameters``,
``shard_parameters``), never listed again.

The flows keep real signatures (Prefect builds their parameter schema, and ``prefect deploy`` reads it from the
source, from the function's own definition); the command's flags and help are made from the table (``cli``'s
``run_flag``).
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, get_args

from pydantic import SecretStr

from ._endpoints import Endpoint
from ._status import RetryFailed, Route, RoutePolicy

if TYPE_CHECKING:
    from ._settings import Settings

__all__ = ["DOORS", "REQUIRED", "RUN_OPTIONS", "Door", "DoorParameter", "RunOption", "Taken", "door_parameters",
           "flow_parameters", "run_option", "setting_overrides", "shard_parameters"]

# ``cli``: ``llm-dispatch run``; ``python``: ``run_prompts`` / ``arun_prompts``; ``dispatch``, ``realtime`` and
# ``directory``: the parameters of the flows ``dispatch``, ``realtime-dispatch`` and ``dispatch-directory``; ``shard``:
# the parameters ``dispatch`` gives each ``realtime-dispatch`` run of a shard.
Door = Literal["cli", "python", "dispatch", "realtime", "directory", "shard"]
DOORS: Final[tuple[Door, ...]] = get_args(Door)

# A parameter with no default (a keyword that must be given).
REQUIRED: Final = inspect.Parameter.empty

_SAME: Final = object()


@dataclass(frozen=True, slots=True)
class Taken:
    """How one door takes an option where it differs from the flows': its name, type, default or help there."""

    name: str | None = None
    type: object = _SAME
    default: object = _SAME
    help: str | None = None


@dataclass(frozen=True, slots=True)
class DoorParameter:
    """An option as one door takes it."""

    name: str
    type: object
    default: object
    help: str
    option: RunOption


@dataclass(frozen=True, slots=True)
class RunOption:
    """One option of a run. ``name``, ``type`` and ``default`` are the flows' (the parameter's name, its annotation,
    its default) and a shard's parameter key; ``setting`` is the ``Settings`` field it overrides (environment
    ``LLM_DISPATCH_<SETTING>``): given as None, the setting's value stands. ``doors`` take it; ``at`` says how a door
    takes it where that differs; ``flags``: the command's flags, where not ``--name-at-the-command``."""

    name: str
    type: object
    default: object
    help: str
    doors: frozenset[Door]
    setting: str | None = None
    at: Mapping[Door, Taken] = field(default_factory=dict)
    flags: tuple[str, ...] = ()

    def taken(self, door: Door) -> DoorParameter:
        """The option as ``door`` takes it (a ``KeyError`` when it does not)."""
        if door not in self.doors:
            raise KeyError(f"{door} takes no option {self.name!r}")
        given = self.at.get(door, Taken())
        return DoorParameter(name=given.name or self.name,
                             type=self.type if given.type is _SAME else given.type,
                             default=self.default if given.default is _SAME else given.default,
                             help=given.help or self.help, option=self)

    @property
    def env(self) -> str | None:
        """The environment variable of its setting."""
        return None if self.setting is None else f"LLM_DISPATCH_{self.setting.upper()}"


# dispatch-directory, a schedule's door, takes a few options; the workers' environment gives it the rest.
_ALL: Final[frozenset[Door]] = frozenset(DOORS) - {"directory"}
_FLOWS: Final[frozenset[Door]] = frozenset({"dispatch", "realtime"})
# The doors a user starts a run by (a shard is a run its parent starts).
_RUNS: Final[frozenset[Door]] = frozenset({"cli", "python", "dispatch", "realtime"})
_FLOWS_AND_SHARD: Final[frozenset[Door]] = _FLOWS | {"shard"}
_COMMAND: Final[frozenset[Door]] = frozenset({"cli", "python"})


def _option(name: str, type: object, default: object, help: str, *, doors: frozenset[Door],
            setting: str | None = None, flags: tuple[str, ...] = (), **at: Taken) -> RunOption:
    return RunOption(name=name, type=type, default=default, help=help, doors=doors, setting=setting,
                     at=at, flags=flags)  # type: ignore[arg-type]


# The command's options in the order ``llm-dispatch run --help`` lists them, the flows' own among them.
RUN_OPTIONS: Final[tuple[RunOption, ...]] = (
    _option("prompts", str | list[dict[str, Any]] | None, None,
            "a .jsonl or .csv file's path, or the prompts themselves (dicts shaped like a .jsonl line)",
            doors=_RUNS,
            cli=Taken(name="file", type=Path | None, help="a .jsonl or .csv file of prompts"),
            python=Taken(type=str | os.PathLike[str] | Sequence[str | Mapping[str, Any]], default=REQUIRED)),
    # A shard's job is its parent's.
    _option("job_id", str | None, None,
            "the job to resume: its id (or the id's first characters) or its name; no FILE needed",
            doors=_FLOWS_AND_SHARD | {"cli"}, cli=Taken(name="resume"), flags=("--resume",)),
    _option("new_job", bool, False,
            "start a new job even if FILE was run before (default: resume the job FILE already is)",
            doors=_RUNS | {"directory"}, flags=("--new-job",)),
    # A shard is named for its share of its parent's job (``input_run_name``).
    _option("job_name", str | None, None,
            "name the job; a run with the same name and FILE resumes it, another name starts a new one",
            doors=_RUNS | {"shard"}, flags=("--job-name",)),
    _option("simulate", bool, False, "send to the bundled simulator: no key, no network", doors=_COMMAND,
            flags=("--simulate",)),
    _option("model", str | None, None, "default model for prompts that name none", doors=_ALL | {"directory"},
            setting="model"),
    _option("allow_unknown_model", bool | None, None,
            "send a model the price catalog does not name (else refused as a likely typo), its cost unknown",
            doors=_ALL, setting="allow_unknown_model", flags=("--allow-unknown-model",),
            cli=Taken(type=bool, default=False), python=Taken(type=bool, default=False)),
    _option("endpoint", Endpoint | None, None,
            "endpoint for prompts that name none: chat|responses|embeddings (default chat)",
            doors=_ALL, setting="endpoint", cli=Taken(type=str | None)),
    _option("concurrency", int | None, None, "requests in flight per run", doors=_ALL,
            setting="concurrency"),
    _option("chunk_size", int | None, None, "prompts per Prefect task", doors=_ALL - {"python"},
            setting="chunk_size"),
    _option("chunk_concurrency", int | None, None, "requests in flight per chunk task (default: concurrency)",
            doors=_FLOWS_AND_SHARD, setting="chunk_concurrency"),
    _option("concurrency_tag", str | None, None,
            "the Prefect concurrency tag every chunk task runs under, its limit shared by all runs",
            doors=_FLOWS_AND_SHARD, setting="concurrency_tag"),
    _option("dedupe", bool | None, None, "reuse stored answers to identical requests", doors=_ALL - {"python"},
            setting="dedupe", flags=("--dedupe/--no-dedupe",), cli=Taken(type=bool, default=True)),
    # The command checks the word itself, saying which it takes.
    _option("retry_failed", RetryFailed, "retryable", "on resume, resend failed prompts: retryable|all|none",
            doors=_ALL, cli=Taken(type=str)),
    # Not a shard's: its parent reopens them once, for every shard, before they start.
    _option("retry_refused", bool, False,
            "on resume, ask the prompts the model refused again (each is paid again)",
            doors=_FLOWS | {"cli"}, flags=("--retry-refused",)),
    # Not realtime-dispatch's: it records every prompt real-time, routing none.
    _option("route_policy", RoutePolicy | None, None,
            "rule for prompts with no urgency or deadline: length|all-realtime|all-batch (default length)",
            doors=frozenset({"cli", "python", "dispatch", "directory"}), setting="route_policy",
            cli=Taken(name="route", type=str | None), python=Taken(name="route")),
    _option("urgent_below_chars", int | None, None,
            "the length policy's line: shorter prompts are urgent (default 1000 characters)",
            doors=frozenset({"dispatch"}), setting="urgent_below_chars"),
    _option("wait", bool, False, "follow batches to the end here, or submit them and leave them to `collect`",
            doors=frozenset({"cli", "python", "dispatch", "directory"}), flags=("--wait/--no-wait",),
            cli=Taken(default=True), python=Taken(default=True)),
    _option("max_cost", float | None, None, "refuse the run if its estimate is above this many dollars",
            doors=frozenset({"cli", "python", "dispatch", "directory"})),
    # A shard's state is read by its parent alone, which counts the job's failed prompts against its own.
    _option("fail_above", float, 0.0,
            "share of the job's prompts (0-1) that may fail with the run still Completed in Prefect and exit 0; "
            "default 0: any failed prompt makes the run Failed (exit 1)",
            doors=_FLOWS | {"cli"}, flags=("--fail-above",)),
    _option("budget", float | None, None,
            "the most the job may spend, in dollars, over all its runs: each request's worst case is reserved "
            "before it is sent (env LLM_DISPATCH_BUDGET)",
            doors=_ALL, setting="budget"),
    _option("budget_name", str | None, None,
            "hold a named budget (`llm-dispatch budget set`) shared with every run naming it",
            doors=_ALL, setting="budget_name", flags=("--budget-name",)),
    _option("prices_file", str | None, None, "your own price table (JSON), over the bundled one",
            doors=_ALL, setting="prices_file",
            cli=Taken(type=Path | None), python=Taken(type=str | os.PathLike[str] | None)),
    _option("providers_file", str | None, None,
            "your providers file (TOML or JSON): providers beyond OpenAI, Anthropic and Gemini, with their models",
            doors=_ALL, setting="providers_file",
            cli=Taken(type=Path | None), python=Taken(type=str | os.PathLike[str] | None)),
    _option("answer_schema", str | dict[str, Any] | None, None,
            "every answer's schema (unless a prompt gives its own): a JSON Schema file or module:Model",
            doors=_ALL, setting="response_schema", flags=("--schema",),
            cli=Taken(name="schema", type=str | None),
            # A Pydantic model class, each valid answer returned as an instance of it.
            python=Taken(name="schema", type=type[Any] | None)),
    _option("max_reasks", int | None, None, "times an answer that breaks its schema is asked again (default 2)",
            doors=_ALL, setting="max_reasks", flags=("--max-reasks",)),
    _option("cache_plan", bool | None, None,
            "plan each provider's prompt cache for prompts sharing a prefix (keys, breakpoints, warm-ups; default on)",
            doors=_ALL, setting="cache_plan", flags=("--cache-plan/--no-cache-plan",)),
    # Not a shard's: a SecretStr parameter reaches the Prefect API masked; the workers' environment names the database.
    _option("database_url", SecretStr | None, None, "SQLAlchemy URL (default: ./llm_dispatch.db)",
            doors=_RUNS, setting="database_url", cli=Taken(type=str | None), python=Taken(type=str | None)),
    _option("sim_latency", float, 0.2, "with --simulate: seconds per request", doors=_COMMAND),
    _option("json", bool, False, "print the summary as JSON", doors=frozenset({"cli"}), flags=("--json",),
            cli=Taken(name="as_json")),
    _option("base_url", str | None, None, "OpenAI's (or an OpenAI-compatible) API's base URL",
            doors=_FLOWS_AND_SHARD, setting="base_url"),
    _option("anthropic_base_url", str | None, None, "Anthropic's API's base URL", doors=_FLOWS_AND_SHARD,
            setting="anthropic_base_url"),
    _option("gemini_base_url", str | None, None, "Gemini's API's base URL (the host)", doors=_FLOWS_AND_SHARD,
            setting="gemini_base_url"),
    _option("provider_base_urls", dict[str, str] | None, None,
            "declared provider -> its API's base URL, over the providers file's", doors=_FLOWS_AND_SHARD,
            setting="provider_base_urls"),
    _option("batch_poll_interval", float | None, None, "first wait between polls of a batch, seconds",
            doors=frozenset({"dispatch"}), setting="batch_poll_interval"),
    _option("shards", int, 1,
            "runs of realtime_deployment the real-time half is split into, so several workers share the job",
            doors=_FLOWS_AND_SHARD,
            realtime=Taken(type=int | None, default=None, help="how many shards the job's prompts are split into")),
    _option("realtime_deployment", str, "realtime-dispatch/realtime", "the deployment each shard runs",
            doors=frozenset({"dispatch"})),
    _option("shard", int | None, None, "the one share of the prompts this run sends (with shards)",
            doors=frozenset({"realtime", "shard"})),
    _option("planned_route", Route | None, None, "only the prompts routed here",
            doors=frozenset({"realtime", "shard"})),
    _option("directory", str, REQUIRED, "the folder the prompt files are dropped in",
            doors=frozenset({"directory"})),
    _option("pattern", str, "*.jsonl", "which of its files are prompt files (a glob)",
            doors=frozenset({"directory"})),
)

_BY_NAME: Final[dict[str, RunOption]] = {option.name: option for option in RUN_OPTIONS}


def run_option(name: str) -> RunOption:
    """The option called ``name`` (its flows' name)."""
    return _BY_NAME[name]


def door_parameters(door: Door) -> dict[str, DoorParameter]:
    """Every option ``door`` takes, by its name there."""
    return {taken.name: taken for taken in (option.taken(door) for option in RUN_OPTIONS if door in option.doors)}


def setting_overrides(values: Mapping[str, Any], *, door: Door) -> dict[str, Any]:
    """The ``Settings`` overrides among a door's parameters (``values`` by their names at ``door``, a flow's
    ``locals()`` as it starts): every option the door takes that overrides a setting, under the setting's name; a
    path given as one becomes its text. None means not given (``Settings.with_overrides`` leaves it out)."""
    overrides: dict[str, Any] = {}
    for taken in door_parameters(door).values():
        setting = taken.option.setting
        if setting is not None:
            value = values[taken.name]
            overrides[setting] = os.fspath(value) if isinstance(value, os.PathLike) else value
    return overrides


def flow_parameters(settings: Settings, *, door: Door) -> dict[str, Any]:
    """Every setting the ``door`` flow takes as a parameter, by its parameter's name, with its value in ``settings``:
    a flow run given them runs with these settings whatever its environment says."""
    return {option.name: _masked(option, getattr(settings, option.setting)) for option in RUN_OPTIONS
            if door in option.doors and option.setting is not None}


def _masked(option: RunOption, value: Any) -> Any:
    """A secret setting as the flow takes it, a ``SecretStr``: the Prefect API stores the parameters a run is called
    with, and a ``SecretStr`` is stored masked (a plain string would be stored as it is)."""
    return SecretStr(value) if isinstance(value, str) and option.type == SecretStr | None else value


def shard_parameters(settings: Settings, **run: Any) -> dict[str, Any]:
    """The parameters of a ``realtime-dispatch`` run sending one shard of a ``dispatch`` run with ``settings``: every
    setting its parent runs with (the database URL aside), and ``run``, the shard's own options, each of them."""
    own = {option.name for option in RUN_OPTIONS if "shard" in option.doors and option.setting is None}
    if set(run) != own:
        raise TypeError(f"a shard's own options are {sorted(own)}, given {sorted(run)}")
    return {**flow_parameters(settings, door="shard"), **run}
