"""The state a flow run ends in when it is not a plain ``Completed``: named for what stopped it, so the Prefect UI
says so (a run that stopped on its budget did not crash; it left the rest pending)."""

from __future__ import annotations

from typing import Any

from prefect.states import Completed

from llm_dispatch.jobs import BudgetStanding

__all__ = ["BUDGET_REACHED", "final_state"]

# The state's name: a Completed run that left prompts pending because the next request's worst case did not fit.
BUDGET_REACHED = "BudgetReached"


def final_state(result: dict[str, Any], *, budget: BudgetStanding | None) -> Any:
    """What a flow returns: ``result``, or a ``BudgetReached`` state holding it when the run stopped on its budget
    (a caller of the flow gets ``result`` either way)."""
    if budget is None or not budget.stopped:
        return result
    return Completed(name=BUDGET_REACHED, message=budget.describe(), data=result)
