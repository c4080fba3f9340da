"""``llm-dispatch budget``: set a named budget's limit, and show where each budget stands, period by period.

Every command imports this module: what only a budget command needs is imported when it runs."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from llm_dispatch import storage
from llm_dispatch.core import BUDGET_PERIODS, ConfigError, Settings, from_pico, to_json

from ._common import AsJson, DatabaseUrl, _Commands, _settings, out

budget_app = typer.Typer(cls=_Commands, no_args_is_help=True,
                         help="Spending caps shared by every run, shard and worker that names them (--budget-name).")


@budget_app.command("set")
def budget_set(
    name: Annotated[str, typer.Argument(help="the budget's name, as runs give it with --budget-name")],
    limit: Annotated[float, typer.Option("--limit", help="dollars per period")],
    per: Annotated[str, typer.Option("--per", help="the period the limit holds over: day|month|total (UTC)")] = "total",
    database_url: DatabaseUrl = None,
    as_json: AsJson = False,
) -> None:
    """Create a named budget or change its limit; runs holding it see the new limit at their next reservation."""
    settings = _settings(database_url=database_url)
    row = asyncio.run(set_budget(settings=settings, name=name, limit=limit, per=per))
    if as_json:
        out.print_json(json.dumps(row))
    else:
        print_budgets(out, [row])


@budget_app.command("show")
def budget_show(
    name: Annotated[Optional[str], typer.Argument(help="one budget (default: all, jobs' own included)")] = None,
    history: Annotated[bool, typer.Option("--history", help="earlier periods too")] = False,
    database_url: DatabaseUrl = None,
    as_json: AsJson = False,
) -> None:
    """Where each budget stands this period: its limit, what was spent, what runs hold reserved, what is left."""
    settings = _settings(database_url=database_url)
    rows = asyncio.run(show_budgets(settings=settings, name=name, history=history))
    if as_json:
        out.print_json(json.dumps(rows))
    else:
        print_budgets(out, rows)


# The names ``--budget`` gives a job's own budget; not for ``budget set``.
_JOB_PREFIX = "job:"


async def set_budget(*, settings: Settings, name: str, limit: float, per: str) -> dict[str, Any]:
    """Create or change budget ``name``; what it now stands at, as ``show_budgets`` gives it."""
    from llm_dispatch.jobs import to_pico

    if per not in BUDGET_PERIODS:
        raise ConfigError(f"--per must be one of {', '.join(BUDGET_PERIODS)}, not {per!r}")
    if not name.strip() or name.startswith(_JOB_PREFIX):
        raise ConfigError(f"a budget's name must not be empty or start with {_JOB_PREFIX!r} (a job's own budget: "
                          "`llm-dispatch run --resume JOB --budget USD` sets that one)")
    if limit < 0:
        raise ConfigError("--limit must be 0 or more dollars")
    # A new database is made here: a budget may be set before the first run.
    async with storage.open_database(settings.database_url) as sessions:
        await storage.set_budget(sessions, name=name, limit_pico_usd=to_pico(limit), per=per)
        return (await _usages(sessions, name=name, history=False))[0]


async def show_budgets(*, settings: Settings, name: str | None, history: bool) -> list[dict[str, Any]]:
    """Each budget's current period (``history``: and every earlier one that spent anything): limit, spent,
    reserved, left, in dollars."""
    from .reports import require_database

    require_database(settings)
    async with storage.open_database(settings.database_url) as sessions:
        found = await _usages(sessions, name=name, history=history)
    if name is not None and not found:
        raise ConfigError(f"no budget named {name!r}; `llm-dispatch budget show` lists them, "
                          f"`llm-dispatch budget set {name} --limit USD --per day|month|total` makes it")
    return found


async def _usages(sessions: storage.Sessions, *, name: str | None, history: bool) -> list[dict[str, Any]]:
    return [{"name": usage.name, "per": usage.per, "period": usage.period,
             **to_json({key: from_pico(getattr(usage, f"{key}_pico_usd")) for key in ("limit", "spent", "reserved",
                                                                                      "left")})}
            for usage in await storage.budget_usage(sessions, name=name, history=history)]


def print_budgets(console: Console, rows: list[dict[str, Any]]) -> None:
    if not rows:
        console.print("no budgets yet: `llm-dispatch budget set NAME --limit USD --per day|month|total` makes one, "
                      "`llm-dispatch run FILE --budget USD` one for a job", highlight=False)
        return
    table = Table(title="budgets")
    for column in ("budget", "per", "period", "limit", "spent", "reserved", "left"):
        table.add_column(column, justify="left" if column in ("budget", "per", "period") else "right")
    for row in rows:
        table.add_row(row["name"], row["per"], row["period"],
                      *(f"${row[key]:.6f}" for key in ("limit", "spent", "reserved", "left")))
    console.print(table)

