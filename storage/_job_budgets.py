"""Which budgets hold a job: its own (``--budget``, the budget ``job:<id>``) and the named one (``--budget-name``)
its latest run held, kept on the job's row so reports can show where each stands."""

from __future__ import annotations

from sqlalchemy import or_, select, update

from llm_dispatch.core import job_budget_name

from ._budgets import BudgetInfo, get_budget
from ._engine import Sessions
from ._models import Job

__all__ = ["budgets_of_job", "note_job_budget"]


async def note_job_budget(sessions: Sessions, *, job_id: str, name: str) -> None:
    """Keep that a run of job ``job_id`` holds the named budget ``name`` (written only when it changes)."""
    async with sessions.begin() as session:
        await session.execute(update(Job).where(Job.id == job_id, or_(Job.budget_name.is_(None), Job.budget_name != name))
                              .values(budget_name=name).execution_options(synchronize_session=False))


async def budgets_of_job(sessions: Sessions, *, job_id: str) -> list[BudgetInfo]:
    """The job's own budget, then the named one its latest run held: those that exist."""
    async with sessions() as session:
        named = (await session.execute(select(Job.budget_name).where(Job.id == job_id))).scalar_one_or_none()
    found: list[BudgetInfo] = []
    for name in dict.fromkeys((job_budget_name(job_id), named)):
        if name is not None and (info := await get_budget(sessions, name=name)) is not None:
            found.append(info)
    return found
