"""A flow run's final state as the Prefect UI shows it, made here and nowhere else: ``Failed`` when the run's work
has problems left (so automations and alerts on failed runs fire), ``Completed`` otherwise, and a name of its own
for how a run stopped early (a run that stopped on its budget did not crash; it left the rest pending). The flow's
result travels in the state either way: a caller reads it with ``return_state=True`` and
``state.result(raise_on_failure=False)``, or, for a state that is not ``Failed``, as the flow's return value."""

from __future__ import annotations

from typing import Any

from prefect.states import Completed, Failed, State

from llm_dispatch.jobs import BudgetStanding

__all__ = ["BUDGET_REACHED", "final_state", "run_state"]

# The state's name: a Completed run that left prompts pending because the next request's worst case did not fit.
BUDGET_REACHED = "BudgetReached"
# A state message is read in a list of runs: longer ones are cut.
MAX_MESSAGE = 500


def run_state(result: Any, *, failure: str | None = None, message: str = "", name: str | None = None) -> State:
    """The final state of a flow run that returns ``result``: ``Failed`` with ``failure`` as its message when there
    is one, else ``Completed`` with ``message``; ``name`` names it in the UI (``BUDGET_REACHED``...)."""
    text = failure if failure is not None else message
    text = text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 1] + "…"
    make = Failed if failure is not None else Completed
    return make(message=text, data=result, **({"name": name} if name else {}))


def final_state(result: object, *, budget: BudgetStanding | None) -> Any:
    """What a flow returns: ``result``, or a ``BudgetReached`` state holding it when the run stopped on its budget
    (a caller of the flow gets ``result`` either way)."""
    if budget is None or not budget.stopped:
        return result
    return run_state(result, message=budget.describe(), name=BUDGET_REACHED)
