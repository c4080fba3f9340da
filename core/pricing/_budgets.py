"""Spending caps: the periods a named budget's limit holds over, and what a budget's holder answers before a
request is sent. The ledger itself (reservations, in the database) is ``storage``'s."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Final, Literal, Protocol, get_args

from .._types import ChatRequest

__all__ = ["BUDGET_PERIODS", "BudgetPeriod", "SpendGate", "job_budget_name", "period_key"]

# A limit per UTC day, per UTC calendar month, or over all time.
BudgetPeriod = Literal["day", "month", "total"]
BUDGET_PERIODS: Final[tuple[str, ...]] = get_args(BudgetPeriod)
# The budget ``--budget USD`` makes for one job: a limit over the job's whole life.
_JOB_BUDGET_PREFIX: Final = "job:"


def period_key(per: str, *, now: datetime | None = None) -> str:
    """The period a spend at ``now`` (UTC, default: now) counts in: ``2026-11-26``, ``2026-11`` or ``total``."""
    when = (now or datetime.now(UTC)).astimezone(UTC)
    if per == "day":
        return when.strftime("%Y-%m-%d")
    if per == "month":
        return when.strftime("%Y-%m")
    if per == "total":
        return "total"
    raise ValueError(f"a budget's period is one of {BUDGET_PERIODS}, not {per!r}")


def job_budget_name(job_id: str) -> str:
    """The name of the budget ``--budget`` holds for one job."""
    return f"{_JOB_BUDGET_PREFIX}{job_id}"


class SpendGate(Protocol):
    """A run's hold on a budget, asked before each request (``send_all``): ``reserve`` returns the amount held for
    the request (its worst-case cost, in picodollars), or None when it does not fit, and then nothing more is to be
    sent; ``landed`` gives that amount back once the request's answer (or failure) is in the result sink, whose
    stored cost is what the budget then counts."""

    @property
    def exhausted(self) -> bool: ...

    async def reserve(self, request: ChatRequest) -> int | None: ...

    def landed(self, amount: int) -> None: ...
