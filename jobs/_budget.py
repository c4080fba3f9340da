"""Which budget a run holds (``--budget`` for its job, or ``--budget-name``), and where it stands, for reports."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import ClassVar

from llm_dispatch import storage
from llm_dispatch.core import PICO_PER_USD, ConfigError, Settings, from_pico, job_budget_name

from ._costs import JobCost, money

__all__ = ["BudgetStanding", "budget_standing", "check_budget_bounds", "job_budget_standings", "run_budget", "to_pico"]


def to_pico(dollars: float) -> int:
    """Whole picodollars of a dollar figure a user gave."""
    return int(Decimal(str(dollars)) * PICO_PER_USD)


async def run_budget(settings: Settings, *, sessions: storage.Sessions, job_id: str) -> storage.BudgetInfo | None:
    """The budget a run of job ``job_id`` holds, if any: ``settings.budget`` is the job's own (made, or its limit
    set, here), ``settings.budget_name`` one made by ``llm-dispatch budget set``; with neither, the job's own
    if an earlier run gave it one (a job's limit holds for every run of it, and only a higher one lifts it)."""
    if settings.budget is not None and settings.budget_name is not None:
        raise ConfigError("give --budget (the job's own limit) or --budget-name (a shared budget), not both")
    if settings.budget is not None:
        return await storage.set_job_budget(sessions, job_id=job_id, limit_pico_usd=to_pico(settings.budget))
    if settings.budget_name is not None:
        found = await storage.get_budget(sessions, name=settings.budget_name)
        if found is None:
            raise ConfigError(f"no budget named {settings.budget_name!r} in this database; create it with "
                              f"`llm-dispatch budget set {settings.budget_name} --limit USD --per day|month|total`")
        await storage.note_job_budget(sessions, job_id=job_id, name=found.name)
        return found
    return await storage.get_budget(sessions, name=job_budget_name(job_id))


def check_budget_bounds(estimate: JobCost, *, budget: storage.BudgetInfo) -> None:
    """A budget holds a request's worst case before sending it: refuse (before anything is sent) prompts whose
    worst case has no bound or no price."""
    if estimate.max_total is None:
        models = ", ".join(sorted(estimate.unbounded_models))
        raise ConfigError(f"cannot hold budget {_shown(budget.name)}: no max_tokens and no maximum output known for "
                          f"{models}; give the prompts max_tokens. Nothing was sent")
    if not estimate.complete:
        models = ", ".join(sorted(estimate.totals.unpriced_models))
        raise ConfigError(f"cannot hold budget {_shown(budget.name)}: no price for {models}; add it to a price file "
                          "(LLM_DISPATCH_PRICES_FILE). Nothing was sent")


def _shown(name: str) -> str:
    return "--budget" if name.startswith("job:") else repr(name)


@dataclass(frozen=True, slots=True)
class BudgetStanding:
    """A budget's current period as a run left it: its limit, what was spent and is reserved, what is left; and
    whether the run stopped on it (``over_budget`` prompts left pending because their worst case did not fit)."""

    name: str
    per: str
    period: str
    limit: Decimal
    spent: Decimal
    reserved: Decimal
    left: Decimal
    over_budget: int = 0
    # Written by ``core.to_json`` after the fields.
    json_properties: ClassVar[tuple[str, ...]] = ("label", "stopped")

    @property
    def stopped(self) -> bool:
        return self.over_budget > 0

    def describe(self) -> str:
        """One line: what stopped the run, and the figures."""
        return (f"budget {_shown(self.name)} reached: spent ${money(self.spent):.6f}, reserved "
                f"${money(self.reserved):.6f}, left ${money(self.left):.6f} of ${money(self.limit):.6f}"
                + ("" if self.per == "total" else f" this {self.per} ({self.period})"))

    @property
    def label(self) -> str:
        """How the user named it: ``--budget`` for a job's own, else its name."""
        return _shown(self.name)


async def budget_standing(
    sessions: storage.Sessions, *, budget: storage.BudgetInfo, over_budget: int = 0
) -> BudgetStanding | None:
    """Where ``budget`` stands now (its current period)."""
    found = await storage.budget_usage(sessions, name=budget.name)
    if not found:
        return None
    usage = found[0]
    return BudgetStanding(name=usage.name, per=usage.per, period=usage.period,
                          limit=from_pico(usage.limit_pico_usd), spent=from_pico(usage.spent_pico_usd),
                          reserved=from_pico(usage.reserved_pico_usd), left=from_pico(usage.left_pico_usd),
                          over_budget=over_budget)


async def job_budget_standings(sessions: storage.Sessions, *, job_id: str) -> list[BudgetStanding]:
    """Where each budget holding job ``job_id`` stands now: its own (``--budget``), then the named one its latest run
    held (``--budget-name``: the whole budget's current period, every job's spending on it)."""
    return [standing for budget in await storage.budgets_of_job(sessions, job_id=job_id)
            if (standing := await budget_standing(sessions, budget=budget)) is not None]
