"""What every ``llm-dispatch`` command shares: its consoles, common options and settings, the exit codes, and the
command group that turns any error of llm-dispatch's tree into one line and its exit code."""

from __future__ import annotations

import sys
from contextvars import ContextVar
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

from llm_dispatch.core import RUN_OPTIONS, APIError, ConfigError, Door, LLMDispatchError, Settings, run_option


def run_flag(name: str, **click: Any) -> Any:
    """The ``run`` command's option for the run option ``name`` (its flows' name): its flags and help as the
    declaration (``core.RUN_OPTIONS``) gives them; ``click``: what only the command checks (``min``, ``max``)."""
    option = run_option(name)
    return typer.Option(*option.flags, help=option.taken("cli").help, **click)


def run_argument(name: str) -> Any:
    """The ``run`` command's argument for the run option ``name``, its help as the declaration gives it."""
    return typer.Argument(help=run_option(name).taken("cli").help)


if TYPE_CHECKING:
    # The context TyperGroup.invoke takes: Typer 0.29 vendors Click, whose Context is no longer click's.
    from typer._click.core import Context

# Options several commands take alike.
DatabaseUrl = Annotated[Optional[str], run_flag("database_url")]
AsJson = Annotated[bool, typer.Option("--json", help="print as JSON")]

err = Console(stderr=True)
# Piped or captured output gets room for the whole table, not 80 columns.
out = Console() if sys.stdout.isatty() else Console(width=160)

# Exit codes (README, "Exit codes"); a signal that stops a run exits 128 + its number.
EXIT_FAILED_PROMPTS = 1  # the run ended with prompts that failed
EXIT_INPUT = 2  # bad input, settings or database, or a refused --max-cost: nothing was sent
EXIT_PROVIDER = 3  # a provider call failed after its retries (network, key, refusal); what came back is stored
EXIT_BUDGET = 4  # the budget was reached: what was sent is stored, the rest is pending

EXIT_CODES = ("Exit codes: 0 done; 1 some prompts failed; 2 bad input, settings or database, or --max-cost refused "
              "(nothing sent); 3 a provider call failed after its retries (what came back is stored: run again "
              "later); 4 the budget was reached (the rest is pending: run again with a higher --budget); 128+N "
              "stopped by signal N.")


def exit_code(error: LLMDispatchError) -> int:
    """The exit code of a command that stopped on ``error``."""
    return EXIT_PROVIDER if isinstance(error, APIError) else EXIT_INPUT


def expected_error(exc: BaseException) -> LLMDispatchError | None:
    """``exc`` when it is one of ours; for a group of errors (two halves of a run failing together), its first
    when every one is ours; else None (a bug: its traceback is worth showing)."""
    if isinstance(exc, LLMDispatchError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        leaves = [expected_error(inner) for inner in exc.exceptions]
        if leaves and all(leaf is not None for leaf in leaves):
            return leaves[0]
    return None


# Whether the running command was given ``--debug`` (an option of the command group), set by ``_Commands.invoke``:
# not read through click.get_current_context, which does not see the context of a Typer that vendors Click.
_DEBUG: ContextVar[bool] = ContextVar("llm_dispatch_debug", default=False)


def _debug() -> bool:
    """Whether ``--debug`` was given to the running command."""
    return _DEBUG.get()


class _Commands(TyperGroup):
    """The command group: any error of llm-dispatch's tree becomes one line and its exit code (the traceback with
    ``--debug``); an error outside it is a bug, shown as Python shows it."""

    def invoke(self, ctx: Context) -> Any:
        debug = _DEBUG.set(bool(ctx.params.get("debug")))
        try:
            return super().invoke(ctx)
        except (LLMDispatchError, BaseExceptionGroup) as exc:
            error = expected_error(exc)
            if error is None or ctx.params.get("debug"):
                raise
            raise _fail(str(error), code=exit_code(error)) from None
        finally:
            _DEBUG.reset(debug)


def _fail(message: str, *, code: int = EXIT_INPUT) -> typer.Exit:
    """Each line of ``message`` printed as an error line (a file's bad lines are one each), then exit ``code``."""
    for line in message.splitlines() or [""]:
        err.print(f"[bold red]error:[/] {escape(line)}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


def given_as(setting: str, *, door: Door = "cli") -> str:
    """How the user gave ``setting`` at ``door``: the ``run`` command's flag (``--route``), ``run_prompts``'s
    keyword (``route``)."""
    for option in RUN_OPTIONS:
        if option.setting == setting and door in option.doors:
            if door == "cli":
                return option.flags[0].split("/")[0] if option.flags else "--" + option.taken(door).name.replace("_", "-")
            return option.taken(door).name
    return "--" + setting.replace("_", "-") if door == "cli" else setting


def _settings(*, door: Door = "cli", **overrides: Any) -> Settings:
    """Settings from the environment with ``overrides`` on top (None: not given), for a command (``door`` cli) or
    ``run_prompts`` (python); a bad one (a database URL that cannot work included) is a ``ConfigError`` naming
    where it came from: the flag or keyword when given, else the environment variable (a command says it in one
    line, exit 2)."""
    from llm_dispatch.storage import check_database_url

    given = {key: value for key, value in overrides.items() if value is not None}
    try:
        settings = Settings(**given)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        setting = str(first["loc"][0]) if first["loc"] else field
        if setting in given:
            raise ConfigError(f"{given_as(setting, door=door)}: {first['msg']}, not {first['input']!r}") from None
        raise ConfigError(f"setting {field}: {first['msg']} (env LLM_DISPATCH_{field.upper()})") from None
    url_given = "database_url" in given
    check_database_url(settings.database_url,
                       given_as=given_as("database_url", door=door) if url_given else "LLM_DISPATCH_DATABASE_URL")
    return settings
